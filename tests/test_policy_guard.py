"""A user's policy sees read-only requests and its answers are checked (sim.core.guard): a write,
an ill-typed or NaN key, a NaN or ill-typed next change stop the run with one line naming the
policy; a time past the engine's range is never; shipped policies, guarded, give the very same
results (so they write nothing, and handing them the requests directly is safe)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import POLICIES
from sim import ScenarioError
from sim.core.costs import NEVER, NS
from sim.core.engine import change_ns
from sim.core.guard import PolicyContractError, checked_key, checked_next_change, make_view
from sim.core.request import Request
from tests.conftest import small_scenario

MOD = "tests.hostile_policies"


def _sc(policy: str, **over) -> dict:
    sc = small_scenario(policy={"name": f"{MOD}:{policy}"}, horizon_s=10.0)
    sc.update(over)
    return sc


def _fails(run, policy: str, **over) -> str:
    with pytest.raises(PolicyContractError) as err:
        run(_sc(policy, **over))
    msg = str(err.value)
    assert "\n" not in msg and f"policy '{MOD}:{policy}'" in msg
    return msg


@pytest.mark.parametrize("policy,attr", [("WritesCls", "req.cls"), ("WritesPrompt", "req.prompt_tokens"),
                                         ("WritesOnFinish", "req.generated"), ("WritesFeature", "req.features")])
def test_a_write_into_a_request_raises_naming_the_policy(run, policy, attr):
    assert f"wrote {attr}: policies see requests read-only" in _fails(run, policy)


def test_a_write_into_the_ranking_context_raises(run):
    assert "wrote ctx.queue_len" in _fails(run, "WritesContext")


@pytest.mark.parametrize("policy,shown", [("NanKey", "element 0 is NaN"), ("StrKey", "'urgent' (str)"),
                                          ("NoneKey", "None (NoneType)"), ("ListKey", "[1, 2] (list)"),
                                          ("BareKey", "returned 0.")])
def test_a_key_that_does_not_order_raises(run, policy, shown):
    msg = _fails(run, policy)
    assert "key() returned" in msg and "for request " in msg and shown in msg and "expected a tuple" in msg


def test_inf_keys_order(run):
    r = run(_sc("InfKey")).requests
    assert len(r) and (r["status"] == "finished").all()


@pytest.mark.parametrize("policy,shown", [("NanChange", "returned nan"), ("NegativeChange", "returned -1.0"),
                                          ("StrChange", "returned 'soon'")])
def test_a_next_change_that_is_not_a_time_raises(run, policy, shown):
    msg = _fails(run, policy)
    assert "next_change(" in msg and shown in msg and "expected None" in msg


@pytest.mark.parametrize("policy", ["HugeChange", "InfChange", "HugeIntChange"])
def test_a_next_change_past_the_range_is_never(run, policy):
    """1e300 s used to overflow the integer-ns conversion; now it means never: the same schedule
    as declaring no change."""
    cols = ["request_id", "admitted_s", "finish_s"]
    base = run(_sc("Fifo")).requests[cols]
    pd.testing.assert_frame_equal(run(_sc(policy)).requests[cols], base)


def test_change_ns_caps_and_refuses_nan():
    assert change_ns(None, 5, None) == NEVER
    assert change_ns(1.5, 5, None) == int(1.5 * NS)
    assert change_ns(0.0, 5, None) == 6  # a time already past: the next boundary
    for t in (1e300, math.inf, NEVER / NS):
        assert change_ns(t, 5, None) == NEVER
    assert change_ns(-math.inf, 5, None) == 6
    with pytest.raises(ScenarioError, match="policy 'aging': next_change"):
        change_ns(math.nan, 5, type("P", (), {"name": "aging"})())


def test_a_users_own_waiting_set_gets_views_and_the_same_schedule(run):
    cols = ["request_id", "admitted_s", "finish_s", "preemptions"]
    pd.testing.assert_frame_equal(run(_sc("OwnQueues")).requests[cols], run(_sc("Fifo")).requests[cols])


def test_a_user_policy_gives_the_shipped_policys_results(run):
    """The guard changes nothing for a policy that keeps the contract: Fifo is ``priority``."""
    a = run(_sc("Fifo")).requests
    b = run(small_scenario(horizon_s=10.0)).requests
    pd.testing.assert_frame_equal(a, b)


# ---- shipped policies write nothing ----------------------------------------------------------
SHIPPED = [(n, {}) for n in POLICIES.names()] + [("wfq", {"cost": "predicted", "predictor": "noisy"}),
                                                 ("sjf_rank", {"predictor": "learned", "train_requests": 30}),
                                                 ("mlfq", {"base_quantum_s": 0.02, "starve_limit_s": 0.3})]


@pytest.mark.parametrize("name,params", SHIPPED, ids=[f"{n}{'-' if p else ''}{'-'.join(p)}" for n, p in SHIPPED])
@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_shipped_policies_guarded_give_identical_results(run, monkeypatch, name, params, fair):
    """Every shipped policy (and the fairness accountant around it), run once as the engine runs
    it and once guarded as a user's policy: the same requests, the same summary. A write would
    have raised, an ill-typed key too."""
    import sim.assembly

    sc = small_scenario(policy={"name": name, **params}, horizon_s=10.0)
    if fair:
        sc["fairness"] = {"enabled": True}
    plain = run(sc)
    asked: list[str] = []
    monkeypatch.setattr(sim.assembly, "needs_guard", lambda n: asked.append(n) or True)
    guarded = run(sc)
    assert asked == [name]
    pd.testing.assert_frame_equal(guarded.requests, plain.requests)
    assert guarded.summary_dict["classes"] == plain.summary_dict["classes"]


def test_shipped_policies_are_not_wrapped():
    import sim.assembly

    assert not any(sim.assembly.needs_guard(n) for n in POLICIES.names())
    assert sim.assembly.needs_guard(f"{MOD}:Fifo")


def test_the_conformance_suite_catches_a_write():
    from policies import check_policy
    from policies.check import PolicyCheckError

    with pytest.raises(PolicyCheckError, match="wrote req.cls .request 0.: policies see requests read-only"):
        check_policy(f"{MOD}:WritesCls")
    assert check_policy(f"{MOD}:Fifo")["requests"] == 300


# ---- the view --------------------------------------------------------------------------------
def _view():
    r = Request(7, 1_500_000_000, "a", "hi", 0, 0, 30, 12, 40, features={"f": 2.0}, hash_ids=[1, 2])
    return r, make_view(r, "m:P")


def test_the_view_reads_through_and_refuses_writes():
    r, v = _view()
    assert (v.request_id, v.arrival_s, v.cls, v.prompt_tokens, v.features["f"]) == (7, 1.5, "hi", 30, 2.0)
    r.generated = 3
    assert v.generated == 3  # live
    assert v.hash_ids == (1, 2)  # lists come as tuples
    for write in (lambda: setattr(v, "cls", "lo"), lambda: setattr(v, "brand_new", 1),
                  lambda: delattr(v, "cls"), lambda: v.features.update(f=1)):
        with pytest.raises(PolicyContractError, match="policy 'm:P' (wrote|deleted) req"):
            write()
    with pytest.raises(AttributeError):
        v._private_of_the_request  # noqa: B018 - private names are not forwarded
    v.predicted["tokens"] = 5.0  # the policy's own scratch dict
    assert r.predicted == {"tokens": 5.0} and r.cls == "hi"


def test_the_view_shows_every_field_of_a_request():
    from sim.core import request
    from sim.core.guard import FIELDS

    assert set(request.FIELDS) | {"attained_s"} == set(FIELDS)
    r, v = _view()
    for name in set(FIELDS) - {"hidden_output_tokens", "features", "hash_ids"}:
        assert getattr(v, name) == getattr(r, name) or getattr(r, name) != getattr(r, name)  # (NaN)


def test_the_view_hides_the_true_length_by_either_name():
    r, v = _view()
    for name in ("true_output_tokens", "hidden_output_tokens"):
        with pytest.raises(AttributeError, match="hidden from non-oracle"):
            getattr(v, name)
    r.reveals_output = True
    assert v.true_output_tokens == v.hidden_output_tokens == 12


# ---- hostile values: a PolicyContractError or an accepted key, never another exception ----------
ATOMS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-10 ** 30, max_value=10 ** 30),
    st.booleans(), st.none(), st.text(max_size=3), st.binary(max_size=2),
    st.just(np.float64("nan")), st.just(np.int64(3)), st.just(np.float32(1.5)), st.just(Fraction(1, 3)),
    st.just(1 + 2j), st.just(object()),
)
KEYS = st.one_of(ATOMS, st.lists(st.one_of(ATOMS, st.lists(ATOMS, max_size=2), st.tuples(ATOMS)), max_size=4)
                 .flatmap(lambda xs: st.sampled_from([tuple(xs), list(xs), np.array(xs, dtype=object)])),
                 st.dictionaries(st.text(max_size=2), ATOMS, max_size=2))


def test_numpy_numbers_in_a_key_are_taken_as_built_in_numbers():
    """A key of numpy numbers ranks as the same built-in numbers (whose comparisons give a bool,
    as the engine's compiled build needs; a numpy number's give a numpy.bool)."""
    req = type("R", (), {"request_id": 4})()
    k = checked_key((np.float32(1.5), np.int64(3), True, Fraction(1, 3), 2.0), "m:P", req)
    assert k == (1.5, 3, True, Fraction(1, 3), 2.0)
    assert [type(x) for x in k] == [float, int, bool, Fraction, float]
    assert type(checked_key(np.array([np.float64(0.5), 7]), "m:P", req)[0]) is float


@settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=KEYS, b=KEYS)
def test_hostile_keys_are_refused_in_one_line_or_order(a, b):
    req = type("R", (), {"request_id": 4})()
    ok = []
    for k in (a, b):
        try:
            ok.append(checked_key(k, "m:P", req))
        except PolicyContractError as err:
            assert "\n" not in str(err) and str(err).startswith("policy 'm:P': key() returned")
    for k in ok:
        assert type(k) is tuple and all(x == x for x in k)
    if len(ok) == 2:
        ok[0] < ok[1]  # (accepted keys always compare)  # noqa: B015


@settings(derandomize=True, max_examples=200, deadline=None)
@given(t=st.one_of(ATOMS, st.integers(min_value=-10 ** 400, max_value=10 ** 400)))
def test_hostile_next_changes_are_refused_in_one_line_or_are_times(t):
    try:
        s = checked_next_change(t, "m:P", 1.0)
    except PolicyContractError as err:
        assert "\n" not in str(err) and str(err).startswith("policy 'm:P': next_change(1)")
        return
    assert s is None or (type(s) is float and s >= 0)
    assert change_ns(s, 5, None) >= 6 or s is None


@settings(derandomize=True, max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=KEYS)
def test_hostile_keys_through_the_engine_stop_in_one_line_or_run(value):
    """A user policy whose key leads with a drawn value for every third request: the run ends,
    or stops with the one-line error; never another exception."""
    from sim import scenario_from_dict, simulate
    from tests import hostile_policies

    sc = small_scenario(policy={"name": f"{MOD}:Drawn"}, horizon_s=3.0)
    hostile_policies.Drawn.VALUE = value
    try:
        simulate(scenario_from_dict(sc))
    except PolicyContractError as err:
        assert "\n" not in str(err) and f"policy '{MOD}:Drawn': key() returned" in str(err)
    finally:
        hostile_policies.Drawn.VALUE = 0
