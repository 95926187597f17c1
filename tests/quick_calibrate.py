"""Calibrate's ``quick`` grid timed fewer times, for tests of calibration's plumbing.

The same cells are measured and fitted the same way; each is timed 5 times with no minimum
time instead of 25 times and at least 0.08 s (about a third of the time on a CPU). The written
profile's ``meta.grid_spec`` records the grid as timed. Tests of the measurements themselves
(tests/test_calibrate.py's ``measured`` fixture) use the grid as shipped.

``python -m tests.quick_calibrate ARGS`` is the ``priosim`` program with this grid (for
scripts that call priosim, e.g. ``PRIOSIM="python -m tests.quick_calibrate"``).
"""
from __future__ import annotations

#: what the quick grid's timing becomes
TIMING = {"repeats": 5, "min_time_s": 0.0}


def quick_grid() -> dict:
    """The shipped quick grid with TIMING."""
    from calibrate.measure import GRIDS
    return {**GRIDS["quick"], **TIMING}


if __name__ == "__main__":
    from calibrate import measure
    from sim.cli import console

    measure.GRIDS["quick"] = quick_grid()
    console()
