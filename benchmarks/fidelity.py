"""Run the fidelity suite (same as ``priosim fidelity``): every published row reproduced by a
scenario, published vs simulated with relative errors; the report and parity plot go to
results/fidelity/ (``--docs``: docs/fidelity.md and docs/figures/).

    python benchmarks/fidelity.py [--rows PREFIX ...] [--docs]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cli import fidelity  # noqa: E402

if __name__ == "__main__":
    fidelity.main(sys.argv[1:], prog_name="benchmarks/fidelity.py")
