"""The ``disaggregated`` capacity design: the fewest prefill + decode replicas meeting the SLOs,
its split searched too, GPUs per role in the answer (sim/experiments/capacity_pd.py)."""
from __future__ import annotations

import random

import pytest
from click.testing import CliRunner

from sim.config import load_scenario
from sim.experiments.capacity import capacity_search
from sim.experiments.capacity_pd import SplitSearch
from sim.experiments.slos import parse_slos


# ---- the split search against an oracle -------------------------------------------------------------
def _search(ok, worst, limit: int, m: int) -> tuple[SplitSearch, int]:
    s, probes = SplitSearch(limit), 0
    while not s.done:
        pts = s.probes(m)
        assert pts and not any(p in s.seen for p in pts), "each round probes splits not probed before"
        probes += len(pts)
        s.told({p: (ok(p), worst(p)) for p in pts})
    return s, probes


def _fewest(ok, worst, limit: int):
    """By brute force: the passing split of the smallest total, the lowest worst ratio among them
    (then the fewer prefill replicas)."""
    for n in range(2, 2 * limit + 1):
        got = [(p, n - p) for p in range(1, n) if p <= limit and n - p <= limit and ok((p, n - p))]
        if got:
            return min(got, key=lambda s: (worst(s), s[0]))
    return None


def test_split_search_finds_the_fewest_total_on_any_up_set():
    """Passing splits that form an up-set (more of either role never hurts; here the union of a
    few quadrants): the search's answer is the brute-force one, whatever the probes per round."""
    rng = random.Random(7)
    for _ in range(300):
        limit = rng.choice([1, 2, 3, 5, 8, 16])
        corners = [(rng.randint(1, limit + 2), rng.randint(1, limit + 2)) for _ in range(rng.randint(1, 3))]

        def ok(s, corners=corners):
            return any(s[0] >= a and s[1] >= b for a, b in corners)

        ratios: dict = {}

        def worst(s, ratios=ratios):
            return ratios.setdefault(s, rng.random())

        want = _fewest(ok, worst, limit)
        for m in (1, 2, 5):
            s, _ = _search(ok, worst, limit, m)
            assert s.answer == want, (limit, corners, m)
            assert s.exhausted == (want is None)


def test_split_search_from_known_verdicts():
    """Started from some true verdicts (as another search's, carried over), the search still
    finds the fewest total, without probing a split it was told about."""
    rng = random.Random(11)
    for _ in range(200):
        limit = rng.choice([2, 3, 5, 8])
        corners = [(rng.randint(1, limit + 2), rng.randint(1, limit + 2)) for _ in range(rng.randint(1, 3))]

        def ok(s, corners=corners):
            return any(s[0] >= a and s[1] >= b for a, b in corners)

        want = _fewest(ok, lambda s: 0.5, limit)
        told = {(rng.randint(1, limit), rng.randint(1, limit)) for _ in range(rng.randint(0, 6))}
        s = SplitSearch(limit)
        s.take_known([(t, ok(t)) for t in sorted(told)])
        while not s.done:
            pts = s.probes(2)
            assert pts and not any(p in s.seen for p in pts)
            s.told({p: (ok(p), 0.5) for p in pts})
        assert (s.answer is None) == (want is None), (limit, corners, told)
        if want is not None:
            assert sum(s.answer) == sum(want) and ok(s.answer), (limit, corners, told)


def test_split_search_probes_few_when_the_roles_barely_interact():
    """Prefill needs 3 replicas and decode 5, whatever the other role has (no interaction): the
    answer (3, 5) in a handful of probes, one at a time, with 64 allowed per role."""
    s, probes = _search(lambda s: s[0] >= 3 and s[1] >= 5, lambda s: 0.5, 64, 1)
    assert s.answer == (3, 5)
    assert probes <= 12


# ---- the search on a scenario ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    sc = load_scenario("diurnal_two_class", overrides=["horizon_s=30.0"])
    return sc, parse_slos(sc)


def test_disaggregated_answers_with_gpus_per_role(small):
    sc, slos = small
    rep = capacity_search(sc, ["shared", "disaggregated"], slos, workers=1, max_replicas=8)
    a = rep.designs["disaggregated"]
    assert a["ok"] is True and a["split"] == {"prefill": a["gpus_prefill"], "decode": a["gpus_decode"]}
    assert a["gpus_prefill"] >= 1 and a["gpus_decode"] >= 1
    assert a["gpus"] == a["replicas"] == a["gpus_prefill"] + a["gpus_decode"]  # (one GPU per replica here)
    assert [(g["role"], g["replicas"]) for g in a["cluster"]["groups"]] == [("prefill", a["gpus_prefill"]),
                                                                            ("decode", a["gpus_decode"])]
    # the fewest: every split the search tried with fewer replicas in all missed the SLOs
    tried = [p for p in rep.points if p["design"] == "disaggregated"]
    assert all(not p["ok"] for p in tried if sum(p["counts"]) < a["gpus"])
    table = rep.table()
    assert {"gpus_prefill", "gpus_decode"} <= set(table.columns)
    row = table.set_index("design").loc["disaggregated"]
    assert (row["gpus_prefill"], row["gpus_decode"]) == (a["gpus_prefill"], a["gpus_decode"])
    # a probe stopped once it had lost gives the verdicts of running it to its end
    full = capacity_search(sc, ["disaggregated"], slos, workers=1, max_replicas=8, early_stop=False)
    assert full.designs["disaggregated"] == a


def test_cli_capacity_disaggregated(tmp_path):
    from sim.cli import main

    out = tmp_path / "cap"
    r = CliRunner().invoke(main, ["capacity", "diurnal_two_class", "--designs", "shared,disaggregated",
                                  "--set", "horizon_s=30", "--max-replicas", "8", "--workers", "1",
                                  "--no-uncertainty", "--no-plots", "--out", str(out)])
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if line.lstrip().startswith("design"))
    assert "gpus_prefill" in header and "gpus_decode" in header
    assert any(line.lstrip().startswith("disaggregated") for line in r.output.splitlines())
    assert (out / "capacity.json").exists() and (out / "points.csv").exists()


@pytest.mark.parametrize("args, says", [
    (["--designs", "shared,disagregated"], "unknown design 'disagregated'"),
    (["--designs", "disaggregated", "--refresh-s", "1"], "--designs disaggregated: not available with --refresh-s"),
])
def test_cli_capacity_bad_designs_one_line(args, says):
    from sim.cli import main

    r = CliRunner().invoke(main, ["capacity", "diurnal_two_class", "--no-uncertainty", *args])
    assert r.exit_code == 2
    assert says in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_disaggregated_answers_with_closed_loop_users():
    """Closed-loop users (a user sends again when its answer ends) in every design: the
    disaggregated search finds its split as it does for open arrivals."""
    from sim import scenario_from_dict
    from tests.conftest import small_scenario

    d = small_scenario(horizon_s=15.0)
    d["engine"].update(profile="h200-llama-3-8b", kv_blocks=400, max_num_seqs=64)  # (a model's shape: KV bytes)
    d["streams"][0]["arrival"] = {"process": "closed_loop", "users": 4, "think": {"dist": "exponential", "mean": 0.5}}
    d["classes"][0]["tpot_slo_s"] = 0.1
    sc = scenario_from_dict(d)
    rep = capacity_search(sc, ["shared", "disaggregated"], parse_slos(sc), workers=1, max_replicas=6)
    a = rep.designs["disaggregated"]
    assert a["ok"] is True and a["gpus_prefill"] >= 1 and a["gpus_decode"] >= 1
    assert rep.designs["shared"]["ok"] is True


def test_the_disaggregated_design_keeps_the_scenarios_link_and_first_token():
    """The link is the hardware's and where the first token is streamed the engine's: every
    disaggregated point keeps the scenario's own."""
    from sim.experiments.capacity import design_cluster, design_dims, pd_settings

    sc = load_scenario("disaggregated_chat_batch", overrides=['cluster.first_token="prefill"'])
    pd_keys = pd_settings(sc)
    assert pd_keys["first_token"] == "prefill" and "link" in pd_keys
    cl = design_cluster("disaggregated", design_dims("disaggregated", sc.class_names, 4), [1, 2], None, pd_keys)
    assert cl["first_token"] == "prefill" and [g["role"] for g in cl["groups"]] == ["prefill", "decode"]
