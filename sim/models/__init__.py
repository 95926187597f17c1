"""Models as Hugging Face config.json files, and the profiles derived from them.

``engine.model = "qwen3-30b-a3b"`` (a bundled config, :mod:`sim.models.configs`) or
``engine.model = "path/to/config.json"`` with ``engine.gpu = "h200"`` (the device table,
:mod:`sim.models.devices`), ``engine.dtype``, ``engine.kv_dtype``, ``engine.tp`` and ``engine.ep``
price the scenario's replica with a profile derived when the scenario is loaded
(:mod:`sim.models.derive`, the roofline formulas of :mod:`sim.models.formulas`); the same inputs
derive it once per process (cached). ``priosim profiles --model M --gpu G`` prints it.
docs/models.md has the formulas.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from sim.core.errors import ScenarioError
from sim.models.config import Architecture, bundled, config_path, load_architecture
from sim.models.derive import derive_profile
from sim.models.devices import DEVICES

__all__ = ["Architecture", "DEVICES", "apply", "bundled", "derive_profile", "derived", "load_architecture"]


@functools.lru_cache(maxsize=64)
def _derived(path: str, stamp: tuple, model: str, base_dir: str, gpu: str, dtype, kv_dtype: str, tp: int, ep: int,
             context) -> dict:
    # (stamp: the file's mtime and size, so that an edited config.json is read again)
    a = load_architecture(model, base_dir)
    return derive_profile(a, gpu, dtype, kv_dtype, tp, ep, context)


def derived(model: str, gpu: str, dtype: str | None = None, kv_dtype: str | None = None, tp: int | None = None,
            ep: int | None = None, context: int | None = None, base_dir: Path | str = ".") -> dict:
    """The profile document derived for ``model`` on ``gpu`` (a copy: callers may change it).
    ScenarioError for a missing or bad config.json; ValueError / KeyError (one line, starting
    with the key) for a device, format or degree that does not fit."""
    p = config_path(model, base_dir)
    st = p.stat()
    doc = _derived(str(p), (st.st_mtime_ns, st.st_size), str(model), str(base_dir), str(gpu), dtype,
                   kv_dtype or "bf16", tp or 1, ep or 1, context)
    return copy.deepcopy(doc)


def _check_profile_tp(cfg, base_dir: Path, source: str) -> None:
    """``engine.tp`` beside a measured or fitted profile (``--tensor-parallel-size`` in the engine's
    flags): it must be the profile's own degree, which priced it; ScenarioError otherwise."""
    from sim.engines import gpu as gpus

    found = gpus.load(cfg.profile, base_dir)
    if found is None:
        raise ScenarioError(f"{source}: engine.tp: set with a profile that states no tensor-parallel degree "
                            f"(expected engine.model, the config.json of the model to derive a profile for)")
    if found.tp != cfg.tp:
        name = cfg.profile if isinstance(cfg.profile, str) else "the profile"
        raise ScenarioError(f"{source}: engine.tp = {cfg.tp}: {name} is measured at tensor-parallel degree "
                            f"{found.tp} (expected {found.tp}, a profile of degree {cfg.tp}, or engine.model and "
                            f"engine.gpu to derive one)")


def kv_format_document(doc: dict, kv_dtype: str) -> dict | None:
    """Measured or fitted profile ``doc`` with its KV cache in ``kv_dtype`` (a key of
    ``KV_FORMATS``): KV bytes per token and the decode step's per-context-token term scaled by the
    ratio of element sizes (fp8 on a 16-bit profile: half; decode attention reads the cache, and
    a block of it holds twice the tokens in the same memory); the prefill terms kept (attention
    over a prompt is compute, and FP8 attention's gain there is small and kernel-dependent).
    None when the format is the profile's own. ValueError (one line) for a profile that cannot
    say: no model shape, or decode steps priced from measured tables in its own format."""
    from sim.core.costs import model_shape
    from sim.models.derive import KV_FORMATS

    m, step = doc.get("model"), doc.get("step")
    if not isinstance(m, dict) or not isinstance(step, dict) or not m.get("layers"):
        raise ValueError("set with a profile that states no model shape (expected engine.model, the config.json "
                         "of the model to derive a profile for)")
    if doc.get("rows") and isinstance(doc.get("meta"), dict) and doc["meta"].get("kind") == "measured":
        raise ValueError("set with a profile whose decode steps are measured tables, in its own KV format "
                         "(expected a fitted or analytic profile, or engine.model)")
    shape = model_shape(m, doc.get("meta") or {}, "model")  # (its KV bytes as the cost model counts them)
    own = int(m.get("kv_dtype_bytes") or shape.dtype_bytes)
    new = KV_FORMATS[kv_dtype]
    if new == own:
        return None
    ratio = new / own
    out = copy.deepcopy(doc)
    out["model"]["kv_bytes_per_token"] = int(round(shape.kv_bytes_per_token * ratio))
    out["model"]["kv_dtype_bytes"] = new
    out["step"]["decode_ctx_s"] = float(step.get("decode_ctx_s", 0.0)) * ratio
    meta = out.setdefault("meta", {})
    meta["name"] = f"{meta.get('name', 'profile')}+kv-{kv_dtype}"
    meta["kv_format"] = (f"KV cache in {kv_dtype} ({new} byte(s) an element, the profile's {own}): KV bytes per "
                         f"token and decode_ctx_s x {ratio:g} (engine.kv_dtype)")
    return out


def _with_kv_format(cfg, base_dir: Path, source: str):
    """``cfg`` with its measured or fitted profile rewritten for ``engine.kv_dtype``
    (:func:`kv_format_document`); the profile as written is kept for the scenario as written."""
    from sim.engines import gpu as gpus

    doc = gpus.document(cfg.profile, base_dir)
    try:
        out_doc = kv_format_document(doc if doc is not None else {}, cfg.kv_dtype)
    except ValueError as exc:
        raise ScenarioError(f"{source}: engine.kv_dtype: {exc}") from None
    if out_doc is None:
        return cfg
    out = cfg.model_copy(update={"profile": out_doc})
    out._defaults = cfg._defaults
    out._written_profile = cfg.profile
    return out


def apply(cfg, base_dir: Path, source: str):
    """Engine settings ``cfg`` (an ``EngineConfig``) with the profile derived for its
    ``engine.model`` (``cfg`` itself when it names none); ScenarioError naming ``source``."""
    if cfg.model is None:
        if cfg.tp is not None:
            _check_profile_tp(cfg, base_dir, source)
        if cfg.kv_dtype is not None:
            return _with_kv_format(cfg, base_dir, source)
        return cfg
    try:
        doc = derived(cfg.model, cfg.gpu, cfg.dtype, cfg.kv_dtype, cfg.tp, cfg.ep, cfg.typical_context, base_dir)
    except ScenarioError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    except KeyError as exc:
        raise ScenarioError(f"{source}: engine.gpu: {exc.args[0]}") from None
    except ValueError as exc:
        msg = str(exc)
        key = msg.split(":")[0] if msg.split(":")[0] in ("tp", "ep", "dtype", "kv_dtype") else "model"
        text = msg if key != "model" else f"model: {msg}"
        raise ScenarioError(f"{source}: engine.{text}") from None
    if cfg.dtype is None:  # (the checkpoint's own format: say where it is not modelled)
        _warn_unmodelled_quant(cfg, base_dir, source)
    out = cfg.model_copy(update={"profile": doc})
    out._defaults = cfg._defaults
    return out


def _warn_unmodelled_quant(cfg, base_dir: Path, source: str) -> None:
    """One line when the model's quantization_config names a scheme priosim does not model: its
    weights are priced as bf16 (2 bytes each, BF16 compute) unless engine.dtype says otherwise."""
    from plumbing.notices import warn
    from sim.models.derive import WEIGHT_FORMATS

    what = load_architecture(cfg.model, base_dir).quant_unmodelled
    if what:
        warn(f"{source}: engine.model = {cfg.model!r}: its quantization_config ({what}) is not modelled: its weights "
             f"are priced as bf16 (expected engine.dtype, one of {', '.join(WEIGHT_FORMATS)}, for the format it "
             f"holds)")
