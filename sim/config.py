"""Scenario files (TOML): one file describes a whole experiment; validated before any work.

The schema is a tree of frozen pydantic models, documented field by field with units; the
admission, tenants, fairness and cluster tables are in :mod:`sim.tables`. Unknown keys are errors
everywhere except inside ``[policy]`` (the policy's own parameters, validated by the policy) and
``[[streams]]`` (validated by ``workloads``). Every error is reported as one line:
``<file>: <key>: <what was expected> (got <value>)`` (:func:`sim.schema.format_error`).

``--set KEY=VALUE`` overrides use dotted keys (``engine.max_num_seqs=64``, ``classes.0.priority=1``;
a list's tables also by name, ``classes.batch.priority=1``; no negative indexes);
the value is parsed as a TOML value (so ``64`` is an integer, ``"x"`` or bare ``x`` a string) and
then type-checked by the same schema.
"""
from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_serializer,
                      field_validator, model_validator)

from plumbing.documents import DocumentError, check_depth, loads_json, loads_toml, read_text, short
from plumbing.numbers import in_range
from plumbing.suggest import did_you_mean
from sim.core.errors import ScenarioError
from sim.schema import STRICT, FieldError, format_error, one_of
from sim.tables import (AdmissionConfig, ClusterConfig, FairnessConfig, TenantConfig, check_policy, check_profile,
                        check_tables, check_tenant_names)
from workloads.library import DEFAULT_SCENARIO, shipped_scenario

#: The engine keys of a derived profile (engine.model first); engine.profile is the other way.
MODEL_KEYS = ("model", "gpu", "dtype", "kv_dtype", "tp", "ep", "typical_context")


# The allowed values of engine.engine, engine.dtype and engine.kv_dtype are read where they live
# (the engines' registry, the derived profile's format tables), not listed here a second time.
def _engine_names() -> list[str]:
    from sim.engines import names
    return names()


def _weight_formats() -> list[str]:
    from sim.models.derive import WEIGHT_FORMATS
    return list(WEIGHT_FORMATS)


def _kv_formats() -> list[str]:
    from sim.models.derive import KV_FORMATS
    return list(KV_FORMATS)


NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


# Simulated times are integer nanoseconds (int64 wraps past about 9.2e9 s); 1e9 s, about 31
# years, leaves room for a drain after the horizon.
MAX_TIME_S = 1e9

class SpeculativeConfig(BaseModel):
    """Speculative decoding: a draft model proposes ``k`` tokens per decoding sequence per step;
    the target verifies all ``k + 1`` positions in one forward pass; each draft token is
    accepted with probability ``acceptance`` until the first rejection, so a step emits
    1 + (accepted drafts) tokens. Draft tokens take budget and their verification costs
    target compute; rejected ones are discarded."""

    model_config = STRICT
    k: int = Field(4, ge=1, description="draft tokens proposed per sequence per step")
    acceptance: float | dict = Field(
        0.7, description="per-token acceptance probability: a number; a table by class or tenant name; "
                         "or {dist = 'beta', a, b}: each request draws its own rate once")
    draft_cost_fraction: float = Field(
        0.1, ge=0, description="one draft token costs this fraction of a target decode step at the same batch")
    draft_profile: str | None = Field(
        None, description="price draft steps with this profile's decode step instead (name or path)")

    @model_validator(mode="after")
    def _check(self) -> "SpeculativeConfig":
        acc = self.acceptance
        if isinstance(acc, dict) and "dist" in acc:
            if acc.get("dist") != "beta" or set(acc) != {"dist", "a", "b"}:
                raise ValueError("engine.speculative.acceptance: a distribution is {dist = 'beta', a, b} "
                                 f"(got {acc!r})")
            for key in ("a", "b"):
                v = acc[key]
                if not in_range(v, gt=0):
                    raise ValueError(f"engine.speculative.acceptance.{key}: must be a number > 0 (got {v!r})")
            return self
        vals = acc.values() if isinstance(acc, dict) else [acc]
        for v in vals:
            if not in_range(v, ge=0.0, le=1.0):
                raise ValueError(f"engine.speculative.acceptance: must be in [0, 1] (got {v!r})")
        return self


class EngineConfig(BaseModel):
    """The replica: batching limits, KV memory, preemption. Units in each field's description."""

    model_config = STRICT
    profile: str | dict = Field(
        "h200-llama-3-8b",
        description="shipped profile name, path to a profile JSON, or an inline "
                    "{kind='linear', base_s, prefill_token_s, decode_token_s, context_token_s, swap_block_s}")
    overhead: str | dict | None = Field(
        None, description="engine overhead on top of the profile's step times: a preset name (priosim profiles "
                          "lists them; 'none' = the profile alone) or a table of terms (sim/core/overhead.py); "
                          "absent: the profile's declared preset")
    host_cpu: float = Field(
        1.0, gt=0, description="how slow the engine's host CPU is relative to the hosts the overhead presets were "
                               "fitted on (a factor; > 1: slower): multiplies the overhead's CPU terms (per step, "
                               "per sequence, per admitted request, front end), not GPU kernels or all-reduces "
                               "(docs/fidelity.md: estimating it from a run)")
    cost_scale: float = Field(
        1.0, gt=0, description="multiplies every time the cost model prices (step times and the overhead's terms, "
                               "front end included; not KV swaps): --uncertainty runs a scenario at the factors of "
                               "its cost model's error (docs/uncertainty.md); 1.0 prices exactly as without it")
    max_num_seqs: int = Field(256, ge=1, description="max requests in the running batch")
    max_batched_tokens: int = Field(8192, ge=1, description="token budget per step")
    max_model_len: int | None = Field(
        None, ge=1, description="the longest request, prompt + max_tokens tokens, the server accepts; a longer one is "
                                "refused at its arrival (reason too_long), as vLLM's --max-model-len and SGLang's "
                                "--context-length answer (absent: with engine.engine and engine.model, the model's "
                                "context length, as the engines default to it; else no such limit)")
    max_prefill_chunk: int = Field(0, ge=0, description="max prompt tokens per request per step (0: no cap)")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    kv_blocks: int = Field(0, ge=0, description="device KV blocks; 0 derives them from the profile's memory")
    swap_blocks: int = Field(0, ge=0, description="host swap space in blocks; 0 = none")
    swap_overlap: bool = Field(False, description="KV swap transfers run beside the step's compute (FastServe's "
                                                  "proactive swapping): a step takes max(compute, transfer) "
                                                  "instead of their sum")
    preemption: str = Field(
        "recompute", description="how a victim gives up its KV blocks: off (admits only what fits to max_tokens), "
                                 "recompute, swap, auto, or a dotted path to a PreemptionMode class "
                                 "(sim.core.preemption.PREEMPTION_MODES)")
    preempt_for_waiting: str = Field(
        "strict", description="may a waiting request preempt running ones: never (vLLM V1), priority "
                              "(vLLM V0), strict (strictly more urgent class), threshold (SGLang), "
                              "policy (any request the policy ranks strictly below it: FastServe-style), "
                              "or a dotted path to a WaitingRule class (sim.core.preemption.WAITING_RULES)")
    preempt_threshold: int = Field(0, ge=0, description="priority gap that must be exceeded in 'threshold' mode")
    victim: str = Field(
        "rank", description="which running request a preemption takes: rank (the lowest-ranked, vLLM), "
                            "prefix_aware (among those the rank rules allow, the cheapest: its own recompute or "
                            "swap plus the re-prefill it would push onto waiting requests reusing its prefix), "
                            "sglang (SGLang's retraction: the fewest output tokens, then the longest prompt, then "
                            "the latest admitted; the victim waits again behind every waiter), or a dotted path to "
                            "a VictimRule class (sim.core.preemption.VICTIM_RULES)")
    admission_estimate: Literal["prompt", "sglang"] = Field(
        "prompt", description="what a waiting request must find free in KV blocks to be admitted: prompt (the "
                              "blocks of this step's prompt tokens, vLLM) or sglang (SGLang's reserve: its prompt "
                              "plus min(max_tokens, 4096) must be fewer than the free blocks less min(max_tokens "
                              "left, 4096) x a ratio for every running request, the ratio 0.7 at start, decaying "
                              "to 0.098 over 600 decode steps and reset by a retraction; once a waiter does not "
                              "fit, none is tried until a running request leaves; docs/engines.md)")
    running_order: Literal["rank", "admission"] = Field(
        "rank", description="the order a step gives running requests their tokens: rank (the policy's, most urgent "
                            "first) or admission (the earliest admitted first, vLLM V1's running list: under "
                            "--scheduling-policy priority an urgent request's prefill chunks wait behind those of "
                            "requests admitted before it)")
    watermark: float = Field(0.0, ge=0.0, lt=1.0, description="fraction of blocks kept free at admission")
    chunked_prefill: bool = Field(True, description="split long prompts across steps")
    batching: Literal["mixed", "prefill_first"] = Field(
        "mixed", description="what one step holds: mixed (decodes and prompt chunks together, vLLM V1 and "
                             "chunked prefill, SGLang --enable-mixed-chunk) or prefill_first (a step that can take "
                             "prefill work holds prefills only and the decoders wait a step: vLLM V0 without "
                             "chunked prefill, SGLang's default); docs/engine-step.md")
    fast_forward: bool = Field(True, description="advance quiet decode stretches in one event (exact)")
    lazy_batch: bool = Field(True, description="advance steady decoders as one lazily-updated cohort (exact; "
                                               "false updates every request every step)")
    timeseries_interval_s: float = Field(
        1.0, ge=1e-9, le=MAX_TIME_S, description="time-series sampling interval, s (1 ns to 1e9 s; raised to "
                                                 "horizon_s / 200,000 when it would take more samples)")
    thrash_threshold: float = Field(0.2, ge=0, le=1, description="thrash ratio above which 'thrashing' is flagged")
    max_events: int = Field(0, ge=0, description="safety stop after this many engine events (0: none)")
    prefix_caching: bool = Field(False, description="share cached prompt-prefix blocks between requests (hash_ids)")
    prefix_block_tokens: int = Field(512, ge=1, description="tokens per prefix hash id (Mooncake: 512); a multiple of block_size")
    speculative: SpeculativeConfig | None = Field(None, description="speculative decoding (off when absent)")
    engine: Annotated[str, one_of(_engine_names)] | None = Field(
        None, description="the real engine modelled: its version's defaults on the profile's GPU fill every "
                          "engine key not set here (docs/engines.md); absent: priosim's own defaults")
    engine_version: str | None = Field(None, description="the engine's release, e.g. '0.11.0' (absent: vLLM "
                                                         "0.11.0, SGLang 0.5.5, the releases the presets are "
                                                         "fitted on)")
    entrypoint: Literal["server", "offline"] = Field(
        "server", description="how the engine is run, where its defaults differ: 'server' (vllm serve, "
                              "sglang.launch_server) or 'offline' (vLLM's LLM class)")
    overlap_scheduling: bool | None = Field(
        None, description="with engine.engine: the scheduler forms the next batch while the GPU runs the current "
                          "one (vLLM --async-scheduling, the default from 0.14; SGLang's overlap scheduler, the "
                          "default from 0.4, off with --disable-overlap-schedule): picks the version's overhead "
                          "preset that prices it (absent: the version's default)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM's share of GPU memory for weights, activations and KV cache; sets "
                                      "kv_blocks from the profile's GPU memory (absent: the profile's KV memory)")
    mem_fraction_static: float | None = Field(
        None, gt=0, le=1, description="SGLang's share of GPU memory for weights and the KV pool; sets kv_blocks")
    model: str | None = Field(
        None, description="the model as a Hugging Face config.json: a bundled name (priosim profiles --models "
                          "lists them) or a path to a config.json (relative to the scenario's folder); its profile "
                          "is derived for engine.gpu (docs/models.md); not with engine.profile")
    gpu: str | None = Field(None, description="the GPU of a derived profile (with engine.model): a key of the "
                                              "device table, e.g. 'h200', 'h100-sxm', 'mi300x'")
    dtype: Annotated[str, one_of(_weight_formats)] | None = Field(
        None, description="weight format of a derived profile (absent: the checkpoint's own: its "
                          "quantization_config, else bf16)")
    kv_dtype: Annotated[str, one_of(_kv_formats)] | None = Field(
        None, description="KV cache format, 2 or 1 bytes per element: of a derived profile (absent: bf16); beside "
                          "a measured or fitted one, its KV bytes per token and decode context term scaled from "
                          "its own format's (fp8 on a 16-bit profile: half; vLLM --kv-cache-dtype fp8)")
    tp: int | None = Field(None, ge=1, description="tensor-parallel degree of a derived profile: GPUs per replica "
                                                   "(absent: 1); beside a measured profile, its own degree only")
    ep: int | None = Field(None, ge=1, description="expert-parallel degree of a derived profile (a divisor of tp; "
                                                   "experts split over that many GPUs; absent: 1)")
    typical_context: int | None = Field(
        None, ge=1, description="tokens of context at which a sliding-window model's windowed layers' KV is "
                                "averaged into KV bytes per token, for the per-token KV pool (absent: 4096)")
    # engine keys filled from `engine`'s defaults (sim.engines.resolve), left out of the scenario as written
    _defaults: frozenset = PrivateAttr(default_factory=frozenset)
    # the profile as written where engine.kv_dtype rewrote a measured one (sim.models.apply)
    _written_profile: Any = PrivateAttr(default=None)

    @field_validator("preemption", "preempt_for_waiting", "victim", mode="after")
    @classmethod
    def _registered(cls, value: str, info) -> str:
        # the allowed values are the registries' names (and users' classes by dotted path)
        from sim.core.preemption import (PREEMPTION_MODES, VICTIM_RULES, WAITING_RULES, PreemptionMode, VictimRule,
                                         WaitingRule)

        registry, base = {"preemption": (PREEMPTION_MODES, PreemptionMode),
                          "victim": (VICTIM_RULES, VictimRule)}.get(info.field_name, (WAITING_RULES, WaitingRule))
        try:
            target = registry.resolve(value)
        except KeyError as exc:
            raise FieldError(str(exc.args[0])) from None
        if not (isinstance(target, type) and issubclass(target, base)):
            raise FieldError(f"expected a {base.__module__}.{base.__name__} subclass (got {value!r})")
        return value

    @model_validator(mode="after")
    def _batching_alone(self) -> "EngineConfig":
        # a speculative step verifies drafts of every decoder: a prefill-only step has none to verify
        if self.batching == "prefill_first" and self.speculative is not None:
            raise ValueError("engine.batching: 'prefill_first' is not modelled with engine.speculative (expected "
                             "batching = 'mixed', or no [engine.speculative])")
        return self

    @model_validator(mode="after")
    def _model_keys(self) -> "EngineConfig":
        if self.model is None:
            for key in MODEL_KEYS[1:]:
                # (tp and kv_dtype may stand beside a measured profile: sim.models.apply)
                if key not in ("tp", "kv_dtype") and getattr(self, key) is not None:
                    raise ValueError(f"engine.{key}: set without engine.model (expected engine.model, the "
                                     f"config.json of the model to derive a profile for)")
            return self
        if "profile" in self.model_fields_set:
            raise ValueError(f"engine.profile: set with engine.model = {self.model!r} (expected one: a measured or "
                             f"user profile, or a model whose profile is derived)")
        if self.gpu is None:
            raise ValueError(f"engine.gpu: required with engine.model = {self.model!r} (expected a device, e.g. "
                             f"'h200'; priosim profiles --models lists them)")
        return self

    @property
    def defaults_applied(self) -> dict:
        """The engine keys taken from ``engine``'s defaults, with their values."""
        return {k: getattr(self, k) for k in sorted(self._defaults)}

    def as_written(self, mode: str = "python") -> dict:
        """The settings as the scenario gives them, without the engine's defaults (nor a derived
        profile, nor the model keys when there is no model, nor cost_scale at 1.0: a scenario
        written without them reads back the same, byte for byte)."""
        skip = set(self._defaults) | ({"profile"} if self.model is not None else
                                      {k for k in MODEL_KEYS if getattr(self, k) is None})
        out = {k: v for k, v in self.model_dump(mode=mode).items()
               if k not in skip and not (k == "cost_scale" and v == 1.0) and not (k == "batching" and v == "mixed")
               and not (k == "admission_estimate" and v == "prompt")}
        if self._written_profile is not None:
            out["profile"] = self._written_profile
        return out


class ClassConfig(BaseModel):
    """A priority class. ``priority`` 0 is most urgent."""

    model_config = STRICT
    name: str = Field(description="the class name streams, traces and --set (classes.NAME.key) use")
    priority: int = Field(ge=0, description="0 is most urgent; larger numbers are served later by priority-aware policies")
    ttft_slo_s: float | None = Field(None, gt=0, description="time-to-first-token SLO, s")
    tpot_slo_s: float | None = Field(None, gt=0, description="time-per-output-token SLO, s")
    reserved_blocks: int = Field(0, ge=0, description="KV blocks only this or a more urgent class may use")
    speculate: bool = Field(True, description="this class's decoders draft tokens when engine.speculative is on")
    max_prefill_tokens_per_step: int = Field(
        0, ge=0, description="cap on this class's prompt (and re-prefill) tokens in one step, 0: none; "
                             "keeps e.g. batch prefill from stretching other classes' decode steps (without chunked "
                             "prefill a longer prompt goes alone, one per step)")


class PolicyConfig(BaseModel):
    """``name`` plus the policy's own parameters (validated by the policy)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field("fcfs", description="a registered policy (priosim policies), module:Class or file.py:Class; "
                                          "the table's other keys are the policy's parameters")

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Scenario(BaseModel):
    """A whole experiment."""

    model_config = STRICT
    name: str = Field("scenario", description="the run's name: its results folder is <name>-<timestamp> "
                                                "(letters, digits, '.', '_', '-'; not starting with '.')")
    seed: int = Field(0, ge=0, description="random seed (an integer >= 0)")
    horizon_s: float = Field(60.0, gt=0, le=MAX_TIME_S, description="arrivals stop here, s (at most 1e9 s: "
                             "times are integer nanoseconds)")
    drain: bool = Field(True, description="run until every admitted request ends; false: stop at horizon")
    engine: EngineConfig = Field(EngineConfig(), description="the replica: batching limits, KV memory, preemption")
    policy: PolicyConfig = Field(PolicyConfig(), description="the scheduling policy that ranks requests")
    classes: list[ClassConfig] = Field(min_length=1, description="the priority classes, with their SLOs")
    streams: list[dict] = Field(min_length=1, description="the traffic: arrival process and lengths, or a trace")
    tenants: list[TenantConfig] = Field(default_factory=list, description="tenants' shares and limits")
    admission: AdmissionConfig = Field(AdmissionConfig(), description="the admission gate")
    fairness: FairnessConfig = Field(FairnessConfig(), description="the fairness accountant")
    cluster: ClusterConfig | None = Field(None, description="several replicas behind a router (absent: one)")
    # what `priosim tune` searches (docs/tune.md); not part of a run, so not in scenario.json
    tune: dict = Field(default_factory=dict, exclude=True, description="the search space of priosim tune")
    # where the scenario came from (for relative paths and messages); not part of the schema
    source: str = Field("<inline>", exclude=True)
    base_dir: str = Field(".", exclude=True)

    @field_validator("cluster", mode="before")
    @classmethod
    def _empty_cluster(cls, v: Any) -> Any:
        return None if v == {} else v  # an empty [cluster] table: one replica, as without one

    @field_validator("tenants", mode="after")
    @classmethod
    def _tenant_names(cls, v: list[TenantConfig]) -> list[TenantConfig]:
        return check_tenant_names(v)

    @model_validator(mode="after")
    def _classes_consistent(self) -> "Scenario":
        if not NAME_RE.fullmatch(self.name):
            raise ValueError(f"name: must be a non-empty name of letters, digits, '.', '_' or '-', not "
                             f"starting with '.' (it names the results folder) (got {self.name!r})")
        names = [c.name for c in self.classes]
        for i, s in enumerate(self.streams):  # a misspelt class is the stream's error, first
            if isinstance(s.get("class"), str) and s["class"] not in names:
                raise ValueError(f"streams[{i}].class: must be one of the [[classes]] names "
                                 f"({', '.join(sorted(names))}) (got {s['class']!r})")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"classes: duplicate class name '{sorted(dup)[0]}'")
        named = {s.get("class") for s in self.streams}
        for s in self.streams:  # trace streams may assign classes per row
            for rule in s.get("assign", []) or []:
                if isinstance(rule, dict) and "class" in rule:
                    named.add(rule["class"])
        # a trace's tenant / class column names them row by row (checked when the rows are read)
        mapped = {k for s in self.streams if isinstance(s, dict) and isinstance(s.get("trace"), dict)
                  and isinstance(s["trace"].get("columns"), dict) for k in ("tenant", "class")
                  if k in s["trace"]["columns"]}
        spec = self.engine.speculative
        if (spec is not None and isinstance(spec.acceptance, dict) and "dist" not in spec.acceptance
                and "tenant" not in mapped):
            tenants = {s.get("tenant") for s in self.streams}
            for s in self.streams:
                tenants.update(r.get("tenant") for r in s.get("assign", []) or [] if isinstance(r, dict))
            for key in spec.acceptance:
                if key not in names and key not in tenants:
                    known = sorted(set(names) | {t for t in tenants if isinstance(t, str)})
                    raise ValueError(f"engine.speculative.acceptance.{key}: names no class or tenant "
                                     f"(expected one of {', '.join(known)})")
        for c in names:
            if c not in named and "class" not in mapped:
                raise ValueError(f"classes: class '{c}' is named by no stream "
                                 f"(expected every class to appear as some [[streams]] class)")
        return self

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    @property
    def fair_accounting(self) -> bool:
        """Whether the fairness accountant wraps the policy: the scenario has tenants or fairness."""
        return bool(self.tenants) or bool(self.fairness)

    @property
    def admission_tables(self) -> bool:
        """Whether the scenario writes an admission, tenants or fairness table (a gate may apply)."""
        return bool(self.admission) or self.fair_accounting

    @field_serializer("cluster")
    def _cluster_as_written(self, v: ClusterConfig | None) -> Any:
        return {} if not v else v

    def to_dict(self, where: bool = False) -> dict:
        """The scenario as written (JSON types). ``where``: with the folder its relative paths are
        read from (:data:`BASE_DIR_KEY`, absolute), as a run's scenario.json records it so that
        ``priosim run scenario.json`` reads the same profile, model and traces from anywhere."""
        d = self.model_dump(mode="json")
        d["engine"] = self.engine.as_written(mode="json")
        if where:
            d[BASE_DIR_KEY] = str(Path(self.base_dir).resolve())
        return d


def parse_value(text: str) -> Any:
    """Parse an override value as TOML (``64`` -> int, ``true`` -> bool, ``x`` -> 'x'). Text that
    parses to more than one key (``'"x"\\nseed=5'``) is refused, not cut to its first value."""
    try:
        table = loads_toml(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    except DocumentError as exc:
        raise ScenarioError(f"value {short(text)}: {exc}") from None
    if set(table) != {"v"}:
        extra = ", ".join(sorted(k for k in table if k != "v"))
        raise ScenarioError(f"value {text!r} holds more keys than one value ({extra}) "
                            f"(expected one value; give each key its own --set)")
    return table["v"]


#: Keys that say where the scenario came from, set by the loader: not scenario keys, so an
#: override of one would do nothing (refused rather than ignored).
LOADER_KEYS = ("source", "base_dir")


def _list_item(node: list, part: str, dotted: str, where: str, source: str) -> int:
    """The index in ``node`` that ``part`` names: a non-negative index, or the name of one of
    its tables (``classes.batch`` is the class named batch)."""
    if re.fullmatch(r"[0-9]+", part):
        if len(part) < 10 and int(part) < len(node):  # (len: no 10,000-digit int() to make)
            return int(part)
    elif re.fullmatch(r"-[0-9]+", part):
        raise ScenarioError(f"{source}: --set {dotted}: '{part}' is a negative index of {where} "
                            f"(expected an index 0..{len(node) - 1} or an item's name)")
    else:
        named = [i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == part]
        if len(named) == 1:
            return named[0]
    names = [item["name"] for item in node if isinstance(item, dict) and isinstance(item.get("name"), str)]
    known = f"; names: {', '.join(names)}" if names else ""
    raise ScenarioError(f"{source}: --set {dotted}: '{part}' is not an index or a name of "
                        f"{where} (has {len(node)} items{known}){did_you_mean(part, names)}")


def apply_override(data: dict, dotted: str, value: Any, source: str) -> None:
    """Set ``data[a][b]...= value`` for ``dotted = 'a.b...'``; list items by index (0, 1, ...;
    not negative) or by the ``name`` of a table in the list (``classes.batch.priority``)."""
    parts = dotted.split(".")
    if parts[0] in LOADER_KEYS:
        raise ScenarioError(f"{source}: --set {dotted}: '{parts[0]}' is set by the loader (where the scenario "
                            f"file is), not a scenario key (expected a key of the scenario file)")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[_list_item(node, part, dotted, '.'.join(parts[:i]) or 'the scenario', source)]
            continue
        if not isinstance(node, dict):
            raise ScenarioError(f"{source}: --set {dotted}: '{'.'.join(parts[:i])}' is not a table")
        node = node.setdefault(part, {})
    last = parts[-1]
    if not isinstance(node, (dict, list)):
        raise ScenarioError(f"{source}: --set {dotted}: '{'.'.join(parts[:-1])}' is not a table "
                            f"(it is {node!r})")
    if isinstance(node, list):
        node[_list_item(node, last, dotted, '.'.join(parts[:-1]), source)] = value
    else:
        node[last] = value


def scenario_from_dict(data: dict, source: str = "<inline>", base_dir: Path | str = ".",
                       overrides: list[str] | None = None) -> Scenario:
    data = copy.deepcopy(data)
    _override_profile_source(data, overrides or [])
    for item in overrides or []:
        if "=" not in item:
            raise ScenarioError(f"{source}: --set '{item}': expected KEY=VALUE")
        key, _, text = item.partition("=")
        try:
            value = parse_value(text.strip())
        except ScenarioError as exc:
            raise ScenarioError(f"{source}: --set {key.strip()}: {exc}") from None
        apply_override(data, key.strip(), value, source)
    try:  # (deeper tables, by a file or by dotted keys, would exhaust the stack of what reads them)
        check_depth(data)
    except DocumentError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    data["source"] = str(source)
    data["base_dir"] = str(base_dir)
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_error(source, err, model=Scenario)) from None
    sc = _with_engine_defaults(sc)
    specs = _validate_parts(sc)
    _warn_suspicious(sc)
    _warn_quiet_streams(sc, specs)
    return sc


def _override_profile_source(data: dict, overrides: list[str]) -> None:
    """An override of the profile's source replaces the file's: ``--set engine.model=M`` drops the
    file's ``engine.profile``, ``--set engine.profile=P`` the file's model keys (the file cannot
    set both; --set wins over the file)."""
    eng = data.get("engine")
    if not isinstance(eng, dict):
        return
    keys = {item.partition("=")[0].strip() for item in overrides}
    if "engine.model" in keys and "engine.profile" not in keys:
        eng.pop("profile", None)
    elif "engine.profile" in keys and "engine.model" not in keys:
        for k in MODEL_KEYS:
            eng.pop(k, None)


def _with_engine_defaults(sc: Scenario) -> Scenario:
    """``sc`` with its model's derived profile (:func:`sim.models.apply`) and its engine's defaults
    filled in (:func:`sim.engines.resolve`)."""
    from sim.engines import resolve
    from sim.models import apply

    eng = resolve(apply(sc.engine, Path(sc.base_dir), sc.source), Path(sc.base_dir), sc.source)
    return sc if eng is sc.engine else sc.model_copy(update={"engine": eng})


def with_cluster(sc: Scenario, cluster: dict) -> Scenario:
    """``sc`` with the ``[cluster]`` table ``cluster``, validated as if the scenario file had it."""
    try:
        table = ClusterConfig.model_validate(cluster)
    except ValidationError as err:
        raise ScenarioError(format_error(sc.source, err, prefix="cluster", model=ClusterConfig)) from None
    out = sc.model_copy(update={"cluster": table})
    check_tables(out)
    return out


def _validate_parts(sc: Scenario) -> list:
    """Validate the pieces owned by other packages (streams, profile, policy) and the tables
    against the rest of the scenario (:func:`sim.tables.check_tables`); returns the checked
    streams (``workloads.streams.StreamSpec``)."""
    import workloads

    try:
        specs = workloads.validate_streams(sc.streams, set(sc.class_names), Path(sc.base_dir), horizon_s=sc.horizon_s)
    except workloads.WorkloadError as exc:
        raise ScenarioError(f"{sc.source}: {exc}") from None
    check_profile(sc, sc.engine)
    check_policy(sc, sc.policy, "policy")
    check_tables(sc)
    return specs


def _warn_quiet_streams(sc: Scenario, specs: list) -> None:
    """Warn (one line each) about a stream that sends nothing before the horizon, where arrivals
    stop (:func:`workloads.streams.quiet_stream`): it starts too late, its batch drops too late
    (a time in milliseconds), or its rate expects less than one request."""
    from plumbing.notices import warn
    from workloads.streams import quiet_stream

    for st in specs:
        found = quiet_stream(st, sc.horizon_s)
        if found is not None:
            key, why = found
            warn(f"{sc.source}: streams[{st.index}].{key} (tenant {st.tenant}, class {st.cls}) {why}")


#: A class SLO above this many seconds looks like milliseconds (``ttft_slo_s = 500`` meant as
#: 500 ms): no chat or batch deployment waits a minute for a first token. Warned, not refused:
#: a long-document class may mean it.
TTFT_SLO_MS_S = 60.0
#: A time-per-output-token SLO above this many seconds looks like milliseconds (``tpot_slo_s =
#: 50``): one token a second is already slower than any serving target (typically 0.02-0.2 s).
TPOT_SLO_MS_S = 1.0


def _warn_suspicious(sc: Scenario) -> None:
    """Warn (one line each, :mod:`plumbing.notices`) about valid settings that are likely mistakes:
    swap preemption with no host swap space (every preemption then recomputes), settings that do
    nothing beside the rest (:func:`_warn_inert`) and SLOs that look like milliseconds. Nothing
    about the run changes."""
    from plumbing.notices import warn
    from sim.tables import group_engine

    # (the engines the replicas run; a group's is named only where it changes the preemption or
    # the swap space: one line per setting, not one more per group that inherits it)
    groups = sc.cluster.group_list() if sc.cluster and sc.cluster.groups else []
    group_engines = [group_engine(sc, g) for _, g in groups]
    engines: dict[str, tuple] = {"engine": (sc.engine, [])} if not groups else {}
    decode = {name for name, g in groups if g.role == "decode"}
    for i, ((name, g), eng) in enumerate(zip(groups, group_engines)):
        same = (eng.preemption, eng.swap_blocks) == (sc.engine.preemption, sc.engine.swap_blocks)
        engines.setdefault("engine" if same else f"cluster.groups.{i}.engine", (eng, []))[1].append(name)
    from sim.core.preemption import PREEMPTION_MODES

    for key, (eng, names) in engines.items():
        # ([engine] run by some of the groups only: which)
        on = f" on group {', '.join(names)}" if key == "engine" and len(names) < len(groups) else ""
        host = PREEMPTION_MODES.resolve(eng.preemption).host_space
        if host and eng.swap_blocks == 0:
            # (a decode group's mode still acts: under swap a waiting request evicts nobody)
            still = (f"; on decode group {', '.join(n for n in names if n in decode)} a request waiting for "
                     f"room still evicts nobody, as under swap" if decode.intersection(names) else "")
            warn(f"{sc.source}: {key}.preemption = {eng.preemption!r} but there is no host swap space "
                 f"({key}.swap_blocks = 0): preemptions will recompute{on}{still} (set {key}.swap_blocks to the "
                 f"host blocks)")
        elif not host and eng.swap_blocks > 0:
            warn(f"{sc.source}: {key}.swap_blocks = {eng.swap_blocks} does nothing{on}: {key}.preemption = "
                 f"{eng.preemption!r} never copies to host memory (expected preemption = "
                 f"{_swapping_modes()} to use it, or no swap_blocks)")
    for msg in _inert_settings(sc, groups, group_engines):
        warn(msg)
    for i, c in enumerate(sc.classes):
        for field in ("ttft_slo_s", "tpot_slo_s"):
            why = slo_looks_like_ms(field, getattr(c, field))
            if why:
                warn(f"{sc.source}: classes.{i}.{field} = {getattr(c, field):g} ({c.name}) {why}")


def slo_looks_like_ms(field: str, v: float | None) -> str | None:
    """Why an SLO of ``v`` seconds looks like milliseconds (``field``: ``ttft_slo_s`` /
    ``ttft`` or ``tpot_slo_s`` / ``tpot``), or None: the words after the key and value in a
    warning (the scenario's keys and ``--slo`` share them)."""
    limit = TTFT_SLO_MS_S if field.startswith("ttft") else TPOT_SLO_MS_S
    if v is None or not v > limit:
        return None
    return f"looks like milliseconds (more than {limit:g} s; the unit is seconds: {v / 1000:g} for {v:g} ms)"


def _swapping_modes() -> str:
    """The preemption modes that copy KV blocks to host memory, for a message ('swap' or 'auto')."""
    from sim.core.preemption import PREEMPTION_MODES

    return " or ".join(repr(m) for m in PREEMPTION_MODES.names() if PREEMPTION_MODES.resolve(m).host_space)


def _written(cfg: BaseModel, field: str) -> bool:
    """Whether the scenario itself sets ``cfg.field`` to other than the schema's default: not a
    named engine's defaults (``EngineConfig._defaults``: SGLang's set ``preempt_threshold``), and
    not a default value written out (a run's scenario.json lists every key)."""
    if field not in cfg.model_fields_set or field in getattr(cfg, "_defaults", ()):
        return False
    return getattr(cfg, field) != type(cfg).model_fields[field].default


def _inert_settings(sc: Scenario, groups: list, group_engines: list[EngineConfig]) -> list[str]:
    """One line for each setting the scenario writes that does nothing beside the rest (the run is
    the same with or without it), in the order found, each once: engine keys another key makes
    unused (:func:`_inert_engine_keys`, [engine] and each group's own engine table), per-class
    speculation without speculative decoding or with every class opted out, and a policy that
    ranks by cached prefix without a prefix cache. ``group_engines``: each group's engine."""
    from sim.tables import group_policy

    found: list[str] = []
    if not groups:
        found += _inert_engine_keys(sc, "engine", sc.engine, lambda k: _written(sc.engine, k))
        found += _prefix_policy(sc, "policy", sc.policy, "engine", sc.engine)
    for i, ((_, g), eng) in enumerate(zip(groups, group_engines)):
        # (a key the group's own table sets is named as the group's; one it inherits, as [engine]'s)
        own = {k for k in g.engine if _written(eng, k)} if g.engine else set()
        found += _inert_engine_keys(sc, "engine", eng, lambda k, own=own: k not in own and _written(sc.engine, k))
        found += _inert_engine_keys(sc, f"cluster.groups.{i}.engine", eng, own.__contains__)
        pol_key = "policy" if g.policy is None else f"cluster.groups.{i}.policy"
        eng_key = f"cluster.groups.{i}.engine" if g.engine else "engine"
        found += _prefix_policy(sc, pol_key, group_policy(sc, g), eng_key, eng)
    found += _inert_speculation(sc, group_engines or [sc.engine])
    found += _prefix_cache_without_prefixes(sc, [("engine", sc.engine)] if not groups else [
        (f"cluster.groups.{i}.engine" if g.engine and _written(eng, "prefix_caching") else "engine", eng)
        for i, ((_, g), eng) in enumerate(zip(groups, group_engines))])
    return list(dict.fromkeys(found))


#: trace formats whose rows never carry prefix-block hashes (``hash_ids``); csv and jsonl carry
#: them only through ``columns.hash_ids``, and a format of the user's own may (not warned)
NO_HASH_FORMATS = ("azure", "servegen", "sharegpt")


def _prefix_cache_without_prefixes(sc: Scenario, engines: list[tuple[str, EngineConfig]]) -> list[str]:
    """Prefix caching the scenario turns on (``engines``: (key, engine) of [engine] or each group)
    where no stream can share a prefix: none declares ``prefix = {...}`` and every trace's format
    carries no ``hash_ids``. priosim shares blocks by those hashes alone, so no request ever hits
    the cache (a named engine's own default, e.g. vLLM V1's, is not warned)."""
    def hashless(s: dict) -> bool:
        if not isinstance(s, dict) or "prefix" in s:
            return False
        trace = s.get("trace")
        if trace is None:
            return True
        fmt = trace.get("format") if isinstance(trace, dict) else None
        if fmt in ("csv", "jsonl"):
            cols = trace.get("columns")
            return not (isinstance(cols, dict) and "hash_ids" in cols)
        return fmt in NO_HASH_FORMATS

    if not all(hashless(s) for s in sc.streams):
        return []
    return [f"{sc.source}: {key}.prefix_caching = true does nothing: no stream shares a prompt prefix (priosim shares "
            f"cached blocks by prefix hashes: expected a stream's prefix = {{...}}, a trace's columns.hash_ids or a "
            f"mooncake trace to use it, or no prefix_caching)"
            for key, eng in engines if eng.prefix_caching and _written(eng, "prefix_caching")]


def _inert_engine_keys(sc: Scenario, key: str, eng: EngineConfig, written) -> list[str]:
    """The engine keys ``eng`` sets (``written(field)``) that another of its keys leaves unused:
    ``preempt_threshold`` beside a waiting rule that does not read it, ``prefix_block_tokens``
    without prefix caching, ``swap_overlap`` with a preemption mode that never swaps and
    ``typical_context`` for a model without sliding-window layers. ``key`` names the table."""
    from sim.core.preemption import PREEMPTION_MODES, WAITING_RULES

    src, out = sc.source, []
    # (a user's own rule, by dotted path, may read the threshold: only the registered ones are known)
    if (written("preempt_threshold") and eng.preempt_for_waiting != "threshold"
            and eng.preempt_for_waiting in WAITING_RULES.names()):
        out.append(f"{src}: {key}.preempt_threshold = {eng.preempt_threshold} does nothing: {key}.preempt_for_waiting "
                   f"= {eng.preempt_for_waiting!r} does not read it (expected preempt_for_waiting = 'threshold' to use "
                   f"it, or no preempt_threshold)")
    if written("prefix_block_tokens") and not eng.prefix_caching:
        out.append(f"{src}: {key}.prefix_block_tokens = {eng.prefix_block_tokens} does nothing: {key}.prefix_caching "
                   f"is off (expected prefix_caching = true to use it, or no prefix_block_tokens)")
    if written("swap_overlap") and not PREEMPTION_MODES.resolve(eng.preemption).host_space:
        out.append(f"{src}: {key}.swap_overlap = true does nothing: {key}.preemption = {eng.preemption!r} never "
                   f"swaps (expected preemption = {_swapping_modes()} to use it, or no swap_overlap)")
    if written("typical_context") and eng.model is not None and not _has_windows(eng.model, sc.base_dir):
        out.append(f"{src}: {key}.typical_context = {eng.typical_context} does nothing: model {eng.model!r} has no "
                   f"sliding-window layers (every layer keeps its whole context; expected a model with sliding "
                   f"windows to use it, or no typical_context)")
    return out


def _has_windows(model: str, base_dir: str) -> bool:
    """Whether ``engine.model`` has sliding-window layers (whose KV ``typical_context`` averages)."""
    from sim.models.config import load_architecture

    return bool(load_architecture(model, base_dir).window_layers)


def _prefix_policy(sc: Scenario, key: str, pol: PolicyConfig, eng_key: str, eng: EngineConfig) -> list[str]:
    """A policy that ranks by cached prefix (``needs_prefix_info``: lpm) beside an engine without
    a prefix cache: every cached prefix is 0, and it ranks as without that term."""
    from policies import POLICIES

    if eng.prefix_caching:
        return []
    try:
        cls = POLICIES.resolve(pol.name)
    except (KeyError, ValueError):
        return []  # (refused with its own message by check_policy)
    if not getattr(cls, "needs_prefix_info", False):
        return []
    return [f"{sc.source}: {key}.name = {pol.name!r} ranks by cached prefix, but {eng_key}.prefix_caching is off: "
            f"every request's cached prefix is 0, so it ranks by arrival (after class priority where it respects it) "
            f"(expected prefix_caching = true, or a policy that does not read the prefix cache)"]


def _inert_speculation(sc: Scenario, engines: list[EngineConfig]) -> list[str]:
    """``classes.N.speculate = false`` where no engine decodes speculatively, and speculative
    decoding where every class has opted out (no class drafts a token)."""
    src = sc.source
    if not any(e.speculative is not None for e in engines):
        return [f"{src}: classes.{i}.speculate = false ({c.name}) does nothing: there is no [engine.speculative] "
                f"(no class drafts tokens; expected [engine.speculative] to use it, or no speculate)"
                for i, c in enumerate(sc.classes) if _written(c, "speculate")]
    if all(not c.speculate for c in sc.classes):
        return [f"{src}: engine.speculative does nothing: every class has speculate = false (no class drafts "
                f"tokens; expected some class with speculate = true, or no [engine.speculative])"]
    return []


def load_scenario(path: str | Path | None = None, overrides: list[str] | None = None) -> Scenario:
    """Read and validate a scenario file (None: the shipped default scenario): a TOML file, or a
    run's ``scenario.json`` (JSON), whose relative paths are read from the folder it records
    (:data:`BASE_DIR_KEY`), the original scenario's."""
    if path is None:
        path = shipped_scenario(DEFAULT_SCENARIO)
    p = Path(path)
    if not p.is_file():
        shipped = shipped_scenario(p.stem)
        if p.suffix in ("", ".toml") and not p.parent.parts and shipped is not None:
            p = shipped
        else:
            # (a shipped file's path given outside the repository's root, as the README writes it)
            named = (f"; the shipped scenario {p.stem!r} runs by its name alone" if shipped is not None
                     and p.suffix in ("", ".toml") else " such as 'chat_vs_batch'")
            raise ScenarioError(f"{path}: no such scenario file (expected a TOML file path, a run's "
                                f"scenario.json or a shipped scenario name{named})")
    try:
        text = read_text(p)
    except (DocumentError, OSError) as exc:
        raise ScenarioError(f"{p}: {exc}") from None
    base_dir: Path | str = p.resolve().parent
    if p.suffix.lower() == ".json":
        data = _json_scenario(p, text)
        base_dir = data.pop(BASE_DIR_KEY, None) or base_dir
    else:
        try:
            data = loads_toml(text)
        except (tomllib.TOMLDecodeError, DocumentError) as exc:
            raise ScenarioError(f"{p}: not valid TOML: {exc}") from None
    return scenario_from_dict(data, source=str(p), base_dir=base_dir, overrides=overrides)


#: The key of a run's scenario.json that records the folder its relative paths (profile, model,
#: traces) are read from: the original scenario's, so the run can be repeated from its results
#: folder (:meth:`Scenario.to_dict` with ``where=True``).
BASE_DIR_KEY = "base_dir"


def _json_scenario(p: Path, text: str) -> dict:
    """The scenario a JSON file (a run's scenario.json) holds, checked to be one table."""
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{p}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    except DocumentError as exc:
        raise ScenarioError(f"{p}: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{p}: a JSON {type(data).__name__} (expected one object, the scenario's keys, "
                            f"as a run's scenario.json holds them)")
    if not isinstance(data.get(BASE_DIR_KEY, ""), str):
        raise ScenarioError(f"{p}: {BASE_DIR_KEY}: {short(data[BASE_DIR_KEY])} (expected the folder its relative "
                            f"paths are read from, a string)")
    return data
