"""Eviction and prefix sharing together: who caused each prefix eviction (a preemption or cache
pressure) and who paid the re-prefill; the prefix-aware victim choice. Hand-computed cases."""
from __future__ import annotations

import copy

import pytest
import simpy

from sim import scenario_from_dict, simulate
from sim.core.prefix_cache import PrefixCache
from sim.core.preemption import about_to_reuse, eligible_victims, victim_cost_ns, victim_for
from sim.core.request import Request, State
from sim.assembly import build_engine
from tests.conftest import small_scenario


def test_attribution_books_evictions_by_cause_and_charges_the_refill():
    """Groups of 64 tokens. Request 1 (class 0, tenant a) holds groups 1, 2 and is preempted;
    request 2 (class 1, tenant b) holds group 3 and finishes. LRU order: 2, 1 (tail first),
    then 3. Three evictions: 2 and 1 by preemption (booked to a), 3 by pressure (booked to b).
    Request 1 comes back with prompt (1, 2, 4): it misses 1 and 2 (128 tokens, its own);
    request 5 with prompt (3,) misses group 3: 64 tokens pushed onto others by b's eviction."""
    c = PrefixCache(64, 16)
    for h in (1, 2, 3):
        c.publish(h)
    c.release((1, 2), owner=(0, "a", 1), preempted=True)
    c.release((3,), owner=(1, "b", 2), preempted=False)
    assert list(c.lru) == [2, 1, 3]
    for _ in range(3):
        assert c.evict_one() == 4
    assert c.missed_after_eviction(64 * 3 + 1, (1, 2, 4), 0, payer=1) == 2
    assert c.missed_after_eviction(65, (3,), 0, payer=5) == 1
    assert c.missed_after_eviction(65, (3,), 0) == 1  # a peek (no payer) charges nothing
    assert c.attribution_rows() == [(0, "a", "preemption", 2, 128, 0), (1, "b", "pressure", 1, 0, 64)]
    # republished and evicted again: the latest eviction is the one charged
    c.publish(3)
    c.release((3,), owner=(0, "a", 7), preempted=True)
    c.evict_one()
    c.missed_after_eviction(65, (3,), 0, payer=8)
    assert c.attribution_rows() == [(0, "a", "preemption", 3, 128, 64), (1, "b", "pressure", 1, 0, 64)]


# ---- the victim choice -------------------------------------------------------------------------
LIN = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 1e-4,
       "context_token_s": 0.0, "swap_block_s": 1e-4}


def _engine(victim: str):
    sc = small_scenario()
    sc["engine"].update(profile=dict(LIN), prefix_caching=True, prefix_block_tokens=32, kv_blocks=1000,
                        victim=victim)
    eng = build_engine(scenario_from_dict(sc), simpy.Environment())
    return eng


def _req(eng, rid, cls_idx, prompt, computed, shared=(), hash_ids=None, admit=0, blocks=0):
    name = ("hi", "lo")[cls_idx]
    # arrival order = admission order (waiters last), so rank order is admission order
    r = Request(rid, admit or 100, name, name, cls_idx, cls_idx, prompt, 50, 100, hash_ids=hash_ids)
    r.computed = computed
    r.blocks = blocks
    r.shared = tuple(shared)
    r.key = eng.policy.key_tuple(r, 0.0)
    r.admit_seq = admit
    if admit:
        r.state = State.RUNNING
        eng.queues.add_running(r)
    return r


def _setup(victim: str, waiter: bool):
    """Running, most urgent first: R (hi, holds group 20), then the lo requests by admission:
    V1 (100 tokens computed, sole holder of group 10), V3 (150 tokens, shares group 20 with R),
    V2 (200 tokens, no cached group; newest, so the lowest-ranked).

    Prefill costs 1e-5 s a token (10,000 ns), nothing else depends on the chunk, so preempting
    (recompute) costs 10,000 ns per token to re-prefill:
      V1: own 100 tokens (group 10 becomes evictable: counted) -> 1,000,000 ns; if waiter W is
          about to reuse group 10, + 32 tokens pushed onto W -> 1,320,000 ns;
      V3: own 150 - 32 (group 20 stays pinned by R) = 118 -> 1,180,000 ns, nothing pushed;
      V2: own 200 -> 2,000,000 ns.
    Blocks of 16 tokens, a group is 2 blocks; each holds its uncached tokens' blocks: V1 5 (+ its
    sole group's 2 become evictable: frees 7), V3 8 (frees 8), V2 13 (frees 13)."""
    eng = _engine(victim)
    cache = eng.pool.cache
    for h in (10, 20):
        cache.publish(h)
    cache.acquire((20,), 1)
    R = _req(eng, 0, 0, 100, 64, shared=(20,), admit=1)
    V1 = _req(eng, 1, 1, 110, 100, shared=(10,), admit=2, blocks=5)
    V3 = _req(eng, 3, 1, 160, 150, shared=(20,), admit=3, blocks=8)
    V2 = _req(eng, 2, 1, 210, 200, admit=4, blocks=13)
    if waiter:
        W = _req(eng, 9, 1, 100, 0, hash_ids=(10, 11))
        eng.push_waiting(W, 0)
    return eng, R, V1, V2, V3


@pytest.mark.parametrize("waiter", [False, True])
def test_victim_costs_by_hand(waiter):
    eng, R, V1, V2, V3 = _setup("prefix_aware", waiter)
    reuse = about_to_reuse(eng, None)
    assert reuse == ({10, 11} if waiter else set())
    cost = {v.request_id: victim_cost_ns(eng, v, reuse) for v in (V1, V2, V3)}
    want = {1: 1_320_000 if waiter else 1_000_000, 3: 1_180_000, 2: 2_000_000}
    assert cost == pytest.approx(want, abs=2)


@pytest.mark.parametrize("victim, waiter, short, expected", [
    ("rank", False, 1, 2), ("rank", True, 1, 2),  # vLLM: the lowest-ranked (newest) request
    ("prefix_aware", False, 1, 1),  # V1 is cheapest to re-prefill
    ("prefix_aware", True, 1, 3),  # ... unless W is about to reuse V1's group: then V3
    ("prefix_aware", False, 10, 2),  # only V2 frees 10 blocks alone
    # none frees 20: cheapest per block freed: V1 1.0 ms / 7 < V3 1.18 / 8 < V2 2.0 / 13 ...
    ("prefix_aware", False, 20, 1),
    ("prefix_aware", True, 20, 3),  # ... with W waiting V1 costs 1.32 / 7 > V3's 1.18 / 8
])
def test_victim_for_a_running_request(victim, waiter, short, expected):
    eng, R, *_ = _setup(victim, waiter)
    assert victim_for(eng, R, short).request_id == expected


def test_victim_never_outranks_the_requester_or_its_class_order():
    """The victim is always ranked below the request that needs the block, and of the
    least-urgent class present: with V1..V3 ranked below V1 only V2 and V3 are candidates."""
    eng, R, V1, V2, V3 = _setup("prefix_aware", False)
    assert victim_for(eng, V1, 1).request_id == 3  # V3 (1.18 ms) beats V2 (2 ms); V1 is not a candidate
    assert victim_for(eng, V2, 1) is V2  # the lowest-ranked needs a block: it preempts itself, as vLLM


def test_waiter_preempts_cheapest_eligible_first():
    """A waiting hi request may preempt lo requests (strict), evicting until it fits:
    prefix_aware orders them by cost per block freed (W waiting): V3 1.18 ms / 8 = 147.5 us,
    V2 2.0 / 13 = 153.8 us, V1 1.32 / 7 = 188.6 us."""
    eng, R, V1, V2, V3 = _setup("prefix_aware", True)
    W2 = _req(eng, 11, 0, 100, 0, hash_ids=(30,))
    assert [v.request_id for v in eligible_victims(eng, W2)] == [3, 2, 1]
    eng2, *_ = _setup("rank", True)
    W3 = _req(eng2, 11, 0, 100, 0, hash_ids=(30,))
    assert [v.request_id for v in eligible_victims(eng2, W3)] == [2, 3, 1]


# ---- whole runs --------------------------------------------------------------------------------
def _pressure(victim: str, seed: int) -> dict:
    sc = small_scenario(horizon_s=15.0)
    sc["seed"] = seed
    sc["engine"].update(prefix_caching=True, prefix_block_tokens=32, kv_blocks=70, victim=victim)
    for s in sc["streams"]:
        s["prefix"] = {"system_tokens": 64, "conversations": 4, "block_tokens": 32}
    return sc


@pytest.mark.parametrize("victim", ["rank", "prefix_aware"])
@pytest.mark.parametrize("seed", [1, 2])
def test_attribution_adds_up_in_a_run(victim, seed):
    """Every re-prefilled token a request paid for an evicted group is charged to one eviction:
    own + pushed over the attribution rows = the requests' evicted_miss_tokens; per class and
    tenant in summary.json; KV conservation holds after every event."""
    res = simulate(scenario_from_dict(copy.deepcopy(_pressure(victim, seed))), check_invariants=True)
    rows = res.summary_dict["run"]["prefix_attribution"]
    assert rows and sum(r["evictions"] for r in rows) == res.summary_dict["run"]["prefix_evictions"]
    paid = int(res.requests["evicted_miss_tokens"].sum())
    assert sum(r["own_refill_tokens"] + r["pushed_refill_tokens"] for r in rows) == paid
    s = res.summary_dict
    for group in (*s["classes"].values(), *s["tenants"].values(), s["overall"]):
        assert {"prefix_evictions_by_preemption", "prefix_evictions_by_pressure", "refill_pushed_tokens",
                "refill_pushed_s"} <= set(group)
    assert s["overall"]["refill_pushed_tokens"] == sum(m["refill_pushed_tokens"] for m in s["classes"].values())


def test_rank_is_the_default_and_unchanged():
    sc = _pressure("rank", 1)
    a = simulate(scenario_from_dict(copy.deepcopy(sc)))
    del sc["engine"]["victim"]
    b = simulate(scenario_from_dict(sc))
    assert a.requests.equals(b.requests)


def test_a_request_whose_whole_prefix_was_evicted_counts_its_misses(tmp_path):
    """A 10-block pool holds two requests' prefixes (two 32-token groups each): the fourth request
    asks again for the first one's groups, evicted by then, and hits none; its re-prefill of
    both groups is its evicted_miss_tokens (64) and charged to the evictions, as a partial miss
    is (the count was made only for requests that hit at least one group)."""
    import json

    rows = [(0, [1, 2]), (1000, [3, 4]), (2000, [5, 6]), (3000, [1, 2]), (4000, [5, 6]), (5000, [3, 4])]
    (tmp_path / "e.jsonl").write_text("".join(json.dumps({"timestamp": t, "input_length": 65, "output_length": 2,
                                                          "hash_ids": h}) + "\n" for t, h in rows))
    d = {"name": "p", "seed": 0, "horizon_s": 10.0,
         "engine": {"profile": {"kind": "linear", "base_s": 0.005, "prefill_token_s": 1e-4, "decode_token_s": 1e-3,
                                "context_token_s": 0.0},
                    "kv_blocks": 10, "block_size": 16, "prefix_caching": True, "prefix_block_tokens": 32},
         "classes": [{"name": "i", "priority": 0}],
         "streams": [{"class": "i", "tenant": "t", "trace": {"format": "mooncake", "path": "e.jsonl",
                                                             "spread_bucket_s": 0}}]}
    res = simulate(scenario_from_dict(d, base_dir=tmp_path), check_invariants=True)
    r = res.requests
    assert r.prefix_hit_tokens.tolist() == [0, 0, 0, 0, 64, 0]
    assert r.evicted_miss_tokens.tolist() == [0, 0, 0, 64, 0, 64]
    assert sum(row["pushed_refill_tokens"] for row in res.summary_dict["run"]["prefix_attribution"]) == 128
