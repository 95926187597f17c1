"""Real serving engines' own settings: the defaults an engine version applies on a GPU, and the
engine's command-line flags translated to priosim's scenario keys.

``engine.engine = "vllm" | "sglang"`` (with ``engine.engine_version``) makes every engine key the
scenario does not set take that version's default on the profile's GPU: batch limits, chunked
prefill, prefix caching, block size, how waiting requests may preempt, the overhead preset, and the
KV capacity from the engine's memory setting (``gpu_memory_utilization`` / ``mem_fraction_static``).
Keys the scenario sets win. Each engine is one module here (:mod:`sim.engines.vllm`,
:mod:`sim.engines.sglang`) registered in :data:`ENGINES`.

``--engine-args "--max-num-seqs 64 ..."`` (vLLM) and ``--sglang-args "..."`` become ``--set``
overrides (:func:`flags_to_overrides`); a flag priosim does not model is named in one warning line,
never dropped without a word.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from plumbing.registry import Registry
from sim.engines.gpu import Gpu


@dataclass(frozen=True)
class Flag:
    """One engine command-line flag: the scenario key it sets and how its text becomes a value.

    ``key`` is a dotted scenario key (``engine.max_num_seqs``); ``parse`` turns the flag's text
    into the value (None for a switch, which sets ``switch``)."""

    key: str
    parse: Callable[[str], Any] | None = None
    switch: Any = True
    #: more keys a flag sets beside ``key`` (``--scheduling-policy priority`` also lets waiting
    #: requests preempt as that engine does): value -> {key: value}
    also: Callable[[Any], dict] | None = None


@dataclass(frozen=True)
class EngineFamily:
    """A real engine: its defaults by version and GPU, and its flags.

    ``defaults(version, gpu, entrypoint, tp)`` returns engine keys (``EngineConfig`` field names)
    and their values; ``memory_key`` is the engine's memory-fraction setting that sets the KV
    capacity (:func:`sim.engines.gpu.kv_capacity_bytes`)."""

    name: str
    latest: str
    defaults: Callable[[tuple, Gpu, str, int], dict]
    memory_key: str
    flags: dict[str, Flag]
    #: flags that change nothing a simulation models (addresses, logging, names): accepted quietly
    inert: frozenset[str] = field(default_factory=frozenset)
    #: ``batching(version, chunked_prefill)``: the ``engine.batching`` the version uses with chunked
    #: prefill on or off, so that a scenario (or flag) setting ``chunked_prefill`` gets the
    #: matching batching; None: an engine whose defaults leave batching "mixed"
    batching: Callable[[tuple, bool], str] | None = None
    #: ``overhead(version, overlapped)``: the overhead preset (a name or an inline table) the version
    #: uses with its scheduler forming the next batch while the GPU runs the current one, or not
    #: (``engine.overlap_scheduling``); ValueError (one line) where that version cannot
    overhead: Callable[[tuple, bool], Any] | None = None
    #: ``verify(cfg)``: why the engine itself would refuse the resolved settings (one line), or
    #: None; vLLM checks its batch limits at start-up
    verify: Callable[[Any], str | None] | None = None


ENGINES: Registry = Registry("engine")


class NotModelled(ValueError):
    """A flag's value priosim does not model: named in the warning line, not refused."""


def version_tuple(text: str | None, latest: str) -> tuple[int, int, int]:
    """``"0.11.0"``, ``"v0.5.3.post3"``, ``"0.9"`` -> (0, 11, 0); None: ``latest``."""
    m = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text if text is not None else latest))
    if not m:
        raise ValueError(f"expected a version such as {latest} (got {text!r})")
    return tuple(int(g or 0) for g in m.groups())  # type: ignore[return-value]


def names() -> list[str]:
    """The registered engines' names (what ``engine.engine`` may be)."""
    from sim.engines import sglang, vllm  # noqa: F401  (registers them)
    return ENGINES.names()


def family(name: str) -> EngineFamily:
    """The registered engine ``name`` (KeyError with a "did you mean" otherwise)."""
    from sim.engines import sglang, vllm  # noqa: F401  (registers them)
    return ENGINES.resolve(name)


def batching(fam: EngineFamily, version: tuple, chunked_prefill: bool) -> str:
    """The ``engine.batching`` engine ``fam`` at ``version`` uses with chunked prefill on or off."""
    return fam.batching(version, chunked_prefill) if fam.batching is not None else "mixed"


def flags_to_overrides(engine: str, text: str, *, option: str = "--engine-args") -> tuple[list[str], list[str]]:
    """An engine's flags (``"--max-num-seqs 64 --enable-prefix-caching"``) as ``--set``
    overrides (``engine.engine="vllm"`` first), and the flags priosim does not model (each with
    its value). Raises ValueError (one line) for a flag's bad value or a missing value."""
    fam = family(engine)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{option}: cannot split {text!r} into flags ({exc})") from None
    out = [f'engine.engine="{fam.name}"']
    implied: list[str] = []
    unmodelled: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-"):
            raise ValueError(f"{option}: '{word}' is not a flag (expected --flag or --flag VALUE)")
        name, eq, inline = word.partition("=")
        name = name.replace("_", "-")
        takes_value = eq or (i + 1 < len(words) and not words[i + 1].startswith("--"))
        value = inline if eq else (words[i + 1] if takes_value else None)
        i += 1 if eq or not takes_value else 2
        flag = fam.flags.get(name)
        if flag is None:
            if name not in fam.inert:
                near = near_flag(name, fam)
                if near is not None:  # (a typo would run with the default, the flag meant ignored)
                    raise ValueError(f"{option}: {name}: not a {fam.name} flag priosim knows (did you mean {near}?)")
                unmodelled.append(name if value is None else f"{name} {value}")
            continue
        if flag.parse is None:
            if value is not None and not eq:  # a switch followed by a word: the word is not its value
                i -= 1
            val = flag.switch
        else:
            if value is None:
                raise ValueError(f"{option}: {name} needs a value")
            try:
                val = flag.parse(value)
            except NotModelled:
                unmodelled.append(f"{name} {value}")
                continue
            except ValueError:
                raise ValueError(f"{option}: {name}: {value!r} is not a valid value "
                                 f"(expected {getattr(flag.parse, 'expects', flag.parse.__name__)})") from None
        if val is None:
            continue  # (a value that leaves the key as it is: --kv-cache-dtype auto)
        out.append(f"{flag.key}={_toml(val)}")
        if flag.also:  # (what a flag implies comes before every flag's own key: a flag given wins)
            implied.extend(f"{k}={_toml(v)}" for k, v in flag.also(val).items())
    return out[:1] + implied + out[1:], unmodelled


def near_flag(name: str, fam: EngineFamily) -> str | None:
    """A flag of ``fam``'s that ``name`` looks like a misspelling of (a few letters off, or the
    start of it: ``--max-num-seq``), or None."""
    from plumbing.suggest import closest

    known = sorted(set(fam.flags) | set(fam.inert))
    starts = [k for k in known if k.startswith(name) and len(name) >= 6]
    if len(starts) == 1:
        return starts[0]
    return closest(name, known, cutoff=0.88)  # (stricter than a hint: a match here refuses the flag)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def choice(*names: str) -> Callable[[str], str]:
    """A parser accepting one of ``names``."""
    def parse(text: str) -> str:
        if text not in names:
            raise ValueError(text)
        return text
    parse.expects = " or ".join(names)  # type: ignore[attr-defined]
    return parse


def fraction(text: str) -> float:
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise ValueError(text)
    return v


fraction.expects = "a fraction in (0, 1]"  # type: ignore[attr-defined]


#: The engines' names of the 16-bit formats, as priosim's formats name them.
SIXTEEN_BIT = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16"}


def kv_cache_dtype(text: str) -> str | None:
    """An engine's ``--kv-cache-dtype`` as ``engine.kv_dtype``: None for ``auto`` (the model's
    own format: the profile's), ``fp8`` for every FP8 variant (one byte an element either way)."""
    t = text.lower()
    if t == "auto":
        return None
    if t.startswith("fp8"):
        return "fp8"
    if t in SIXTEEN_BIT:
        return SIXTEEN_BIT[t]
    raise ValueError(text)


kv_cache_dtype.expects = "auto, fp8 (fp8_e4m3, fp8_e5m2), bfloat16 or float16"  # type: ignore[attr-defined]


def sixteen_bit(text: str) -> None:
    """An engine's ``--dtype``: ``auto`` or a 16-bit format is what every shipped profile was
    measured or derived in (nothing to set); another one is not modelled (NotModelled)."""
    if text.lower() != "auto" and text.lower() not in SIXTEEN_BIT:
        raise NotModelled(text)
    return None


def token_count(text: str) -> int:
    """A token count as vLLM's ``--max-model-len`` takes it: an integer, or with a suffix, ``k``
    / ``m`` for thousands / millions and ``K`` / ``M`` for 1024 / 1024^2 (``32k``, ``128K``)."""
    scale = {"k": 1000, "m": 1000**2, "K": 1024, "M": 1024**2}.get(text[-1:], 1)
    v = int(float(text[:-1]) * scale) if scale != 1 else int(text)
    if v < 1:
        raise ValueError(text)
    return v


token_count.expects = "a token count >= 1, e.g. 32768, 32k or 32K"  # type: ignore[attr-defined]


def int_at_least(low: int) -> Callable[[str], int]:
    """A parser accepting an integer of at least ``low``."""
    def parse(text: str) -> int:
        v = int(text)
        if v < low:
            raise ValueError(text)
        return v
    parse.expects = f"an integer >= {low}"  # type: ignore[attr-defined]
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def resolve(cfg, base_dir, source: str):
    """``cfg`` (an ``EngineConfig``) with the keys it does not set taken from its engine's defaults
    on the profile's GPU, and its KV blocks from the engine's memory fraction; ``cfg`` itself when
    it names no engine and no memory fraction. The filled keys are remembered
    (``cfg.defaults_applied``) so that the scenario as written (``Scenario.to_dict``) leaves them
    out, and a changed profile picks its own GPU's defaults."""
    from plumbing.notices import warn
    from sim.core.errors import ScenarioError
    from sim.engines import gpu as gpus

    given = {k for k in cfg.model_fields_set if getattr(cfg, k) is not None}  # None: not set
    if cfg.engine is None and cfg.overlap_scheduling is not None:
        raise ScenarioError(f"{source}: engine.overlap_scheduling: set without engine.engine (expected engine = "
                            f"'vllm' or 'sglang', whose overhead preset it picks; or engine.overhead)")
    if cfg.engine is None and cfg.gpu_memory_utilization is None and cfg.mem_fraction_static is None:
        return cfg
    doc = gpus.document(cfg.profile, base_dir)
    gpu = gpus.load(cfg.profile, base_dir) or gpus.Gpu("", 0.0, 0.0, 0.0, 0.9, 1)
    updates: dict = {}
    memory_key = None
    if cfg.engine is not None:
        fam = family(cfg.engine)
        try:
            version = version_tuple(cfg.engine_version, fam.latest)
        except ValueError as exc:
            raise ScenarioError(f"{source}: engine.engine_version: {exc}") from None
        other = "mem_fraction_static" if fam.memory_key == "gpu_memory_utilization" else "gpu_memory_utilization"
        if getattr(cfg, other) is not None:
            raise ScenarioError(f"{source}: engine.{other}: not a setting of {fam.name} "
                                f"(expected engine.{fam.memory_key})")
        updates = {k: v for k, v in fam.defaults(version, gpu, cfg.entrypoint, gpu.tp).items() if k not in given}
        if cfg.model is not None and "max_model_len" not in given:
            # the engines' own default (vLLM --max-model-len, SGLang --context-length): the model's,
            # which the profile derived from its config.json records (sim.models.derive)
            context = (doc or {}).get("meta", {}).get("context_length")
            if context is not None:
                updates["max_model_len"] = context
        if "prefix_block_tokens" in updates and "block_size" in given and cfg.block_size > 1:
            # the engines match cached prefixes by whole blocks (vLLM) or pages (SGLang): a block
            # size set (--block-size, --page-size) is the matching granularity too
            updates["prefix_block_tokens"] = cfg.block_size
        if "batching" in updates and cfg.speculative is not None:
            updates["batching"] = "mixed"  # prefill_first is not modelled with speculative decoding
        elif "batching" in updates and fam.batching is not None and "chunked_prefill" in given:
            # chunked prefill set by the scenario (or --enable-chunked-prefill): its batching follows
            updates["batching"] = fam.batching(version, cfg.chunked_prefill)
        if cfg.overlap_scheduling is not None:
            if "overhead" in given:
                warn(f"{source}: engine.overlap_scheduling does nothing: engine.overhead is set (it prices the steps)")
            elif fam.overhead is not None:
                try:
                    updates["overhead"] = fam.overhead(version, cfg.overlap_scheduling)
                except ValueError as exc:
                    raise ScenarioError(f"{source}: engine.overlap_scheduling: {exc}") from None
        if gpus.fitted_overhead_engine(doc) == fam.name:
            # a profile fitted to this engine's own runs carries the overhead they measured
            if cfg.overlap_scheduling is not None and "overhead" not in given:  # (else told above)
                warn(f"{source}: engine.overlap_scheduling does nothing: the profile's overhead was fitted to "
                     f"{fam.name}'s own runs (it prices the steps as they ran)")
            updates.pop("overhead", None)
        memory_key = fam.memory_key
    elif cfg.gpu_memory_utilization is not None and cfg.mem_fraction_static is not None:
        raise ScenarioError(f"{source}: engine.mem_fraction_static: set with engine.gpu_memory_utilization "
                            f"(expected one: vLLM's or SGLang's)")
    else:
        memory_key = "gpu_memory_utilization" if cfg.gpu_memory_utilization is not None else "mem_fraction_static"
    if cfg.kv_blocks == 0:  # 0: derive them (from the profile, here from the memory fraction)
        fraction = getattr(cfg, memory_key) if getattr(cfg, memory_key) is not None else updates.get(memory_key)
        kv = (gpus.vllm_kv_bytes if memory_key == "gpu_memory_utilization" else gpus.sglang_kv_bytes)(gpu, fraction)
        block_size = updates.get("block_size", cfg.block_size)
        bb = _block_bytes(cfg, base_dir, block_size) if kv > 0 else 0
        if bb > 0:
            updates["kv_blocks"] = max(1, int(kv // bb))
        elif gpu.memory_bytes > 0 and gpu.weights_bytes > 0:
            raise ScenarioError(f"{source}: engine.{memory_key} = {fraction:g}: the weights "
                                f"({gpu.weights_bytes / 1e9:.1f} GB per GPU) leave no KV memory on "
                                f"{gpu.name} (expected a larger fraction or tensor-parallel degree)")
        elif getattr(cfg, memory_key) is not None:
            warn(f"{source}: engine.{memory_key} does nothing: the profile does not say its GPU's memory "
                 f"(set engine.kv_blocks instead)")
    out = cfg
    if updates:
        out = cfg.model_copy(update=updates)
        out._defaults = frozenset(updates)
    if cfg.engine is not None and fam.verify is not None:
        why = fam.verify(out)
        if why is not None:
            raise ScenarioError(f"{source}: {why}")
    return out


def _block_bytes(cfg, base_dir, block_size: int) -> float:
    from pathlib import Path

    from sim.core.costs import load_profile
    return load_profile(cfg.profile, Path(base_dir)).block_bytes(block_size)


#: Scenario keys that change how priosim's engine schedules but that neither vLLM nor SGLang has a
#: flag for (``*`` stands for a class): key -> (the values that are priosim-only, or None for any
#: value but the default), and what the knob does. docs/engines.md lists them.
PRIOSIM_ONLY = {
    "classes.*.max_prefill_tokens_per_step": (None, "caps one class's prompt tokens per step"),
    "classes.*.reserved_blocks": (None, "KV blocks only a class (or a more urgent one) may use"),
    "engine.preempt_for_waiting": (("strict", "policy"), "waiting requests preempt by class or by the policy's rank"),
    "engine.victim": (("prefix_aware",), "the cheapest victim among those the rank allows"),
    "engine.watermark": (None, "a fraction of KV blocks kept free at admission"),
    "engine.preemption": (("auto",), "swap or recompute chosen per victim"),
    "engine.running_order": (("rank",), "running requests take the budget most urgent first, not as admitted"),
}


def priosim_only(key: str, value=None) -> str | None:
    """What the priosim-only knob ``key`` does (for ``value``, when only some values are), or None
    when the key (or value) is one a real engine has: tune and capacity mark their answers with it."""
    pattern = re.sub(r"^classes\.[^.]+\.", "classes.*.", key)
    entry = PRIOSIM_ONLY.get(pattern)
    if entry is None:
        return None
    values, what = entry
    if values is not None and value is not None and value not in values:
        return None
    return what


def priosim_only_settings(sc) -> list[str]:
    """The priosim-only settings scenario ``sc`` uses (``key = value: what it does``)."""
    found = []
    for i, c in enumerate(sc.classes):
        for field in ("max_prefill_tokens_per_step", "reserved_blocks"):
            if getattr(c, field):
                found.append(f"classes.{c.name}.{field} = {getattr(c, field)}: {priosim_only('classes.*.' + field)}")
    # (the running order is named only beside an engine: without one, ranking the running requests
    # is what a priority policy means in priosim, and marking every answer with it says nothing)
    named = ("running_order",) if sc.engine.engine is not None else ()
    for field in ("preempt_for_waiting", "victim", "watermark", "preemption", *named):
        value = getattr(sc.engine, field)
        what = priosim_only(f"engine.{field}", value)
        if what and value:
            found.append(f"engine.{field} = {value!r}: {what}")
    return found
