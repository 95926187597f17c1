"""Rules for the test suite itself: every Hypothesis test is deterministic and bounded."""
from __future__ import annotations

from hypothesis import settings

#: the most examples one Hypothesis test may draw (its share of the suite's few minutes)
MAX_EXAMPLES = 300


def test_every_hypothesis_test_is_derandomized_and_bounded(request):
    """Each collected Hypothesis test draws the same examples on every run (``derandomize``),
    has no deadline (timing on a shared machine is no check) and at most MAX_EXAMPLES examples."""
    seen = []
    for item in request.session.items:
        fn = getattr(item, "obj", None)
        if not getattr(fn, "is_hypothesis_test", False):
            continue
        s = getattr(fn, "_hypothesis_internal_use_settings", settings.default)
        seen.append(item.nodeid)
        assert s.derandomize, f"{item.nodeid}: @settings(derandomize=True)"
        assert s.deadline is None, f"{item.nodeid}: @settings(deadline=None)"
        assert s.max_examples <= MAX_EXAMPLES, f"{item.nodeid}: max_examples {s.max_examples} > {MAX_EXAMPLES}"
    if len(request.session.items) > 1000:  # (the whole suite collected: its Hypothesis tests were seen)
        assert len(seen) >= 5, seen
