"""Disaggregated prefill and decode (sim/cluster/disagg.py, sim/link.py): one request computed by
hand, conservation on both sides, the fast paths equal to stepping, decode-side preemption by
recompute (back through a prefill replica) and by swap, priority in both pools, and bad layouts
refused in one line."""
from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from sim import ScenarioError, scenario_from_dict, simulate
from sim.cli import main
from sim.core.costs import NS, load_profile
from sim.core.plan import StepShape
from sim.link import LINK_PRESETS, LinkSpec
from tests.conftest import small_scenario

PD = {"groups": [{"name": "p", "role": "prefill", "replicas": 1}, {"name": "d", "role": "decode", "replicas": 1}]}
LINK = {"bandwidth_bytes_per_s": 50e9, "latency_s": 1e-5, "kv_bytes_per_token": 131072, "layers": 32}


def pd_scenario(cluster: dict | None = None, **over) -> dict:
    d = small_scenario(**over)
    d["horizon_s"] = 8.0
    d["cluster"] = copy.deepcopy(cluster or PD)
    d["cluster"].setdefault("link", dict(LINK))
    return d


def run(d: dict, **kw):
    return simulate(scenario_from_dict(copy.deepcopy(d)), **kw)


# ---- one request, by hand ---------------------------------------------------------------------------
def one_request(prompt: int, output: int, **cluster) -> dict:
    """One request of ``prompt`` / ``output`` tokens at t = 0 on 1P1D (H200, no overhead), a
    50 GB/s link; ``cluster``: more ``[cluster]`` keys."""
    return {"name": "one", "seed": 0, "horizon_s": 10.0, "drain": True,
            "engine": {"profile": "h200-llama-3-8b", "overhead": "none", "max_num_seqs": 8,
                       "max_batched_tokens": 2048},
            "policy": {"name": "fcfs"}, "classes": [{"name": "c", "priority": 0}],
            "streams": [{"tenant": "t", "class": "c", "arrival": {"process": "batch", "n": 1, "at_s": 0.0},
                         "prompt_tokens": {"dist": "constant", "value": prompt},
                         "output_tokens": {"dist": "constant", "value": output}, "max_tokens": output}],
            "cluster": {**PD, "link": {"bandwidth_bytes_per_s": 50e9, "latency_s": 1e-5}, **cluster}}


def test_one_request_ttft_is_prefill_plus_transfer_then_decode_at_the_decode_step_time():
    prompt, output = 1000, 6
    d = one_request(prompt, output)
    res = run(d)
    costs = load_profile("h200-llama-3-8b", overhead="none")
    prefill = costs.price(StepShape(prompt, 0, prompt * prompt, 0, 0, 1, 1))
    copy_ns = LinkSpec("x", 50e9, 1e-5).transfer_ns(prompt * costs.shape.kv_bytes_per_token, 1)
    landed = prefill + 1 + copy_ns  # the finished prefill reaches the decode side 1 ns after its step
    decode = [costs.price(StepShape(0, 1, 0, 0, prompt + i, 0, 0)) for i in range(1, output)]
    r = res.requests.iloc[0]
    assert r["status"] == "finished" and r["generated_tokens"] == output
    assert r["ttft_s"] == pytest.approx(landed / NS, abs=1e-12)
    assert r["e2e_s"] == pytest.approx((landed + sum(decode)) / NS, abs=1e-12)
    assert r["prefill_queue_s"] == 0 and r["prefill_s"] == pytest.approx(prefill / NS, abs=1e-12)
    assert r["decode_wait_s"] == pytest.approx(1e-9, abs=1e-12)
    assert r["transfer_s"] == pytest.approx(copy_ns / NS, abs=1e-12) and r["decode_join_s"] == 0
    assert r["prefill_passes"] == 1 and r["replica"] == 1 and r["group"] == "d"
    pd_report = res.summary_dict["cluster"]["disaggregation"]
    assert pd_report["transfers"] == 1 and pd_report["bytes"] == prompt * costs.shape.kv_bytes_per_token
    assert pd_report["gpus_by_role"] == {"prefill": 1, "decode": 1}


def test_with_the_first_token_from_the_prefill_ttft_ends_at_the_prefill_and_the_copy_delays_the_second():
    """DistServe's engine streams the token the prefill sampled at once (``first_token =
    "prefill"``): TTFT is the prefill alone; the copy and the decode boundary come before the
    second token, so they are in its gap and in TPOT."""
    prompt, output = 1000, 6
    d = one_request(prompt, output, first_token="prefill")
    res = run(d)
    costs = load_profile("h200-llama-3-8b", overhead="none")
    prefill = costs.price(StepShape(prompt, 0, prompt * prompt, 0, 0, 1, 1))
    copy_ns = LinkSpec("x", 50e9, 1e-5).transfer_ns(prompt * costs.shape.kv_bytes_per_token, 1)
    landed = prefill + 1 + copy_ns
    decode = [costs.price(StepShape(0, 1, 0, 0, prompt + i, 0, 0)) for i in range(1, output)]
    r = res.requests.iloc[0]
    assert r["status"] == "finished" and r["generated_tokens"] == output
    assert r["ttft_s"] == pytest.approx(prefill / NS, abs=1e-12)
    assert r["e2e_s"] == pytest.approx((landed + sum(decode)) / NS, abs=1e-12)  # (the same end)
    assert r["tpot_s"] == pytest.approx((landed - prefill + sum(decode)) / NS / (output - 1), abs=1e-12)
    assert r["max_itl_s"] == pytest.approx((1 + copy_ns + decode[0]) / NS, abs=1e-12)
    # the phases after the prefill still say where the gap went
    assert r["transfer_s"] == pytest.approx(copy_ns / NS, abs=1e-12) and r["decode_join_s"] == 0
    assert r["prefill_queue_s"] + r["prefill_s"] == pytest.approx(r["ttft_s"], abs=1e-12)
    decode_mode = copy.deepcopy(d)
    del decode_mode["cluster"]["first_token"]
    assert run(decode_mode).requests.iloc[0]["ttft_s"] == pytest.approx(landed / NS, abs=1e-12)
    # a one-token answer is whole at the prefill's end: it ends there, its KV never copied
    res = run(one_request(prompt, 1, first_token="prefill"), check_invariants=True)
    r = res.requests.iloc[0]
    assert r["status"] == "finished" and r["generated_tokens"] == 1 and r["group"] == "p"
    assert r["e2e_s"] == r["ttft_s"] == pytest.approx(prefill / NS, abs=1e-12) and pd.isna(r["transfer_s"])
    assert res.cluster["disaggregation"]["transfers"] == 0


def test_max_model_len_refuses_by_the_whole_request_not_its_prefill_leg():
    """A prefill leg asks for one token, so the prefill replica cannot see a request's
    max_tokens: the cluster refuses one whose prompt plus max_tokens is over the decode side's
    engine.max_model_len at its arrival (too_long), as the decode server would; within it, served."""
    d = one_request(500, 100)
    d["engine"]["max_model_len"] = 550
    r = run(d).requests.iloc[0]
    assert r.status == "rejected" and r.reject_reason == "too_long"
    d["engine"]["max_model_len"] = 600
    assert run(d).requests.iloc[0].status == "finished"


@pytest.mark.parametrize("profile, tp", [("h200-llama-3-8b", 1), ("h200-llama-3-70b-tp4", 4)])
def test_the_copy_moves_the_whole_replicas_kv_each_gpu_its_share_over_its_own_link(profile, tp):
    """A tensor-parallel profile's model shape is one GPU's (Llama-3-70B at TP 4: 2 of its 8 KV
    heads): the copy moves every GPU's share, split over the replica's links, so it takes
    the time of one GPU's share over one link; ``link.kv_bytes_per_token`` is the whole model's."""
    prompt = 1000
    whole = 2 * {1: 32, 4: 80}[tp] * 8 * 128 * 2  # K and V x layers x 8 KV heads x head dim 128 x BF16
    d = one_request(prompt, 2)
    d["engine"]["profile"] = profile
    res = run(d)
    pd_report = res.cluster["disaggregation"]
    assert pd_report["gpus_by_role"] == {"prefill": tp, "decode": tp}
    assert pd_report["bytes"] == prompt * whole
    copy_s = 1e-5 + prompt * whole / (50e9 * tp)  # (1.6484 ms at TP 4: 81,920 bytes a token a link)
    assert res.requests.iloc[0]["transfer_s"] == pytest.approx(copy_s, abs=1e-9)
    d["cluster"]["link"]["kv_bytes_per_token"] = whole  # (as written: the same)
    assert run(d).requests.iloc[0]["transfer_s"] == res.requests.iloc[0]["transfer_s"]
    # layer by layer behind a prefill longer than the copy: its last layer's share is left
    d["cluster"]["link"] = {"bandwidth_bytes_per_s": 50e9, "latency_s": 1e-5, "pipelined": True}
    layers = {1: 32, 4: 80}[tp]
    r = run(d).requests.iloc[0]
    assert r["prefill_s"] > copy_s
    assert r["transfer_s"] == pytest.approx(1e-5 + prompt * whole / (50e9 * tp) / layers, abs=1e-9)


def test_link_presets_and_pipelining():
    spec = LinkSpec("ib-400", *LINK_PRESETS["ib-400"])
    assert spec.transfer_ns(50_000_000_000, 1) == round(1e-5 * NS + 1e9)  # 50 GB at 50 GB/s: one second
    assert spec.transfer_ns(50_000_000_000, 4) == round(1e-5 * NS + 0.25e9)  # a TP4 replica's four links
    piped = LinkSpec("x", 50e9, 0.0, pipelined=True)
    # a one-second copy behind a 0.6 s prefill: 0.4 s left; behind a long prefill, its last layer
    assert piped.transfer_ns(50_000_000_000, 1, prefill_ns=600_000_000, layers=10) == 400_000_000
    assert piped.transfer_ns(50_000_000_000, 1, prefill_ns=5 * NS, layers=10) == 100_000_000


# ---- conservation, and every request ends once ----------------------------------------------------------
LAYOUTS = {
    "1p1d": PD,
    "2p2d-small-decode": {"groups": [{"name": "p", "role": "prefill", "replicas": 2},
                                     {"name": "d", "role": "decode", "replicas": 2, "engine": {"kv_blocks": 48}}]},
    "swap-decode": {"groups": [{"name": "p", "role": "prefill", "replicas": 1},
                               {"name": "d", "role": "decode", "replicas": 2,
                                "engine": {"kv_blocks": 48, "preemption": "swap", "swap_blocks": 200}}]},
    "mixed": {"groups": [{"name": "p", "role": "prefill", "replicas": 1, "classes": ["lo"]},
                         {"name": "d", "role": "decode", "replicas": 1, "classes": ["lo"]},
                         {"name": "c", "role": "both", "replicas": 1, "classes": ["hi"]}], "router": "class_aware"},
}


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_blocks_balance_on_both_sides_and_every_request_ends_once(layout, first_token):
    d = pd_scenario(LAYOUTS[layout])
    d["cluster"]["first_token"] = first_token
    d["streams"][1]["arrival"]["rate"] = 4.0
    res = run(d, check_invariants=True)  # (KV conserved on every replica after every event, held KV counted)
    req = res.requests
    arrived = len(req)
    assert req["request_id"].is_unique and sorted(req["request_id"]) == list(range(arrived))
    assert set(req["status"]) <= {"finished", "unfinished", "rejected"}
    assert (req["status"] == "finished").sum() == arrived  # (drain: everything finishes)
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    # every token counted once in the time series, wherever it was emitted
    ts = res.timeseries
    interval = ts["t_s"].drop_duplicates().diff().iloc[1]
    assert (ts["tokens_per_s"] * interval).sum() == pytest.approx(req["generated_tokens"].sum(), abs=1e-6)
    legs = sum(len(r.requests) for r, rep in zip(res.replicas, res.cluster["replicas"]) if rep["role"] == "prefill")
    assert legs == req["prefill_passes"].sum()  # each prefill pass is one leg on a prefill replica
    if layout == "mixed":
        co = req["group"] == "c"
        assert co.any() and req.loc[co, "transfer_s"].isna().all() and (req.loc[co, "prefill_passes"] == 0).all()
        assert (req.loc[co, "class"] == "hi").all() and (req.loc[~co, "group"] == "d").all()


def test_decode_side_recompute_goes_back_through_a_prefill_replica():
    d = pd_scenario(LAYOUTS["2p2d-small-decode"])
    d["streams"][1]["arrival"]["rate"] = 4.0
    res = run(d, check_invariants=True)
    req = res.requests
    again = req[req["prefill_passes"] > 1]
    assert len(again) and res.cluster["disaggregation"]["recompute_prefills"] == (req["prefill_passes"] - 1).sum()
    assert (again["preemptions"] >= again["prefill_passes"] - 1).all()
    assert (again["recomputed_tokens"] > 0).all()


def test_decode_side_swap_keeps_the_request_on_its_decode_replica():
    d = pd_scenario(LAYOUTS["swap-decode"])
    d["streams"][1]["arrival"]["rate"] = 4.0
    res = run(d, check_invariants=True)
    req = res.requests
    assert req["swapped_blocks"].sum() > 0
    assert res.cluster["disaggregation"]["recompute_prefills"] == 0 and (req["prefill_passes"] == 1).all()


# ---- cost -----------------------------------------------------------------------------------------------
def test_a_prefill_groups_dollars_go_to_the_classes_by_the_prompt_tokens_it_computed():
    """A prefill group generates no output token of its own: its dollars are shared by the prompt
    tokens it computed for each class (its legs, re-prefills after a decode-side eviction and
    recomputation after a preemption there included), the decode group's by output tokens; the
    classes' dollars add up to the total."""
    d = pd_scenario(LAYOUTS["2p2d-small-decode"])
    d["streams"][1]["arrival"]["rate"] = 4.0
    d["cluster"]["gpu_hour_usd"] = 2.0
    res = run(d)
    cost, req = res.summary_dict["cost"], res.requests
    assert (req["prefill_passes"] > 1).any()  # (re-prefills here)
    legs = res.groups["p"].requests
    computed = (legs["prompt_tokens"] - legs["prefix_hit_tokens"] + legs["recomputed_tokens"]).groupby(legs["class"]).sum()
    out = req.groupby("class")["generated_tokens"].sum()
    usd_p, usd_d = (cost["groups"][g]["cost_usd"] for g in ("p", "d"))
    assert cost["unallocated_usd"] == 0
    for c in ("hi", "lo"):
        usd = usd_p * computed[c] / computed.sum() + usd_d * out[c] / out.sum()
        assert cost["classes"][c]["cost_usd"] == pytest.approx(usd, rel=1e-12)
        assert cost["classes"][c]["usd_per_million_output_tokens"] == pytest.approx(usd / (out[c] / 1e6), rel=1e-12)
    assert sum(cost["classes"][c]["cost_usd"] for c in ("hi", "lo")) == pytest.approx(cost["cost_usd"], rel=1e-12)


def test_each_class_pays_for_its_own_groups_in_a_mixed_design():
    """A prefill + decode pair for one class and a co-located group for the other: each class is
    charged its own groups' dollars."""
    d = pd_scenario(LAYOUTS["mixed"])
    d["cluster"]["gpu_hour_usd"] = {"p": 1.0, "d": 2.0, "c": 4.0}
    cost = run(d).summary_dict["cost"]
    g = cost["groups"]
    assert cost["classes"]["lo"]["cost_usd"] == pytest.approx(g["p"]["cost_usd"] + g["d"]["cost_usd"], rel=1e-12)
    assert cost["classes"]["hi"]["cost_usd"] == pytest.approx(g["c"]["cost_usd"], rel=1e-12)
    assert cost["unallocated_usd"] == 0


# ---- the fast paths equal stepping ----------------------------------------------------------------------
@pytest.mark.parametrize("first_token", ["decode", "prefill"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fast_paths_equal_stepping(layout, first_token):
    d = pd_scenario(LAYOUTS[layout], drain=False)
    d["cluster"]["first_token"] = first_token
    d["streams"][1]["arrival"]["rate"] = 4.0
    fast = run(d)
    d["engine"].update(fast_forward=False, lazy_batch=False)
    stepped = run(d)
    pd.testing.assert_frame_equal(fast.requests, stepped.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.timeseries, stepped.timeseries, check_exact=True)
    assert fast.summary_dict["run"]["engine_events"] < stepped.summary_dict["run"]["engine_events"]


@pytest.mark.parametrize("layout", ["1p1d", "mixed"])
def test_the_cluster_tables_are_the_same_without_per_replica_results(layout):
    # (without them, a prefill replica keeps no rows or step logs of its legs: nothing reads them)
    from sim.cluster import simulate_cluster

    d = pd_scenario(LAYOUTS[layout])
    d["streams"][1]["arrival"]["rate"] = 4.0
    whole = simulate_cluster(scenario_from_dict(copy.deepcopy(d)), per_replica=True)
    lean = simulate_cluster(scenario_from_dict(copy.deepcopy(d)), per_replica=False)
    pd.testing.assert_frame_equal(lean.requests, whole.requests, check_exact=True)
    pd.testing.assert_frame_equal(lean.timeseries, whole.timeseries, check_exact=True)
    for key in ("overall", "classes", "tenants", "cost"):
        assert lean.summary_dict[key] == whole.summary_dict[key]
    assert lean.cluster["disaggregation"] == whole.cluster["disaggregation"]
    assert whole.replicas and not lean.replicas


def test_landed_decoders_join_the_decode_run_in_flight(monkeypatch):
    # a request whose KV lands while the decode replica's run is in flight joins that run at its
    # next step boundary instead of ending it there: fewer engine events, the same bytes
    from sim.cluster.disagg import PDReplica
    d = pd_scenario(LAYOUTS["1p1d"], drain=False)
    d["streams"][1]["arrival"]["rate"] = 4.0
    joined = run(d)
    monkeypatch.setattr(PDReplica, "LAND", False)
    cut = run(d)
    pd.testing.assert_frame_equal(joined.requests, cut.requests, check_exact=True)
    pd.testing.assert_frame_equal(joined.timeseries, cut.timeseries, check_exact=True)

    def decode_events(res):
        return sum(r["engine_events"] for r in res.summary_dict["cluster"]["replicas"] if r["group"] == "d")
    assert decode_events(joined) < decode_events(cut)


@pytest.mark.parametrize("layout", ["2p2d-small-decode", "swap-decode"])
def test_the_decode_router_and_reservations_read_bounds_of_kv_use_as_the_values(monkeypatch, layout):
    # least_kv picks a decode replica from bounds of the candidates' KV use where they settle it,
    # without allocating the blocks of the steps their runs have begun, and a reservation
    # allocates them only where the room depends on them: the same bytes as reading every value
    from sim.cluster.disagg import NEVER, PDReplica
    from sim.routers import LeastKV
    d = pd_scenario(LAYOUTS[layout], drain=False)
    d["streams"][1]["arrival"]["rate"] = 4.0
    settled = []
    choose = LeastKV.route_kv_bounds

    def counted(bounds):
        settled.append(choose(bounds))
        return settled[-1]
    monkeypatch.setattr(LeastKV, "route_kv_bounds", staticmethod(counted))
    by_bounds = run(d)
    monkeypatch.setattr(PDReplica, "unallocated_at_most", lambda self, t_ns: NEVER)  # (no bound: read them)
    by_values = run(d)
    pd.testing.assert_frame_equal(by_bounds.requests, by_values.requests, check_exact=True)
    pd.testing.assert_frame_equal(by_bounds.timeseries, by_values.timeseries, check_exact=True)
    assert by_bounds.summary_dict["cluster"] == by_values.summary_dict["cluster"]
    assert any(i is not None for i in settled)


# ---- priority in both pools -----------------------------------------------------------------------------
def test_priority_ranks_the_prefill_queue_and_decode_admission():
    d = pd_scenario({"groups": [{"name": "p", "role": "prefill", "replicas": 1},
                                {"name": "d", "role": "decode", "replicas": 1, "engine": {"kv_blocks": 48}}]},
                    drain=False)
    d["streams"][1]["arrival"]["rate"] = 6.0  # a flood of the low class
    ttft = {}
    for pol in ("fcfs", "priority"):
        d["policy"] = {"name": pol}
        req = run(d).requests
        hi = req[(req["class"] == "hi") & req["ttft_s"].notna()]
        ttft[pol] = (hi["ttft_s"].quantile(0.9), hi["prefill_queue_s"].quantile(0.9), hi["decode_wait_s"].quantile(0.9))
    assert ttft["priority"][0] < ttft["fcfs"][0]
    assert ttft["priority"][1] <= ttft["fcfs"][1] and ttft["priority"][2] <= ttft["fcfs"][2]


def test_the_summary_splits_ttft_per_class_and_the_files_hold_it(tmp_path):
    d = pd_scenario()
    res = run(d)
    rep = res.cluster["disaggregation"]
    for cname in ("hi", "lo"):
        c = rep["classes"][cname]
        parts = sum(c[k] for k in ("prefill_queue_mean_s", "prefill_mean_s", "decode_wait_mean_s", "transfer_mean_s",
                                   "decode_join_mean_s"))
        req = res.requests
        started = req[(req["class"] == cname) & req["decode_join_s"].notna()]
        assert parts == pytest.approx(started["ttft_s"].mean(), rel=1e-9)
    out = res.save(tmp_path / "run")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cluster"]["disaggregation"]["link"] == "custom"
    assert "transfer_s" in pd.read_parquet(out / "requests.parquet").columns


# ---- bad layouts: one line, exit 2 -------------------------------------------------------------------------
@pytest.mark.parametrize("cluster, words", [
    ({"groups": [{"role": "prefil", "replicas": 1}]}, "role"),
    ({"groups": [{"name": "p", "role": "prefill", "replicas": 1}]}, "but no decode group serves it"),
    ({"groups": [{"name": "d", "role": "decode", "replicas": 1}]}, "no prefill or co-located group"),
    ({**PD, "link": "infiniband"}, "cluster.link"),
    ({**PD, "link": {"bandwidth_bytes_per_s": -1}}, "bandwidth_bytes_per_s"),
    ({**PD, "decode_router": "nearest"}, "cluster.decode_router"),
    ({**PD, "first_token": "client"}, "cluster.first_token"),
    ({**PD, "router": {"name": "least_outstanding", "refresh_s": 1.0}}, "refresh_s"),
])
def test_bad_layouts_are_refused_in_one_line(cluster, words):
    d = small_scenario()
    d["cluster"] = cluster
    with pytest.raises(ScenarioError, match=words):
        scenario_from_dict(d)


@pytest.mark.parametrize("link, msg", [
    # (each named at its key inside the table; pydantic's union said "cluster.link.str: Input should be a
    # valid string" for all of them)
    ({"preset": "ib-800"}, "cluster.link.preset: expected 'nvlink', 'nvlink5', 'ib-200', 'ib-400', 'roce-200', "
                           "'roce-400', 'pcie4' or 'pcie5' (got 'ib-800'); did you mean 'ib-400'?"),
    ({"bandwith_bytes_per_s": 1e9}, "cluster.link.bandwith_bytes_per_s: unknown key (expected one of preset, "
                                    "bandwidth_bytes_per_s, latency_s, pipelined, kv_bytes_per_token, layers); did you "
                                    "mean 'bandwidth_bytes_per_s'?"),
    ({"bandwidth_bytes_per_s": -1}, "cluster.link.bandwidth_bytes_per_s: expected a number > 0 (bytes per second "
                                    "per GPU) (got -1)"),
    ({"bandwidth_bytes_per_s": 0}, "cluster.link.bandwidth_bytes_per_s: expected a number > 0"),
    ({"bandwidth_bytes_per_s": float("nan")}, "cluster.link.bandwidth_bytes_per_s: expected a number > 0"),
    ({"bandwidth_bytes_per_s": float("inf")}, "cluster.link.bandwidth_bytes_per_s: expected a number > 0"),
    ({"latency_s": -1e-6}, "cluster.link.latency_s: expected a number >= 0 (seconds per transfer) (got -1e-06)"),
    ({"pipelined": "yes"}, "cluster.link.pipelined: expected true or false (got 'yes')"),
    ({"kv_bytes_per_token": 0}, "cluster.link.kv_bytes_per_token: expected an integer > 0 (bytes of KV per token) "
                                "(got 0)"),
    ("ib-800", "cluster.link: expected a link preset (nvlink, nvlink5, ib-200, ib-400, roce-200, roce-400, pcie4, "
               "pcie5) or a table with bandwidth_bytes_per_s, latency_s, pipelined (got 'ib-800'); did you mean "
               "'ib-400'?"),
    (5, "cluster.link: expected a link preset"),
])
def test_a_bad_link_names_its_key(link, msg):
    d = small_scenario()
    d["cluster"] = {**PD, "link": link}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(d)
    assert str(err.value).startswith(f"<inline>: {msg}") and "\n" not in str(err.value)


@pytest.mark.parametrize("cluster, words", [
    ('{groups=[{role="prefil"}]}', "cluster.groups.0.role"),
    ('{groups=[{name="p",role="prefill"},{name="d",role="decode"}],link="infiniband"}', "cluster.link"),
    ('{groups=[{name="p",role="prefill",gpus=2,engine={profile="h200-llama-3-70b-tp4"}},{name="d",role="decode"}]}',
     "cluster.groups.0.gpus: 2 GPUs per replica contradicts profile 'h200-llama-3-70b-tp4'"),
])
def test_bad_layouts_on_the_command_line_exit_2(tmp_path, cluster, words):
    res = CliRunner().invoke(main, ["run", "chat_vs_batch", "--no-plots", "--out", str(tmp_path / "o"),
                                    "--set", f"cluster={cluster}"])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_a_prefill_replica_blocked_behind_unsent_copies_does_not_spin(monkeypatch):
    """Prefill replicas whose waiters need the blocks of copies the full decode side cannot take
    yet wake when a copy could have started and landed, not every shortest copy's time: the
    bound of a copy not started yet begins at a decode step boundary or a handoff (the
    exactness fuzz's disagg draw 80 woke them 98,487 times in 6 s, for 165 engine events)."""
    from sim.cluster.disagg import PDReplica
    d = {"name": "blocked", "seed": 7364, "horizon_s": 6.0, "drain": False,
         "engine": {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-05,
                                "decode_token_s": 0.0001, "context_token_s": 1e-07, "swap_block_s": 0.0001},
                    "max_num_seqs": 8, "max_batched_tokens": 256, "block_size": 16, "kv_blocks": 40,
                    "swap_blocks": 32, "preemption": "off", "preempt_for_waiting": "never",
                    "timeseries_interval_s": 0.5, "overhead": {"preset": "none", "step_s": 0.001, "frontend_s": 0.003},
                    "prefix_caching": True, "prefix_block_tokens": 32},
         "policy": {"name": "fcfs"}, "classes": [{"name": "hi", "priority": 0}, {"name": "lo", "priority": 1}],
         "streams": [{"tenant": "a", "class": "hi", "arrival": {"process": "poisson", "rate": 4.0},
                      "prompt_tokens": {"dist": "uniform", "low": 10, "high": 200},
                      "output_tokens": {"dist": "uniform", "low": 1, "high": 4}, "max_tokens": 4,
                      "prefix": {"system_tokens": 64, "conversations": 3, "block_tokens": 32}},
                     {"tenant": "b", "class": "lo", "arrival": {"process": "poisson", "rate": 4.0},
                      "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
                      "output_tokens": {"dist": "uniform", "low": 20, "high": 300}, "max_tokens": 300,
                      "prefix": {"system_tokens": 64, "conversations": 3, "block_tokens": 32}}],
         "cluster": {"groups": [{"name": "p", "role": "prefill", "replicas": 2},
                                {"name": "d", "role": "decode", "replicas": 2,
                                 "engine": {"kv_blocks": 48, "preemption": "auto"}}],
                     "router": "least_kv", "decode_router": "least_outstanding",
                     "link": {"preset": "ib-200", "kv_bytes_per_token": 131072, "layers": 32, "pipelined": True}}}
    wakes = [0]
    bound = PDReplica.next_arrival_ns

    def counted(self):
        wakes[0] += self.role == "prefill"
        return bound(self)
    monkeypatch.setattr(PDReplica, "next_arrival_ns", counted)
    res = run(d)
    events = res.summary_dict["run"]["engine_events"]
    assert (res.requests["status"] == "unfinished").any()  # (the decode side is full: copies wait)
    assert wakes[0] < 20 * events, (wakes[0], events)


#: the exactness fuzz's disagg draw 774: MLFQ, decode-side recompute, copies landing on 3 decode replicas
MLFQ_LANDING = {'name': 'fuzz-disagg',
                'seed': 2434,
                'horizon_s': 10.0,
                'drain': True,
                'engine': {'profile': {'kind': 'linear',
                                       'base_s': 0.01,
                                       'prefill_token_s': 1e-05,
                                       'decode_token_s': 0.0001,
                                       'context_token_s': 1e-07,
                                       'swap_block_s': 0.0001},
                           'max_num_seqs': 8,
                           'max_batched_tokens': 512,
                           'block_size': 16,
                           'kv_blocks': 128,
                           'swap_blocks': 32,
                           'preemption': 'recompute',
                           'preempt_for_waiting': 'priority',
                           'timeseries_interval_s': 3.0,
                           'overhead': {'preset': 'none', 'step_s': 0.001, 'frontend_s': 0.003},
                           'watermark': 0.05},
                'policy': {'name': 'mlfq'},
                'classes': [{'name': 'hi', 'priority': 0, 'ttft_slo_s': 1.0}, {'name': 'lo', 'priority': 1}],
                'streams': [{'tenant': 'a',
                             'class': 'hi',
                             'arrival': {'process': 'poisson', 'rate': 2.0},
                             'prompt_tokens': {'dist': 'uniform', 'low': 10, 'high': 200},
                             'output_tokens': {'dist': 'uniform', 'low': 5, 'high': 150},
                             'max_tokens': 150},
                            {'tenant': 'b',
                             'class': 'lo',
                             'arrival': {'process': 'poisson', 'rate': 1.0},
                             'prompt_tokens': {'dist': 'uniform', 'low': 50, 'high': 400},
                             'output_tokens': {'dist': 'uniform', 'low': 20, 'high': 300},
                             'max_tokens': 300}],
                'cluster': {'groups': [{'name': 'p', 'role': 'prefill', 'replicas': 2},
                                       {'name': 'd',
                                        'role': 'decode',
                                        'replicas': 3,
                                        'engine': {'kv_blocks': 48, 'preemption': 'recompute'}}],
                            'router': 'least_kv',
                            'decode_router': 'least_outstanding',
                            'link': {'preset': 'ib-200', 'kv_bytes_per_token': 131072, 'layers': 32,
                                     'pipelined': True}}}


def test_a_landed_decoder_under_a_policy_with_quanta_is_stepped_exactly():
    """A decoder taken in at a boundary (its copy landed) is first scheduled there: under MLFQ
    its quantum's end is declared only after that first step, so the run there is that step
    alone, as an admitted prefill's is. (Fast-forwarded past it, its level went stale and a
    later eviction took another request.)"""
    from scripts.exactness_fuzz import _run, differences
    assert differences(_run(MLFQ_LANDING, True), _run(MLFQ_LANDING, False)) == []


@pytest.mark.parametrize("think", [{"dist": "constant", "value": 0.0}, {"dist": "exponential", "mean": 0.3}])
def test_closed_loop_users_send_when_their_request_ends_and_fast_is_stepping(think):
    """A closed-loop user's next request goes out 1 ns after its last one ended (with no think
    time), so each user has one request in flight; the fast paths give stepping's bytes."""
    d = pd_scenario(cluster={"groups": [{"name": "p", "role": "prefill", "replicas": 2},
                                        {"name": "d", "role": "decode", "replicas": 2}]})
    d["streams"][0]["arrival"] = {"process": "closed_loop", "users": 3, "think": think}
    fast = run(d)
    slow = copy.deepcopy(d)
    slow["engine"].update(fast_forward=False, lazy_batch=False)
    stepped = run(slow)
    pd.testing.assert_frame_equal(fast.requests, stepped.requests)
    req = fast.requests
    users = req[req["stream"] == 0].sort_values(["user", "arrival_s"])
    assert users["user"].nunique() == 3 and len(users) > 6
    for _, u in users.groupby("user"):
        prev_end = u["finish_s"].to_numpy()[:-1]
        nxt = u["arrival_s"].to_numpy()[1:]
        if think["dist"] == "constant":
            assert nxt == pytest.approx(prev_end + 1e-9, abs=1e-12)
        else:
            assert (nxt >= prev_end + 1e-9 - 1e-12).all()


def test_a_profile_without_a_shape_needs_the_link_bytes():
    d = pd_scenario()
    del d["cluster"]["link"]["kv_bytes_per_token"]
    with pytest.raises(ScenarioError, match="kv_bytes_per_token"):
        run(d)


@pytest.mark.parametrize("key, value", [("link", "nvlink"), ("first_token", "prefill")])
def test_disaggregation_keys_without_prefill_groups_warn_that_they_do_nothing(key, value):
    d = small_scenario()
    d["cluster"] = {"replicas": 2, key: value}
    with pytest.warns(Warning, match=f"cluster.{key} is set but .* does nothing"):
        scenario_from_dict(d)


def test_the_shipped_scenario_fast_equals_stepping_with_decode_side_evictions():
    """A request waiting for decode room evicts running batch requests: stepped, the kept rank
    order once still listed the victims (they were planned after they had left)."""
    from sim import load_scenario
    over = ["horizon_s=15.0", 'cluster={groups=[{name="p",role="prefill",replicas=2},'
            '{name="d",role="decode",replicas=2}]}']
    fast = simulate(load_scenario("disaggregated_chat_batch", overrides=over), check_invariants=True)
    stepped = simulate(load_scenario("disaggregated_chat_batch",
                                     overrides=over + ["engine.fast_forward=false", "engine.lazy_batch=false"]))
    pd.testing.assert_frame_equal(fast.requests, stepped.requests, check_exact=True)
    assert (fast.requests["prefill_passes"] > 1).any()  # (evicted and prefilled again)


def test_fast_equals_stepping_when_decode_replicas_copy_over_different_numbers_of_links():
    """A prefill replica's run stops at the earliest a copy not started yet could land: over the
    most links any decode replica offers (a TP2 replica's two), not the fewest."""
    d = pd_scenario({"groups": [{"name": "p", "role": "prefill", "replicas": 1, "gpus": 2},
                                {"name": "d1", "role": "decode", "replicas": 1, "gpus": 1,
                                 "engine": {"kv_blocks": 48}},
                                {"name": "d2", "role": "decode", "replicas": 1, "gpus": 2,
                                 "engine": {"kv_blocks": 48}}],
                     "link": {"bandwidth_bytes_per_s": 2e8, "latency_s": 1e-4, "kv_bytes_per_token": 131072}},
                    drain=False)
    d["streams"][1]["arrival"]["rate"] = 4.0
    fast = run(d)
    d["engine"].update(fast_forward=False, lazy_batch=False)
    pd.testing.assert_frame_equal(fast.requests, run(d).requests, check_exact=True)


def _draw27_one_token_users() -> dict:
    """The fuzz's disagg draw 27, the first token from the prefill, and closed-loop users whose
    one- to three-token answers end at a prefill replica's step boundary."""
    import numpy as np

    from scripts.exactness_fuzz import draw

    d = draw("disagg", np.random.default_rng(27))
    d["cluster"]["first_token"] = "prefill"
    d["streams"].append({"tenant": "u", "class": "hi", "arrival": {"process": "closed_loop", "users": 4,
                                                                   "think": {"dist": "constant", "value": 0.0}},
                         "prompt_tokens": {"dist": "uniform", "low": 10, "high": 200},
                         "output_tokens": {"dist": "uniform", "low": 1, "high": 3}, "max_tokens": 3})
    if "tenants" in d:
        d["tenants"].append({"name": "u", "share": 1.0})
    return d


def test_one_token_answers_ending_at_the_prefill_bound_closed_loop_runs_exactly():
    """With the first token from the prefill, a one-token answer ends at a prefill replica's step
    boundary and its closed-loop user sends again 1 ns later: other replicas' runs stop there
    too (DisaggCluster.end_bound). The fuzz's disagg draw 27 with such users differed before."""
    from scripts.exactness_fuzz import _run, differences

    d = _draw27_one_token_users()
    assert differences(_run(copy.deepcopy(d), True), _run(copy.deepcopy(d), False)) == []


def test_replicas_waking_each_other_without_progress_stop_with_one_line(monkeypatch):
    """The cluster's clock guard (sim.core.observe.ClockGuard): a swap-mode decode group made to
    send its victims back to a prefill replica (what a reverted change did) leaves, on the draw
    above, decode blocks held and prefill blocks full of KV waiting for decode room; the
    replicas' bounds then move each other on by a few ns a wake, forever. The run stops with a
    StallError naming the stretch and what each replica holds."""
    import sim.cluster.driver as driver
    from scripts.exactness_fuzz import _run
    from sim.core.errors import StallError

    class EveryModeRecomputes:  # (the decode group's swap mode, taken for recompute by the driver)
        @staticmethod
        def resolve(mode):
            return type("Mode", (), {"name": "recompute"})

    monkeypatch.setattr(driver, "PREEMPTION_MODES", EveryModeRecomputes)
    monkeypatch.setattr(driver, "CLOCK_EVERY", 1 << 15)
    d = _draw27_one_token_users()
    assert [g["engine"].get("preemption") for g in d["cluster"]["groups"] if g["role"] == "decode"] == ["swap"]
    with pytest.raises(StallError, match=r"^cluster\.stalled: the clock crept from t=9\.\d+s to t=9\.\d+s over 32768 "
                                         r"events .* replica 3 \(d\): 0 running, 1 waiting, 2 with KV in flight"):
        _run(d, True)
