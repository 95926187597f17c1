"""Hostile ``--set`` overrides (deep brackets, huge numbers, NaN and inf, unicode, empty parts,
``=`` in the key, negative and huge indexes) either load or raise ScenarioError (one line for
the CLI), never another exception. Deterministic (``derandomize``) and a few seconds."""
from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sim.config import load_scenario
from sim.core.errors import ScenarioError

# keys of the default scenario (and near misses), each part of a dotted key drawn from these
PARTS = ["engine", "max_num_seqs", "profile", "classes", "chat", "batch", "0", "1", "-1", "99999999999999999999",
         "1" * 5000, "streams", "arrival", "rate", "horizon_s", "seed", "name", "policy", "cluster", "groups",
         "tenants", "admission", "source", "base_dir", "", " ", "é", "名前", "a=b", "x.y", "\x00", "ttft_slo"]
VALUES = ["1", "-1", "0", "1e400", "-1e400", "nan", "inf", "-inf", "+inf", "1" * 5000, "1" * 10_000,
          "[" * 5000 + "]" * 5000, "[" * 5000, "{a=" * 600 + "1" + "}" * 600, "", '""', "é", "名前", "=", "a=b",
          "[1, 2", "{", '"x"\nseed=5', "true", "[]", "{}", "0x7fffffffffffffffffff", "1_000", "\ud800"]


def _text(alphabet: list[str]):
    return st.one_of(st.sampled_from(alphabet), st.text(max_size=12))


keys = st.lists(_text(PARTS), min_size=1, max_size=40).map(".".join)
overrides = st.lists(st.one_of(st.tuples(keys, _text(VALUES)).map("=".join), st.text(max_size=20)),
                     min_size=1, max_size=3)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(overrides)
@example(["horizon_s=" + "[" * 5000 + "]" * 5000])
@example(["seed=" + "1" * 10_000])
@example(["classes." + "1" * 10_000 + ".priority=1"])
@example([".".join(["engine"] * 200) + "=1"])
@example(["streams.0." + ".".join(["x"] * 100) + "=1"])
@example(["classes.-1.priority=1"])
@example(["=1"])
@example(["engine..max_num_seqs=1"])
@example(["horizon_s=nan", "seed=inf"])
def test_hostile_overrides_load_or_raise_scenario_error(sets):
    try:
        load_scenario(None, overrides=sets)
    except ScenarioError as exc:
        assert "\n" not in str(exc).strip() or "\n" in "".join(sets), str(exc)
