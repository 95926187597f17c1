"""A cluster's layout: its replica groups (each group's resolved engine settings, policy and
served classes) and its router, from the scenario's validated ``[cluster]`` table
(:mod:`sim.tables`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config import EngineConfig, PolicyConfig, Scenario
from sim.core.errors import ScenarioError
from sim.link import LinkSpec, link_spec
from sim.tables import AutoscaleConfig, group_autoscale, group_engine, group_policy, group_price

@dataclass(frozen=True)
class GroupSpec:
    name: str
    replicas: int
    engine: EngineConfig
    policy: PolicyConfig
    classes: tuple[str, ...] | None  # None: serves the classes no group lists
    gpus: int = 1  # GPUs per replica (for capacity reports)
    autoscale: AutoscaleConfig | None = None  # None: a fixed group of ``replicas``
    gpu_hour_usd: float | None = None  # dollars per GPU-hour (None: no price given)
    role: str = "both"  # "both" (co-located), "prefill" or "decode" (docs/disaggregation.md)

    @property
    def slots(self) -> int:
        """Replica slots built for the run: ``max`` when autoscaled, else ``replicas`` (the count at the start)."""
        return self.autoscale.max if self.autoscale is not None else self.replicas


@dataclass(frozen=True)
class ClusterSpec:
    groups: tuple[GroupSpec, ...]
    router: str
    router_params: dict = field(default_factory=dict)
    refresh_s: float | None = None  # the router's snapshot interval (None: it reads every arrival)
    link: LinkSpec | None = None  # disaggregated: the link KV is copied over
    decode_router: str = "least_kv"  # disaggregated: picks a decode replica
    decode_router_params: dict = field(default_factory=dict)
    # disaggregated: where the client gets the first token, "decode" (once the KV has landed) or
    # "prefill" (streamed at the prefill's end, as DistServe does)
    first_token: str = "decode"

    @property
    def disaggregated(self) -> bool:
        return any(g.role != "both" for g in self.groups)

    def gpus_by_role(self) -> dict[str, int]:
        """GPUs per role (prefill, decode, both), of the replicas at the start."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.role] = out.get(g.role, 0) + g.replicas * g.gpus
        return out

    @property
    def n_replicas(self) -> int:
        return sum(g.replicas for g in self.groups)

    @property
    def gpus(self) -> int:
        return sum(g.replicas * g.gpus for g in self.groups)

    @property
    def slots(self) -> int:
        return sum(g.slots for g in self.groups)

    @property
    def autoscaled(self) -> bool:
        return any(g.autoscale is not None for g in self.groups)


def parse_cluster(sc: Scenario) -> ClusterSpec:
    """The layout of ``sc``'s ``[cluster]`` (validated with the scenario, :mod:`sim.tables`):
    each group's resolved engine and policy, and the router."""
    if not sc.cluster:
        raise ScenarioError(f"{sc.source}: cluster: expected a table with 'replicas' or 'groups' (got {{}})")
    c = sc.cluster
    groups = []
    for name, g in c.group_list():
        eng = group_engine(sc, g)
        groups.append(GroupSpec(name, g.replicas, eng, group_policy(sc, g),
                                tuple(g.classes) if g.classes is not None else None, _gpus(g, eng, sc.base_dir),
                                group_autoscale(c, g), group_price(sc, name, g, eng), g.role))
    link = link_spec(c.link) if c.disaggregated else None
    return ClusterSpec(tuple(groups), c.router_name, c.router_params, c.refresh_s, link, c.decode_router_name,
                       c.decode_router_params, c.first_token or "decode")


def _gpus(g, eng: EngineConfig, base_dir) -> int:
    """GPUs per replica: the group's ``gpus`` as written; else the tensor-parallel degree of the
    replica's profile (the replica spans that many GPUs): a derived profile's ``engine.tp``, a
    measured or fitted one's ``tp`` (a TP-4 profile is four GPUs a replica); else 1."""
    if "gpus" in g.model_fields_set:
        return g.gpus
    if eng.model is not None:
        return eng.tp or 1
    from sim.engines import gpu as gpus

    found = gpus.load(eng.profile, Path(base_dir))
    return found.tp if found is not None else g.gpus
