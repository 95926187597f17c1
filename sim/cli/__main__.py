"""``python -m sim.cli``: the priosim command."""
from sim.cli import console

console()
