"""Theory tests: the engine as a single M/G/1 server against closed-form queueing results.

Set-up (tests/theory_cases.py): ``max_num_seqs = 1``, constant step time 5 ms and no per-token
cost, one-token prompts, Poisson arrivals per class, exponential output lengths (mean 20 tokens,
so E[S] = 0.1 s). Service time = output tokens x 5 ms. Every theoretical value is computed from
the simulated requests' own arrival counts and service-time moments. Seeds 1, 2, 3; a test pools
the three runs (mean of the simulated values vs mean of the theoretical values) and states its
tolerance. Regression (golden-value) tests live elsewhere.
"""
import numpy as np
import pytest

from tests import theory_cases as tc



def test_fcfs_matches_pollaczek_khinchine():
    """M/G/1 FCFS, load 0.7: mean wait W = lambda E[S^2] / (2 (1 - rho)); within 5 % (3 seeds)."""
    sim, theory = np.mean([tc.case_pk(s) for s in tc.SEEDS], axis=0)
    assert sim == pytest.approx(theory, rel=0.05)


def test_priority_never_matches_cobham():
    """Non-preemptive M/G/1 priority (preempt_for_waiting = "never"), three classes at loads
    0.2/0.2/0.3: W_k = W0 / ((1 - s_{k-1})(1 - s_k)), W0 = sum_i lambda_i E[S_i^2] / 2,
    s_k = rho_0 + ... + rho_k; each class's mean wait (arrival -> first admission) within 8 %."""
    runs = [tc.case_priority(s, preemptive=False)[:2] for s in tc.SEEDS]
    sim = np.mean([r[0] for r in runs], axis=0)
    theory = np.mean([r[1] for r in runs], axis=0)
    for k in range(3):
        assert sim[k] == pytest.approx(theory[k], rel=0.08), f"class {k}"


def test_priority_strict_swap_matches_preemptive_resume():
    """Preemptive-resume M/G/1 priority (strict, swap at zero cost), loads 0.2/0.2/0.3:
    T_k = E[S_k] / (1 - s_{k-1}) + (sum_{i<=k} lambda_i E[S_i^2] / 2) / ((1 - s_{k-1})(1 - s_k));
    each class's mean sojourn (arrival -> finish) within 8 %. Preemption happens at step
    boundaries (5 ms), a small bias the tolerance covers."""
    runs = [tc.case_priority(s, preemptive=True) for s in tc.SEEDS]
    assert all(r[2]["preemptions"].sum() > 1000 for r in runs)  # preemption really happened
    assert all((r[2].loc[r[2]["class"] == "c0", "preemptions"] == 0).all() for r in runs)
    sim = np.mean([r[0] for r in runs], axis=0)
    theory = np.mean([r[1] for r in runs], axis=0)
    for k in range(3):
        assert sim[k] == pytest.approx(theory[k], rel=0.08), f"class {k}"


@pytest.mark.parametrize("seed", [1, 2])
def test_wfq_token_shares_follow_weights(seed):
    """WFQ with weights (8, 2, 1), three saturated classes of equal lengths, no drain: each
    class's share of generated tokens is w_k / sum(w) = 72.7 / 18.2 / 9.1 % within 3 points."""
    sim, theory = tc.case_wfq(seed)
    for k in range(3):
        assert abs(sim[k] - theory[k]) < 0.03, f"class {k}: {sim[k]:.3f} vs {theory[k]:.3f}"


def test_aging_bounds_the_extra_wait_of_a_low_class():
    """Class 0 at load 0.9 plus a rare class 3, non-preemptive. Under `priority` class 3's worst
    wait explodes (beyond class 0's worst + the aging bound); under `aging` (alpha = 1 /s):
    max W_3 - max W_0 <= (3 - 0) / alpha + max service time."""
    for seed in tc.SEEDS[:2]:
        w0p, w3p, smax = tc.case_aging(seed, "priority")
        w0a, w3a, smax_a = tc.case_aging(seed, "aging")
        bound = 3 / tc.AGING_ALPHA + smax_a
        assert w3a - w0a <= bound, f"seed {seed}: {w3a:.2f} - {w0a:.2f} > {bound:.2f}"
        assert w3p - w0p > 2 * bound, f"seed {seed}: priority did not starve class 3"
