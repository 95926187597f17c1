"""What the engine keeps as requests come and go instead of walking its sets each time: requests
per class waiting and running (the time series reads them), the running request ranked last
(the first victim; fast-forward's waiter check), the least urgent running priority (whether a
waiter has victims) and the cohort member ranked last (the cohort's budget check). At every event
each equals a recount (``check_invariants`` compares them), under every preemption mode, swap,
recompute, prefix caching, per-tenant fairness queues and in a cluster; and the cohort that sheds
only the members a budget cut leaves without a token gives the outputs of stepping every request.
"""
from __future__ import annotations

import copy
import random

import pandas as pd
import pytest
import simpy

from sim import load_scenario, scenario_from_dict, simulate
from sim.assembly import build_engine
from sim.cluster import simulate_cluster
from sim.core import observe
from sim.core.cohort import DecodeCohort
from sim.core.kvpool import KVPool
from sim.core.plan import NO_PRIORITY
from sim.core.prefix_cache import PrefixCache
from sim.core.request import Request
from tests.conftest import small_scenario

MODES = [("recompute", "strict"), ("swap", "strict"), ("auto", "priority"), ("off", "never"),
         ("recompute", "policy"), ("swap", "threshold")]


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert a.summary_dict["classes"] == b.summary_dict["classes"]


@pytest.mark.parametrize("preemption,pfw", MODES)
def test_kept_counts_equal_a_recount_under_preemption(run, preemption, pfw):
    """Requests move between waiting and running by admission, finish, recompute and swap:
    the kept counts and the last-ranked requests match a recount after every event."""
    sc = small_scenario(horizon_s=30.0)
    sc["engine"].update(preemption=preemption, preempt_for_waiting=pfw)
    res = run(sc, check_invariants=True)  # raises at the first event where one is off
    if preemption != "off":
        assert res.requests.preemptions.sum() > 0  # the preemption paths ran
    ts = res.timeseries
    assert (ts["running"] > 0).any() and (ts["waiting"] > 0).any()


@pytest.mark.parametrize("policy", ["priority", "wfq", "mlfq", "lpm"])
def test_kept_counts_equal_a_recount_with_prefix_cache_and_rekeying(run, policy):
    """Policies that re-key (the cached last-ranked requests are dropped and found again), the
    prefix-aware victim choice and a prefix cache."""
    sc = small_scenario(horizon_s=20.0)
    sc["engine"].update(prefix_caching=True, prefix_block_tokens=32, victim="prefix_aware")
    for s in sc["streams"]:
        s["prefix"] = {"system_tokens": 64, "conversations": 3, "block_tokens": 32}
    sc["policy"] = {"name": policy}
    run(sc, check_invariants=True)


def test_kept_counts_equal_a_recount_in_fairness_queues():
    """The fairness accountant keeps the waiting set in its own per-tenant queues."""
    res = simulate(load_scenario("tenant_flood", overrides=["horizon_s=20.0"]), check_invariants=True)
    assert len(res.requests)


def test_kept_counts_equal_a_recount_in_a_cluster():
    """Replicas whose runs go past arrivals routed elsewhere (and are cut short) keep theirs too."""
    sc = load_scenario("diurnal_two_class", overrides=["horizon_s=40.0", "cluster={replicas=3}"])
    simulate_cluster(sc, check_invariants=True)


def test_check_counts_catches_a_stale_count():
    """The recount is a real check: a count or a remembered request that is off raises."""
    eng = build_engine(scenario_from_dict(small_scenario()), simpy.Environment())
    reqs = [Request(i, 100 + i, "a", c, ci, ci, 50, 10, 20) for i, (c, ci) in
            enumerate([("hi", 0), ("lo", 1), ("lo", 1), ("hi", 0)])]
    for i, r in enumerate(reqs[:3]):
        r.key = eng.policy.key_tuple(r, 0.0)
        r.admit_seq = i + 1
        eng.queues.add_running(r)
    eng.push_waiting(reqs[3], 0)
    observe.check_counts(eng)
    assert eng.queues.lowest_running() is reqs[2] and eng.queues.top_running_priority() == 1
    eng.queues.running_count[0] += 1
    with pytest.raises(AssertionError, match="per class"):
        observe.check_counts(eng)
    eng.queues.running_count[0] -= 1
    eng.queues.waiting_count[1] += 1
    with pytest.raises(AssertionError, match="per class"):
        observe.check_counts(eng)
    eng.queues.waiting_count[1] -= 1
    eng.queues.last_ranked = [reqs[0]]  # ranked below requests it should rank above
    with pytest.raises(AssertionError, match="least urgent running requests kept"):
        observe.check_counts(eng)
    eng.queues.last_ranked = [reqs[2], reqs[3]]  # one of them is not running
    with pytest.raises(AssertionError, match="least urgent running requests kept"):
        observe.check_counts(eng)
    eng.queues.last_ranked = []
    eng.queues.remove_running(reqs[2])
    eng.queues.remove_running(reqs[1])
    assert eng.queues.lowest_running() is reqs[0] and eng.queues.top_running_priority() == 0
    observe.check_counts(eng)


def test_the_least_urgent_kept_follow_starts_and_leaves():
    """The last-ranked running request stays right while requests start and leave in any order,
    also when more leave than were found at once (``LEAST_KEPT``) and when a newcomer ranks
    above or below those kept."""
    from sim.core.queues import LEAST_KEPT
    from sim.core.plan import rank

    eng = build_engine(scenario_from_dict(small_scenario()), simpy.Environment())
    rnd = random.Random(3)
    seq = 0

    def start(i: int) -> None:
        nonlocal seq
        ci = rnd.randrange(2)
        r = Request(i, i, "a", ("hi", "lo")[ci], ci, ci, 50, 10, 20)
        r.key, r.admit_seq = eng.policy.key_tuple(r, 0.0), seq + 1
        seq += 1
        eng.queues.add_running(r)

    for i in range(3 * LEAST_KEPT):
        start(i)
    longest = 0
    for i in range(400):
        if eng.queues.running and rnd.random() < 0.5:
            # the last-ranked most of the time (a preemption), else anyone (a finish)
            v = eng.queues.lowest_running() if rnd.random() < 0.7 else rnd.choice(list(eng.queues.running.values()))
            eng.queues.remove_running(v)
        else:
            start(1000 + i)
        longest = max(longest, len(eng.queues.last_ranked))
        if eng.queues.running:
            observe.check_counts(eng)
            assert eng.queues.lowest_running() is max(eng.queues.running.values(), key=rank)
    assert longest == 2 * LEAST_KEPT  # (newcomers ranked above those kept; the most urgent let go)


def test_priorities_apart_from_the_class_fall_back_to_a_walk():
    """A request whose priority is not its class's (only tests make them): the least urgent
    running priority is then taken over the running requests."""
    eng = build_engine(scenario_from_dict(small_scenario()), simpy.Environment())
    r = Request(0, 0, "a", "hi", 0, 5, 50, 10, 20)
    r.key, r.admit_seq = (5,), 1
    eng.queues.add_running(r)
    assert not eng.queues.priority_by_class
    assert eng.queues.top_running_priority() == 5
    observe.check_counts(eng)


def _cut_scenario() -> dict:
    """A token budget so small that urgent prompts' chunks are cut while less urgent decoders
    sit in the cohort: the cohort sheds those ranked below the cut (37 times here)."""
    sc = small_scenario(horizon_s=30.0)
    sc["engine"].update(max_batched_tokens=64, max_num_seqs=16, kv_blocks=4000)
    for s in sc["streams"]:
        s["arrival"]["rate"] = 3.0
    return sc


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
@pytest.mark.parametrize("fast_forward", [True, False])
def test_cohort_sheds_members_below_a_cut_exactly(monkeypatch, fast_forward):
    """Members ranked below a request whose share the budget cuts get no token in the walk:
    they leave the cohort alone and the rest go on as one count. Outputs equal stepping every
    request one iteration at a time, and the shedding happened."""
    shed = []
    leave_all = DecodeCohort.leave_all

    def spy(self, rs):
        shed.append((len(rs), len(self.members) - len(rs)))
        return leave_all(self, rs)

    monkeypatch.setattr(DecodeCohort, "leave_all", spy)
    sc = _cut_scenario()
    sc["engine"]["fast_forward"] = fast_forward
    a = simulate(scenario_from_dict(copy.deepcopy(sc)), check_invariants=True)
    assert len(shed) > 10 and all(left and stayed for left, stayed in shed)
    sc["engine"].update(fast_forward=False, lazy_batch=False)
    _same(a, simulate(scenario_from_dict(sc)))


def test_cohort_sheds_members_exactly_in_the_diurnal_cluster():
    """The 5-replica diurnal run's situation (long batch prompts, interactive prefills cut by the
    budget above batch decoders), three replicas: the cluster's outputs equal stepping."""
    over = ["horizon_s=40.0", "cluster={replicas=3}"]
    a = simulate_cluster(load_scenario("diurnal_two_class", overrides=over), check_invariants=True)
    b = simulate_cluster(load_scenario("diurnal_two_class", overrides=over + ["engine.lazy_batch=false",
                                                                              "engine.fast_forward=false"]))
    _same(a, b)


def _members(n: int) -> list[Request]:
    """Steady decoders (each just emitted a token) with staggered output lengths and contexts."""
    out = []
    for i in range(n):
        r = Request(i, 0, f"t{i % 3}", "hi", i % 2, 0, 17 + 5 * i, 2 + (i * 7) % 13, 40)
        r.computed, r.generated, r.tokens = r.prompt_tokens, 1, r.prompt_tokens + 1
        r.blocks = -(-r.computed // 16)
        r.key, r.admit_seq = (i % 4,), i
        out.append(r)
    return out


@pytest.mark.parametrize("grows", [True, False])
def test_cohort_single_steps_equal_one_run(grows):
    """The cohort's one-step advance (most runs) leaves members, leavers and the log exactly
    as advancing the same steps as one run does."""
    durs = [900 + (37 * j) % 250 for j in range(16)]
    results = []
    for runs in ([[d] for d in durs], [durs[:5], durs[5:6], durs[6:]]):
        coh = DecodeCohort(2, 16, grows)
        rs = _members(9)
        for r in rs:
            coh.join(r)
        t, left = 1000, []
        for run in runs:
            for done, end, leavers in coh.advance(run, t):
                left += [(end, r.request_id) for r in leavers]
            t += sum(run)
        coh.dissolve()
        fields = [(r.computed, r.generated, r.tokens, r.attained_ns, r.last_token_ns, r.max_itl_ns, r.blocks)
                  for r in rs]
        log = [list(a) for a in (coh.log_durs, coh.log_j0, coh.log_j1, coh.log_cls, coh.log_tenant)]
        results.append((fields, left, log, coh.steps, coh.end_ns, coh.svc_ns))
    assert results[0][1] and results[0] == results[1]


@pytest.mark.parametrize("seed", range(6))
def test_cohort_duration_stack_equals_pushing_step_by_step(seed):
    """A run's steps go on the cohort's step-duration stack at once; the stack (and so every
    member's largest gap) equals pushing them one at a time, ties and falls included."""
    rnd = random.Random(seed)
    coh = DecodeCohort(2, 16, True)
    for r in _members(3):
        r.hidden_output_tokens = 10**6  # nobody leaves: only the stack moves
        coh.join(r)
    ref_g: list[int] = []
    ref_d: list[int] = []
    g, t = 0, 0
    for _ in range(40):
        run = [rnd.choice((5, 7, 7, 9, 12)) + rnd.randrange(3) for _ in range(rnd.randrange(1, 9))]
        coh.advance(run, t)
        t += sum(run)
        for d in run:
            g += 1
            while ref_d and ref_d[-1] <= d:
                ref_d.pop()
                ref_g.pop()
            ref_g.append(g)
            ref_d.append(d)
        assert (coh._max_step, coh._max_dur) == (ref_g, ref_d)


@pytest.mark.parametrize("blocks", [[0, 0, 0], [3, 0, 2], [0, 7, 0], [5, 6, 4]])
def test_pool_allocate_each_equals_allocating_class_by_class(blocks):
    """The cohort takes a step's blocks for all classes at once: the pool (and the prefix
    groups evicted for them) ends as allocating class by class leaves it."""
    def pool() -> KVPool:
        p = KVPool(20, 16, [0, 1, 2], [0, 0, 0], cache=PrefixCache(32, 16))
        for h in range(4):  # 4 unreferenced cached groups of 2 blocks, 12 blocks free
            p.cache.publish(h)
            p.allocate(0, 2)
            p.publish(0, 2)
            p.cache.release((h,))
        return p

    a, b = pool(), pool()
    a.allocate_each(blocks)
    for c, n in enumerate(blocks):
        b.allocate(c, n)
    assert (a.free, a.used, list(a.cache.lru), a.cache.evictions) == (
        b.free, b.used, list(b.cache.lru), b.cache.evictions)
    a.check()


def test_pool_allocate_each_of_nothing_while_blocks_are_being_freed():
    """A disaggregated decode replica may reserve blocks that a run in flight frees only when it
    is applied (``allocate_ahead``: ``free`` below zero meanwhile); a cohort step that takes no
    blocks then takes none, rather than failing the pool's check."""
    p = KVPool(20, 16, [0, 1], [0, 0])
    p.allocate(0, 18)
    p.allocate_ahead(1, 5, 4)  # 2 free, 5 taken ahead of 4 being freed
    assert p.free == -3
    p.allocate_each([0, 0])
    assert (p.free, p.used) == (-3, [18, 5])


@pytest.mark.parametrize("seed", range(4))
def test_cohort_kept_counts_equal_a_recount(seed):
    """Members join, leave alone, finish inside runs and leave together: the cohort's least
    urgent class priority (kept, not walked) and the blocks its next step and a run take
    (``next_step_blocks``, ``run_blocks``) equal a recount over the members after every change."""
    rnd = random.Random(seed)
    prio = [2, 0, 1]
    coh = DecodeCohort(3, 16, True, prio)
    pool = _members(40)
    for r in pool:
        r.cls_idx = r.priority = rnd.randrange(3)
        r.hidden_output_tokens = r.generated + rnd.randrange(1, 30)
    waiting = list(pool)
    t = 0

    def check():
        members = list(coh.members.values())
        present = [prio[m.cls_idx] for m in members]
        assert coh.least_urgent() == (max(present) if present else NO_PRIORITY)
        g = coh.steps
        step = [0, 0, 0]  # blocks the next step takes: members starting a block in it
        for m in members:
            step[m.cls_idx] += (g - m.cohort_base_step + m.computed) % 16 == 0
        assert coh.next_step_blocks() == step
        for k in (2, 3, 17, 40):
            need = [0, 0, 0]
            for m in members:
                last = g + m.hidden_output_tokens - m.generated - (g - m.cohort_base_step)
                for h in range(g + 1, min(g + k, last)):
                    need[m.cls_idx] += h % 16 == (m.cohort_base_step - m.computed) % 16
            assert coh.run_blocks(k) == need

    for _ in range(60):
        op = rnd.random()
        if waiting and op < 0.5:
            coh.join(waiting.pop(rnd.randrange(len(waiting))))
        elif coh.members and op < 0.6:
            coh.leave(rnd.choice(list(coh.members.values())))
        elif coh.members and op < 0.65:
            coh.leave_all(rnd.sample(list(coh.members.values()), min(3, len(coh.members))))
        elif coh.members:
            run = [rnd.randrange(900, 1200) for _ in range(rnd.randrange(1, 12))]
            coh.advance(run, t)
            t += sum(run)
        coh.steps_allocated = coh.steps
        check()
    coh.dissolve()
    check()


def test_check_counts_catches_a_stale_cohort_count():
    """The recount covers the cohort's kept counts: members per class (and per residue) and its
    least urgent priority."""
    eng = build_engine(scenario_from_dict(small_scenario()), simpy.Environment())
    coh = eng.cohort
    for r in _members(4):
        r.cls_idx = r.priority = r.request_id % 2
        coh.join(r)
    observe.check_counts(eng)
    coh.n_cls[0] += 1
    with pytest.raises(AssertionError, match="members per class"):
        observe.check_counts(eng)
    coh.n_cls[0] -= 1
    if coh.grows:  # (the per-residue counts, kept twice: per class and per residue)
        coh.by_residue[0][1] += 1
        with pytest.raises(AssertionError, match="per residue"):
            observe.check_counts(eng)
        coh.by_residue[0][1] -= 1
    observe.check_counts(eng)
    coh._top = -1
    with pytest.raises(AssertionError, match="least urgent"):
        observe.check_counts(eng)
