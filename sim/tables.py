"""The scenario's ``[admission]``, ``[[tenants]]``, ``[fairness]`` and ``[cluster]`` tables.

Each is a :class:`~sim.schema.Table`: validated on its own by pydantic when the scenario is read
(types, bounds, unknown keys), then against the rest of the scenario by :func:`check_tables`
(class names, group engines merged over ``[engine]``, profiles, policies, the router). What the
keys mean: docs/admission.md (admission, tenants, fairness) and docs/cluster.md (cluster).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from sim.core.errors import ScenarioError, error_message
from sim.link import LINK_PRESETS
from sim.routers import make_router
from plumbing.numbers import in_range
from plumbing.suggest import did_you_mean
from sim.schema import FieldError, Table, checked, format_error, nested, number, one_of

Positive = Annotated[int | float, number()]
NonNegative = Annotated[int | float, number(minimum=0)]
AtLeastOne = Annotated[int | float, number(minimum=1)]
Count = Annotated[int, number(integer=True, minimum=1)]


# ---- admission, tenants, fairness (docs/admission.md) -------------------------------------------
class AdmissionConfig(Table):
    """The admission gate's settings (``sim.admission``); every check is off by default."""

    shed: Annotated[str, one_of("none", "deadline")] = Field(
        "none", description="'deadline': reject a request whose estimated TTFT exceeds shed_slack x its target")
    shed_slack: Positive = Field(1.0, description="multiplier of the TTFT target before shedding")
    max_request_tokens: Annotated[int, number(integer=True, minimum=0)] = Field(
        0, description="reject a request whose prompt + max_tokens exceeds this (0: no limit), tokens")
    memory_budget: NonNegative = Field(
        0.0, description="fraction of the KV blocks that admitted requests may be promised (0: no budget)")
    class_concurrency: Annotated[dict[str, Count], checked(lambda v: isinstance(v, dict),
                                                            "a table of class = cap")] = Field(
        default_factory=dict, description="class name -> most admitted, unfinished requests of that class")


class TenantConfig(Table):
    """A tenant: its fair share and its rate limits (token buckets) and concurrency cap."""

    name: Annotated[str, checked(lambda v: isinstance(v, str) and bool(v), "a tenant name string")] = Field(
        None, validate_default=True, description="the tenant name its streams use")
    share: Positive = Field(1.0, description="weight of the tenant under fairness")
    rate_rps: Positive | None = Field(None, description="requests per second the tenant may send")
    burst_requests: AtLeastOne | None = Field(None, description="request bucket size (default max(1, rate_rps))")
    rate_tps: Positive | None = Field(None, description="tokens (prompt + max_tokens) per second")
    burst_tokens: AtLeastOne | None = Field(None, description="token bucket size (default rate_tps)")
    max_concurrency: Count | None = Field(None, description="most admitted, unfinished requests")

    @model_validator(mode="after")
    def _bursts_need_rates(self) -> "TenantConfig":
        if self.burst_requests is not None and self.rate_rps is None:
            raise FieldError("needs rate_rps", key="burst_requests")
        if self.burst_tokens is not None and self.rate_tps is None:
            raise FieldError("needs rate_tps", key="burst_tokens")
        return self

    @property
    def gated(self) -> bool:
        """Whether the admission gate limits this tenant (a rate or a concurrency cap)."""
        return self.rate_rps is not None or self.rate_tps is not None or self.max_concurrency is not None


class FairnessConfig(Table):
    """The fairness accountant (``sim.core.fairness``): per-tenant service books, and with
    ``enabled`` the order of tenants within a class."""

    enabled: Annotated[bool, checked(lambda v: isinstance(v, bool), "true or false")] = Field(
        False, description="order tenants within a class by their service (false: keep the books only)")
    window_s: Positive = Field(10.0, description="service is counted over this sliding window, s")
    measure: Annotated[str, one_of("tokens", "gpu_seconds")] = Field(
        "tokens", description="what service is: priced tokens, or GPU seconds")
    prompt_price: NonNegative = Field(1.0, description="price of a prompt token under 'tokens'")
    output_price: NonNegative = Field(2.0, description="price of an output token under 'tokens'")


def check_tenant_names(tenants: list[TenantConfig]) -> list[TenantConfig]:
    seen: set[str] = set()
    for i, t in enumerate(tenants):
        if t.name in seen:
            raise FieldError(f"duplicate tenant '{t.name}'", key=f"{i}.name")
        seen.add(t.name)
    return tenants


# ---- the cluster (docs/cluster.md) ----------------------------------------------------------------
def _policy_value(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("name"), str))


class AutoscaleConfig(Table):
    """A group's autoscaler (docs/autoscaling.md): its policy, limits, tick and provisioning delay."""

    policy: Annotated[str | dict, checked(_policy_value, "an autoscaler name or a table with 'name'")] = Field(
        None, validate_default=True, description="autoscaler name or {name, params...} (priosim: sim.autoscalers)")
    min: Count = Field(1, description="fewest replicas (serving + provisioning)")
    max: Count = Field(None, validate_default=True, description="most replicas (serving + provisioning)")
    interval_s: Positive = Field(30.0, description="the policy decides every interval_s, s")
    provision_s: NonNegative = Field(120.0, description="from the decision to scale up until the replica serves "
                                                        "(model load), s")
    drain: Annotated[str, one_of("drain")] = Field(
        "drain", description="scale-down: 'drain' (no new requests; leaves when empty)")

    @model_validator(mode="after")
    def _limits(self) -> "AutoscaleConfig":
        if self.max < self.min:
            raise FieldError(f"expected max >= min={self.min} (got {self.max})", key="max")
        return self

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else self.policy["name"]

    @property
    def policy_params(self) -> dict:
        p = self.policy
        return {k: v for k, v in p.items() if k != "name"} if isinstance(p, dict) else {}


PRICE_EXPECTED = "a number >= 0 (dollars per GPU-hour) or a table of group name or engine.gpu = price"


def _price(v: Any) -> Any:
    """A price (a number >= 0), or a non-empty table of them; a bad entry of a table is named."""
    if isinstance(v, dict) and v:
        for k, x in v.items():
            if not in_range(x, ge=0):
                raise FieldError(f"expected a number >= 0 (dollars per GPU-hour) (got {x!r})", key=str(k))
        return v
    if not in_range(v, ge=0):
        raise FieldError(f"expected {PRICE_EXPECTED} (got {v!r})")
    return v


class GroupConfig(Table):
    """Replicas alike: their number, engine overrides, policy and the classes they serve."""

    name: Annotated[str, checked(lambda v: isinstance(v, str) and bool(v) and "/" not in v,
                                 "a non-empty string without '/'")] | None = Field(
        None, description="the group's name (default g<index>)")
    replicas: Count = Field(1, description="replicas in the group")
    engine: Annotated[dict, checked(lambda v: isinstance(v, dict), "a table of engine overrides")] = Field(
        default_factory=dict, description="[engine] keys that differ on these replicas")
    policy: Annotated[dict, checked(lambda v: isinstance(v, dict) and "name" in v, "a table with 'name'")] | None = Field(
        None, description="the replicas' policy (default: the scenario's [policy])")
    classes: Annotated[list[str], checked(lambda v: isinstance(v, list) and bool(v)
                                          and all(isinstance(x, str) for x in v),
                                          "a non-empty list of class names")] | None = Field(
        None, description="the classes it serves (class_aware router); absent: the classes no group lists")
    gpus: Annotated[int, number(integer=True, minimum=1, note=" (GPUs per replica)")] = Field(
        1, description="GPUs per replica (for capacity and cost reports, and the lanes of a disaggregated copy; "
                       "default: the profile's tensor-parallel degree, engine.tp of a derived one; a profile that "
                       "states its degree takes no other)")
    autoscale: AutoscaleConfig | None = Field(
        None, description="the group's autoscaler (default: the cluster's autoscale); replicas is the count at the start")
    gpu_hour_usd: Annotated[int | float, number(minimum=0, note=" (dollars per GPU-hour)")] | None = Field(
        None, description="price of one GPU-hour on this group's replicas, $ (default: the cluster's gpu_hour_usd)")
    role: Annotated[str, one_of("both", "prefill", "decode")] = Field(
        "both", description="'both' (co-located), or 'prefill' / 'decode' replicas of a disaggregated "
                            "cluster (docs/disaggregation.md)")


class LinkConfig(Table):
    """The link a disaggregated cluster copies KV over (:mod:`sim.link`): a preset's
    figures, or your own."""

    preset: Annotated[str, one_of(lambda: list(LINK_PRESETS))] | None = Field(
        None, description="start from this preset's figures (default ib-400)")
    bandwidth_bytes_per_s: Annotated[int | float, number(note=" (bytes per second per GPU)")] | None = Field(
        None, description="bandwidth per GPU, bytes/s (a tensor-parallel replica's GPUs copy side by side)")
    latency_s: Annotated[int | float, number(minimum=0, note=" (seconds per transfer)")] | None = Field(
        None, description="fixed time per transfer, s")
    pipelined: Annotated[bool, checked(lambda v: isinstance(v, bool), "true or false")] = Field(
        False, description="copy layer by layer as the prefill computes them (Mooncake, DistServe)")
    kv_bytes_per_token: Annotated[int, number(integer=True, note=" (bytes of KV per token)")] | None = Field(
        None, description="KV bytes per token copied, the replica's GPUs together: the whole model's (e.g. 131072 "
                          "for Llama-3-8B in BF16), not one GPU's share (default: the prefill profile's model shape "
                          "times its tensor-parallel size)")
    layers: Annotated[int, number(integer=True, note=" (layers)")] | None = Field(
        None, description="layers, for pipelining (default: the prefill profile's model shape)")


LINK_EXPECTED = (f"a link preset ({', '.join(LINK_PRESETS)}) or a table with bandwidth_bytes_per_s, latency_s, "
                 f"pipelined")


def _link(v: Any) -> Any:
    """A preset's name, or a table validated as a :class:`LinkConfig` on its own (its first error
    names the key inside it)."""
    if isinstance(v, str):
        if v not in LINK_PRESETS:
            raise FieldError(f"expected {LINK_EXPECTED} (got {v!r}){did_you_mean(v, LINK_PRESETS)}")
        return v
    if isinstance(v, (dict, LinkConfig)):
        return nested(LinkConfig, v)
    raise FieldError(f"expected {LINK_EXPECTED} (got {v!r})")


def _router_value(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("name"), str))


class ClusterConfig(Table):
    """Several replicas behind a router: ``replicas = N`` alike, or ``groups = [...]``."""

    replicas: Count | None = Field(None, description="N replicas alike (the scenario's engine and policy)")
    groups: Annotated[list[GroupConfig], checked(lambda v: isinstance(v, list) and bool(v),
                                                 "a non-empty list of tables")] | None = Field(
        None, description="replica groups, each with its own settings")
    router: Annotated[str | dict, checked(_router_value, "a router name or a table with 'name'")] | None = Field(
        None, description="router name or {name, params...}; default class_aware when a group lists "
                          "classes, else least_outstanding")
    autoscale: AutoscaleConfig | None = Field(
        None, description="the autoscaler of every group that has none of its own (docs/autoscaling.md)")
    gpu_hour_usd: Annotated[int | float | dict, BeforeValidator(_price)] | None = Field(
        None, description="price of one GPU-hour, $: one number, or a table by group name or engine.gpu")
    link: Annotated[str | LinkConfig, BeforeValidator(_link)] | None = Field(
        None, description="disaggregated clusters: the link KV is copied over (default ib-400)")
    decode_router: Annotated[str | dict, checked(_router_value, "a router name or a table with 'name'")] | None = Field(
        None, description="disaggregated clusters: the router that picks a decode replica (default least_kv)")
    first_token: Annotated[str, one_of("decode", "prefill")] | None = Field(
        None, description="disaggregated clusters: where the client gets a request's first token: 'decode' (the "
                          "default; vLLM's KV connectors, SGLang, Dynamo: once its KV has landed) or 'prefill' "
                          "(DistServe: streamed at the prefill's end)")

    @classmethod
    def check_keys(cls, data: dict) -> None:
        given = sorted(k for k in ("replicas", "groups") if k in data)
        if len(given) != 1:
            raise FieldError(f"give exactly one of 'replicas = N' or 'groups = [...]' (got {given or 'neither'})")

    @model_validator(mode="after")
    def _group_names(self) -> "ClusterConfig":
        names: set[str] = set()
        for i, g in enumerate(self.groups or []):
            name = g.name if g.name is not None else f"g{i}"
            if name in names:
                raise FieldError(f"duplicate group name (got {name!r})", key=f"groups.{i}.name")
            names.add(name)
        return self

    def group_list(self) -> list[tuple[str, GroupConfig]]:
        """The groups with their names: ``replicas = N`` is one group named ``default``."""
        if self.groups is None:
            return [("default", GroupConfig(replicas=self.replicas))]
        return [(g.name if g.name is not None else f"g{i}", g) for i, g in enumerate(self.groups)]

    @property
    def disaggregated(self) -> bool:
        """Whether some group is a prefill or decode group."""
        return any(g.role != "both" for g in self.groups or [])

    @property
    def decode_router_name(self) -> str:
        r = self.decode_router
        return "least_kv" if r is None else (r if isinstance(r, str) else r["name"])

    @property
    def decode_router_params(self) -> dict:
        r = self.decode_router
        return {k: v for k, v in r.items() if k != "name"} if isinstance(r, dict) else {}

    @property
    def partitioned(self) -> bool:
        """Whether some group lists the classes it serves."""
        return any(g.classes is not None for g in self.groups or [])

    @property
    def router_name(self) -> str:
        r = self.router
        if r is None:
            return "class_aware" if self.partitioned else "least_outstanding"
        return r if isinstance(r, str) else r["name"]

    @property
    def router_params(self) -> dict:
        r = self.router
        return {k: v for k, v in r.items() if k not in ("name", "refresh_s")} if isinstance(r, dict) else {}

    @property
    def refresh_s(self) -> float | None:
        """Seconds between the router's snapshots of replica state (``router = {..., refresh_s}``),
        or None: the router reads every replica at every arrival (docs/distributed.md)."""
        r = self.router
        return r.get("refresh_s") if isinstance(r, dict) else None


# ---- against the rest of the scenario --------------------------------------------------------------
def check_tables(sc) -> None:
    """Check the tables against the scenario ``sc`` (a validated :class:`sim.config.Scenario`):
    admission's class names, and every cluster group's merged engine, profile, policy and
    classes, and the router. Raises a one-line ScenarioError."""
    names = sc.class_names
    for c in sc.admission.class_concurrency:
        if c not in names:
            raise ScenarioError(f"{sc.source}: admission.class_concurrency.{c}: no such class "
                                f"(expected one of {', '.join(names)})")
    if sc.cluster:
        for i, (_, g) in enumerate(sc.cluster.group_list()):
            _check_group(sc, i, g)
        _check_router(sc)
        _check_autoscale(sc)
        _check_prices(sc)
        if sc.cluster.disaggregated:
            _check_disaggregated(sc)
        else:
            pd_only = [k for k in ("link", "decode_router", "first_token") if getattr(sc.cluster, k) is not None]
            if pd_only:
                from plumbing.notices import warn
                warn(f"{sc.source}: cluster.{pd_only[0]} is set but no group has role = 'prefill' or 'decode': "
                     f"it does nothing")


def group_engine(sc, g: GroupConfig):
    """The engine settings of group ``g``'s replicas: ``[engine]`` with the group's overrides."""
    if not g.engine:
        return sc.engine
    from sim.config import MODEL_KEYS
    from sim.engines import resolve
    from sim.models import apply

    base = sc.engine.as_written()
    if "model" in g.engine:  # the group's own source of the profile replaces the scenario's
        base.pop("profile", None)
    elif "profile" in g.engine:
        base = {k: v for k, v in base.items() if k not in MODEL_KEYS}
    eng = type(sc.engine).model_validate({**base, **g.engine})
    return resolve(apply(eng, Path(sc.base_dir), sc.source), Path(sc.base_dir), sc.source)


def group_policy(sc, g: GroupConfig):
    """The policy of group ``g``'s replicas (``[policy]`` unless the group names one)."""
    return sc.policy if g.policy is None else type(sc.policy).model_validate(g.policy)


def check_profile(sc, eng, key: str | None = None) -> None:
    """Engine settings ``eng``'s profile loads with its overhead (a ScenarioError naming ``key``
    when given; the profile's own message names the profile)."""
    from sim.core.costs import ProfileError, load_profile
    try:
        load_profile(eng.profile, Path(sc.base_dir), overhead=eng.overhead, host_cpu=eng.host_cpu)
    except ProfileError as exc:
        raise ScenarioError(f"{sc.source}: {f'{key}: ' if key else ''}{exc}") from None


def check_policy(sc, pol, key: str) -> None:
    """Policy settings ``pol`` make a policy, and the parameters that name classes name the
    scenario's (a ScenarioError naming ``key``)."""
    from policies import POLICIES, make_policy
    from sim.policy_code import files_of, policy_code_error, warn_shared_random
    try:
        policy = make_policy(pol.name, **pol.params())
        if hasattr(policy, "bind"):
            policy.bind({c.name: c.model_dump() for c in sc.classes}, 0)
    except Exception as exc:
        # a bad parameter's ValueError (or TypeError) is the policy's own one line; an unknown
        # name's KeyError the registry's; anything else the user's __init__ or bind raised is
        # named with its line; the rest (a bug) keeps its traceback
        err = policy_code_error(exc, files_of([pol.name]))
        if isinstance(exc, (ValueError, TypeError)) or (isinstance(exc, KeyError) and err is None):
            raise ScenarioError(f"{sc.source}: {key}: {error_message(exc)}") from None
        if err is None:
            raise
        raise ScenarioError(f"{sc.source}: {key}: {err}") from None
    if pol.name not in POLICIES.names():
        warn_shared_random(pol.name)


def _check_group(sc, i: int, g: GroupConfig) -> None:
    src = sc.source
    key = f"cluster.groups.{i}"
    try:
        eng = group_engine(sc, g)
    except ValidationError as err:
        raise ScenarioError(format_error(src, err, prefix=f"{key}.engine", model=type(sc.engine))) from None
    if eng.timeseries_interval_s != sc.engine.timeseries_interval_s:
        raise ScenarioError(f"{src}: {key}.engine.timeseries_interval_s: must equal the scenario's "
                            f"engine.timeseries_interval_s={sc.engine.timeseries_interval_s} "
                            f"(got {eng.timeseries_interval_s!r})")
    if "profile" in g.engine or "overhead" in g.engine:
        check_profile(sc, eng, f"{key}.engine.profile")
    if "gpus" in g.model_fields_set:
        _check_gpus(sc, key, g, eng)
    if g.policy is not None:
        try:
            pol = group_policy(sc, g)
        except ValidationError as err:
            raise ScenarioError(format_error(src, err, prefix=f"{key}.policy")) from None
        check_policy(sc, pol, f"{key}.policy")
    bad = [x for x in g.classes or [] if x not in sc.class_names]
    if bad:
        raise ScenarioError(f"{src}: {key}.classes: unknown class {bad[0]!r} "
                            f"(expected one of {', '.join(sc.class_names)}){did_you_mean(bad[0], sc.class_names)}")


def _check_gpus(sc, key: str, g: GroupConfig, eng) -> None:
    """A group's ``gpus`` (GPUs per replica) as written must be the tensor-parallel size its
    profile states (``model.tp``, else ``meta.tp``; a derived profile's ``engine.tp``): a TP-4
    profile prices a replica of four GPUs. A profile that states none (an inline linear one)
    takes any count."""
    from sim.engines.gpu import document

    doc = document(eng.profile, Path(sc.base_dir))
    if not isinstance(doc, dict):
        return
    model, meta = doc.get("model"), doc.get("meta")
    tp = model.get("tp") if isinstance(model, dict) else None
    if not tp and isinstance(meta, dict):
        tp = meta.get("tp")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or tp == g.gpus:
        return
    name = meta.get("name", "") if isinstance(meta, dict) and isinstance(eng.profile, dict) else eng.profile
    raise ScenarioError(f"{sc.source}: {key}.gpus: {g.gpus} GPUs per replica contradicts profile {name!r}, whose "
                        f"tensor-parallel size is {tp} (expected gpus = {tp}, or no gpus: the profile's tp is the "
                        f"default)")


def _check_router(sc) -> None:
    src, c = sc.source, sc.cluster
    refresh = c.refresh_s
    if isinstance(c.router, dict) and "refresh_s" in c.router:
        if not in_range(refresh, gt=0) or isinstance(refresh, bool):
            raise ScenarioError(f"{src}: cluster.router.refresh_s: expected a number of seconds > 0 "
                                f"(got {refresh!r})")
        if c.autoscale is not None or any(g.autoscale is not None for g in c.groups or []):
            raise ScenarioError(f"{src}: cluster.router.refresh_s: not available with an autoscaler yet "
                                f"(expected no 'autoscale' beside it; docs/distributed.md)")
    try:
        router = make_router(c.router_name, **c.router_params)
    except (KeyError, ValueError, TypeError) as exc:
        raise ScenarioError(f"{src}: cluster.router: {error_message(exc)}") from None
    if c.partitioned and not router.class_aware:
        raise ScenarioError(f"{src}: cluster.router: groups list 'classes', which only the class_aware "
                            f"router honours (got {c.router_name!r})")
    if router.class_aware and not c.partitioned and not c.disaggregated:
        from plumbing.notices import warn

        inner = c.router_params.get("inner", "least_outstanding")
        warn(f"{src}: cluster.router = 'class_aware' but no group lists 'classes': every group serves every "
             f"class, so it routes as its inner router ({inner!r}) alone would (expected 'classes' on a group)")
    if router.class_aware and not c.disaggregated:
        for cname in sc.class_names:
            if not serving_groups(c, cname):
                raise ScenarioError(f"{src}: cluster.groups: no group serves class {cname!r} (expected a "
                                    f"group listing it in 'classes', or a group without 'classes')")


def serving_groups(c: ClusterConfig, cls: str, roles: tuple[str, ...] = ("both", "prefill", "decode")) -> list[int]:
    """Groups (of the given ``roles``) that serve ``cls`` under static partitioning: those listing
    it, else the catch-alls."""
    groups = [(i, g) for i, (_, g) in enumerate(c.group_list()) if g.role in roles]
    listed = [i for i, g in groups if g.classes is not None and cls in g.classes]
    return listed or [i for i, g in groups if g.classes is None]


#: a disaggregated cluster's first stop for a request (a prefill or co-located group), and its decode side
FRONT_ROLES, DECODE_ROLES = ("both", "prefill"), ("decode",)


def _check_disaggregated(sc) -> None:
    """A disaggregated cluster's layout: every class has a first stop, a class whose first stop
    may be a prefill group has a decode group, the decode router exists, and nothing that does
    not work with disaggregation yet is asked for."""
    src, c = sc.source, sc.cluster
    groups = [g for _, g in c.group_list()]
    for cname in sc.class_names:
        front = serving_groups(c, cname, FRONT_ROLES)
        if not front:
            raise ScenarioError(f"{src}: cluster.groups: no prefill or co-located group serves class {cname!r} "
                                f"(expected a group with role = 'prefill' or 'both' for it)")
        if any(groups[i].role == "prefill" for i in front) and not serving_groups(c, cname, DECODE_ROLES):
            raise ScenarioError(f"{src}: cluster.groups: class {cname!r} is prefilled by a prefill group but no "
                                f"decode group serves it (expected a group with role = 'decode' for it)")
    if c.refresh_s is not None:
        raise ScenarioError(f"{src}: cluster.router.refresh_s: not available with prefill and decode groups yet "
                            f"(expected no refresh_s; docs/disaggregation.md)")
    if c.autoscale is not None or any(g.autoscale is not None for g in groups):
        raise ScenarioError(f"{src}: cluster.autoscale: not available with prefill and decode groups yet "
                            f"(expected no 'autoscale'; docs/disaggregation.md)")
    try:
        make_router(c.decode_router_name, **c.decode_router_params)
    except (KeyError, ValueError, TypeError) as exc:
        raise ScenarioError(f"{src}: cluster.decode_router: {error_message(exc)}") from None


def group_autoscale(c: ClusterConfig, g: GroupConfig) -> AutoscaleConfig | None:
    """Group ``g``'s autoscaler: its own, else the cluster's, else None (a fixed group)."""
    return g.autoscale if g.autoscale is not None else c.autoscale


def group_price(sc, name: str, g: GroupConfig, eng) -> float | None:
    """Dollars per GPU-hour on group ``name``'s replicas: the group's ``gpu_hour_usd``, else the
    cluster's (a number; or its table's entry for the group's name, else for its engine.gpu),
    else None (no price: cost_usd is null)."""
    if g.gpu_hour_usd is not None:
        return float(g.gpu_hour_usd)
    p = sc.cluster.gpu_hour_usd
    if p is None:
        return None
    if not isinstance(p, dict):
        return float(p)
    if name in p:
        return float(p[name])
    gpu = getattr(eng, "gpu", None)
    return float(p[gpu]) if gpu in p else None


def _check_autoscale(sc) -> None:
    """Each autoscaled group's policy is made from its parameters, those that name classes name
    the scenario's (a class the group does not serve is warned about: the policy never sees it),
    a schedule's counts lie within min..max (warned: the controller clamps them), and the count
    at the start lies within min..max."""
    from sim.autoscalers import make_autoscaler
    src, c = sc.source, sc.cluster
    warned: set[str] = set()  # (a cluster-level autoscale serves several groups: warned once)
    for i, (name, g) in enumerate(c.group_list()):
        a = group_autoscale(c, g)
        if a is None:
            continue
        key = f"cluster.groups.{i}.autoscale" if g.autoscale is not None else "cluster.autoscale"
        try:
            policy = make_autoscaler(a.policy_name, **a.policy_params)
        except (KeyError, ValueError, TypeError) as exc:
            raise ScenarioError(f"{src}: {key}.policy: {error_message(exc)}") from None
        for p in getattr(policy, "class_params", ()):
            _check_policy_classes(sc, i, name, f"{key}.policy.{p}", a.policy_params.get(p))
        if key not in warned:
            warned.add(key)
            _warn_clamped(sc, key, a, policy)
        n = c.replicas if c.groups is None else g.replicas
        if not a.min <= n <= a.max:
            where = "cluster.replicas" if c.groups is None else f"cluster.groups.{i}.replicas"
            raise ScenarioError(f"{src}: {where}: the count at the start must be within the autoscaler's "
                                f"min={a.min} and max={a.max} (got {n})")


def _check_policy_classes(sc, i: int, name: str, key: str, value) -> None:
    """An autoscaler parameter ``key`` naming classes (a name or a list; None: all) names the
    scenario's; a class group ``i`` does not serve is warned about (its requests never end there,
    so the policy never sees one)."""
    if value is None:
        return
    listed = [value] if isinstance(value, str) else list(value)
    for x in listed:
        if x not in sc.class_names:
            raise ScenarioError(f"{sc.source}: {key}: unknown class {x!r} (expected one of "
                                f"{', '.join(sc.class_names)}){did_you_mean(x, sc.class_names)}")
    c = sc.cluster
    served = [x for x in sc.class_names if i in serving_groups(c, x)]
    away = [x for x in listed if x not in served]
    if away:
        from plumbing.notices import warn
        warn(f"{sc.source}: {key}: group {name!r} does not serve {', '.join(repr(x) for x in away)} "
             f"(it serves {', '.join(served)}): its autoscaler never sees a request of "
             f"{'them' if len(away) > 1 else 'it'}")


def _warn_clamped(sc, key: str, a: AutoscaleConfig, policy) -> None:
    """A schedule's rows asking for a count outside min..max: the controller clamps them (one
    warning naming the first such row)."""
    from sim.autoscalers import Schedule
    if not isinstance(policy, Schedule):
        return
    out = [(j, t, n) for j, (t, n) in enumerate(zip(policy.times, policy.counts)) if not a.min <= n <= a.max]
    if not out:
        return
    from plumbing.notices import warn
    j, t, n = out[0]
    bound, to = (f"above max = {a.max}", a.max) if n > a.max else (f"below min = {a.min}", a.min)
    more = f" (and {len(out) - 1} more row{'s' if len(out) > 2 else ''} outside {a.min}..{a.max})" if len(out) > 1 else ""
    warn(f"{sc.source}: {key}.policy.table.{j} = [{t:g}, {n}]: {n} replicas is {bound}{more}: the autoscaler "
         f"keeps {to} there (expected counts within min..max, or a wider min..max)")


def _check_prices(sc) -> None:
    """A price table's keys name groups or their GPUs; a price on some groups only is warned
    about (the run's cost_usd is null without every group's)."""
    src, c = sc.source, sc.cluster
    p = c.gpu_hour_usd
    groups = c.group_list()
    if p is None and all(g.gpu_hour_usd is None for _, g in groups):
        return  # (no price anywhere: cost_usd is null, as asked)
    # (the engines only where a table may name their GPUs: a group's is resolved again)
    engines = [group_engine(sc, g) if isinstance(p, dict) else None for _, g in groups]
    if isinstance(p, dict):
        names = [n for n, _ in groups]
        known = names + [x for x in (getattr(e, "gpu", None) for e in engines) if x]
        for k in p:
            if k not in known:
                raise ScenarioError(f"{src}: cluster.gpu_hour_usd.{k}: not a group name or a group's engine.gpu "
                                    f"(expected one of {', '.join(known)})")
    prices = [group_price(sc, n, g, e) for (n, g), e in zip(groups, engines)]
    unpriced = [n for (n, _), x in zip(groups, prices) if x is None]
    if unpriced and len(unpriced) < len(groups):
        from plumbing.notices import warn
        key = "cluster.gpu_hour_usd" if p is not None else next(
            f"cluster.groups.{i}.gpu_hour_usd" for i, (_, g) in enumerate(groups) if g.gpu_hour_usd is not None)
        warn(f"{src}: {key}: no price for group {', '.join(repr(n) for n in unpriced)}: the run's cost_usd will be "
             f"null (expected a price for every group: the cluster's gpu_hour_usd, an entry per group name or "
             f"engine.gpu, or the group's own)")
