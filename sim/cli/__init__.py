"""The ``priosim`` command: parse, load, run, write. Heavy imports live inside commands.

Bad input (scenario, profile, policy) exits with status 2 and one line naming the file, the key
and what was expected, before any simulation starts. The commands live by what they do:
:mod:`sim.cli.runs` (one run), :mod:`sim.cli.experiments` (many runs), :mod:`sim.cli.calibration`
(the cost model), on the group in :mod:`sim.cli.group`.
"""
from sim.cli import calibration, experiments, runs  # noqa: F401  (registers the commands on main)
from sim.cli.calibration import fidelity
from sim.cli.group import main

__all__ = ["fidelity", "main"]
