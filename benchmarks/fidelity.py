"""Run the fidelity suite (same as ``priosim fidelity``): every published row reproduced by a
scenario, published vs simulated with relative errors; the report and parity plot go to
results/fidelity/ (``--docs``: docs/fidelity.md and docs/figures/).

    python -m benchmarks.fidelity [--rows PREFIX ...] [--docs]
"""
from __future__ import annotations

import sys

from sim.cli import fidelity

if __name__ == "__main__":
    fidelity.main(sys.argv[1:], prog_name="python -m benchmarks.fidelity")
