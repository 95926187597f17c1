"""``--engine-args`` / ``--sglang-args``: a real engine's own flags on the commands that run
scenarios, turned into ``--set`` overrides (:func:`sim.engines.flags_to_overrides`)."""
from __future__ import annotations

import click

from sim.cli.group import fail


def engine_flag_options(fn):
    """Add ``--engine-args`` (vLLM's flags) and ``--sglang-args`` (SGLang's) to a command."""
    fn = click.option("--sglang-args", metavar="FLAGS",
                      help='SGLang launch_server flags, e.g. "--max-running-requests 64 --mem-fraction-static 0.8" '
                           "(sets engine.engine = sglang)")(fn)
    return click.option("--engine-args", metavar="FLAGS",
                        help='vllm serve flags, e.g. "--max-num-seqs 64 --max-num-batched-tokens 2048 '
                             '--gpu-memory-utilization 0.9 --scheduling-policy priority" (sets engine.engine = vllm)')(fn)


def with_engine_flags(sets, engine_args: str | None, sglang_args: str | None, policy: str | None = None) -> tuple:
    """``sets`` followed by the overrides the engine flags stand for (flags first, so that an
    explicit ``--set``, or ``--policy``, wins: each that overrules a flag's value is named in a
    warning line); the flags priosim does not model are named in one warning line."""
    from plumbing.notices import warn
    from sim.engines import flags_to_overrides

    if engine_args is not None and sglang_args is not None:
        fail("--engine-args and --sglang-args: give one (vLLM's or SGLang's flags)")
    pairs = [(e, text, opt) for e, text, opt in (("vllm", engine_args, "--engine-args"),
                                                 ("sglang", sglang_args, "--sglang-args")) if text is not None]
    if not pairs:
        return tuple(sets)
    engine, text, option = pairs[0]
    try:
        overrides, unmodelled = flags_to_overrides(engine, text, option=option)
    except ValueError as exc:
        fail(str(exc))
    if unmodelled:
        warn(f"{option}: priosim does not model {', '.join(unmodelled)} (ignored; docs/engines.md lists the "
             f"flags it models)")
    mine = dict(o.split("=", 1) for o in overrides)
    later = [(k.strip(), v.strip(), f"--set {k.strip()}") for k, _, v in (x.partition("=") for x in sets)]
    if policy:
        later.append(("policy.name", f'"{policy}"', "--policy"))
    for key, value, given in later:
        if key in mine and mine[key] != value:
            warn(f"{option}: {given} = {value} overrules the flags' {key} = {mine[key]} (the engine would run "
                 f"with the flags' value)")
    return (*overrides, *sets)


def warn_priosim_only(sc) -> None:
    """With an engine named (``engine.engine``: the scenario, ``--engine-args`` or
    ``--sglang-args`` say "as this engine runs"), a warning line for each priosim-only setting
    the scenario uses: the engine itself has no such setting, so the results differ from its own
    there."""
    if sc.engine.engine is None:
        return
    from plumbing.notices import warn
    from sim.engines import priosim_only_settings

    for line in priosim_only_settings(sc):
        warn(f"{sc.source}: priosim-only beside engine.engine = {sc.engine.engine!r}: {line} ({sc.engine.engine} "
             f"has no such setting, so results differ from its own there; docs/engines.md)")
