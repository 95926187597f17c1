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


def with_engine_flags(sets, engine_args: str | None, sglang_args: str | None) -> tuple:
    """``sets`` followed by the overrides the engine flags stand for (flags first, so that an
    explicit ``--set`` wins); the flags priosim does not model are named in one warning line."""
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
    return (*overrides, *sets)
