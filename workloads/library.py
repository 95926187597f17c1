"""The scenario library: the scenario files shipped in ``workloads/scenarios/``, found by name.

Other packages ask here instead of building a path into this package's folder."""
from __future__ import annotations

from pathlib import Path

#: Where the shipped scenario files live.
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
#: The scenario ``priosim run`` runs when given none.
DEFAULT_SCENARIO = "chat_vs_batch"


def shipped_scenarios() -> list[str]:
    """Names of the shipped scenarios, sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def shipped_scenario(name: str) -> Path | None:
    """The file of the shipped scenario ``name`` (with or without ``.toml``), or None."""
    p = SCENARIO_DIR / f"{Path(name).stem}.toml"
    return p if p.is_file() else None
