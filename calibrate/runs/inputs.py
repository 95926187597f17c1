"""What ``priosim replay`` and ``calibrate --from-runs`` say about their inputs before they
simulate (warnings about a run file, the note on redrawn arrivals) and what a replay's
``--json`` records of how it simulated. No torch; the CLI imports it inside its commands."""
from __future__ import annotations

import os
from pathlib import Path

from calibrate.runs.compare import Comparison
from calibrate.runs.scenario import arrival_mode, gpu_differs, model_differs, profile_meta, redrawn_arrivals
from calibrate.runs.table import Run
from calibrate.runs.vllm import summary_only_warning
from sim.core.costs import find_profile


def redrawn_runs(runs: list[Run], seed: int) -> str:
    """One note for the runs of a fit whose arrivals are drawn again from their client's
    process (:func:`~calibrate.runs.scenario.redrawn_arrivals`); empty when none is."""
    drawn = [r.label for r in runs if redrawn_arrivals(r, arrival_mode(r), seed)]
    if not drawn:
        return ""
    return (f"{len(drawn)} of {len(runs)} runs have no per-request send times ({', '.join(drawn[:4])}"
            + (", ..." if len(drawn) > 4 else "") + f"): their arrivals are drawn again from the client's "
            f"arrival process with seed {seed}, an independent draw from the measured one, so the fit also "
            f"absorbs that sampling noise in throughput and tails (runs saved with send times avoid it)")


def input_warnings(run: Run, profile: str) -> list[str]:
    """The warnings about one run's file before it is replayed on ``profile``, each naming the
    file: its reader's (a per-request list against its own summary), a summary-only file's, and
    a model or GPU the profile does not describe (where the file names them)."""
    out = list(run.warnings)
    for msg in (summary_only_warning(run), model_differs(run.settings.get("model"), profile),
                gpu_differs(run, profile)):
        if msg:
            out.append(f"{run.source}: {msg}")
    return out


def replay_record(run: Run, cmp: Comparison, profile: str, seed: int, arrivals: str, given: list[str], overrides: list[str],
                  engine_args: str | None, sglang_args: str | None) -> dict:
    """What a replay simulated, for its ``--json`` beside the metrics: the profile's file and
    name, the seed, the arrival mode asked for and the one used (and whether the send times
    were drawn again: :func:`~calibrate.runs.scenario.redrawn_arrivals`), the ``--set``
    overrides as given, the engine flags and every override the scenario got."""
    path = Path(profile) if os.path.isfile(profile) else find_profile(profile)
    return {"profile_path": str(path.resolve()) if path is not None else None,
            "profile_name": profile_meta(profile).get("name"), "seed": seed,
            "arrivals": {"asked": arrivals, "sent": cmp.mode, "redrawn": bool(redrawn_arrivals(run, cmp.mode, seed))},
            "sets": given, "engine_args": engine_args, "sglang_args": sglang_args, "overrides": overrides}


__all__ = ["input_warnings", "redrawn_runs", "replay_record"]
