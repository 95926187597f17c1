"""The link between a disaggregated cluster's prefill and decode replicas: what a KV transfer
costs and when it lands.

A prefill replica's finished prompt leaves its KV cache in the prefill GPUs' memory; the decode
replica chosen for the request reserves blocks for it, then the KV is copied over the link and
the request is admitted there when it lands (:mod:`sim.cluster.disagg`). This module prices the
copy:

    bytes      = tokens x kv_bytes_per_token, the KV of a token on the prefill replica, all its
                 GPUs together: the profile's model shape gives one GPU's share (2 x layers x
                 KV heads on one GPU x head dim x KV dtype bytes, or a derived profile's own,
                 e.g. MLA's compressed cache), times the profile's tensor-parallel size; the
                 link table's ``kv_bytes_per_token`` is that whole figure too
    lanes      = min(GPUs of the prefill replica, GPUs of the decode replica): a tensor-parallel
                 replica's KV is sharded over its GPUs, each with its own link (NIC or NVLink
                 port), and the shards travel side by side, each lane carrying its GPU's share
    duration   = latency_s + bytes / (bandwidth_bytes_per_s x lanes)

Contention: each replica's link is one first-come-first-served channel. A transfer starts when
the sender's and the receiver's links are both free (and not before it is asked for), and holds
both for its duration; so several prefill replicas sending to one decode replica queue at its
link, and one prefill replica's transfers to several decode replicas queue at its own. (Real
RDMA shares a link's bandwidth between concurrent transfers instead; the total bytes moved per
second is the same, the order in which transfers finish is not. First-come-first-served makes
every landing known when its transfer starts.)

Layer-wise pipelining (``pipelined = true``: Mooncake, DistServe, vLLM's KV connectors send
each layer's KV as soon as the layer is computed): when the decode side had room as the prefill
ended, the copy of all but the last layer overlapped the prefill, so only
``max(bytes / rate - prefill time, bytes / (layers x rate))`` of it is left, plus the latency.
A request that waited for room at the decode side pays the whole copy.

The presets are peak unidirectional figures of common interconnects per GPU (examples, not
measurements; set your own numbers where you know them): NVLink 4 (H100/H200 NVSwitch, 18 links
of 25 GB/s), NVLink 5 (B200, 18 links of 50 GB/s), InfiniBand or RoCE at 200 and 400 Gb/s (one
NIC per GPU, as in DGX-class nodes), PCIe 4.0 and 5.0 x16 (a KV copy through host memory).
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.core.costs import NS

#: preset name -> (bandwidth per GPU, bytes/s; latency, s)
LINK_PRESETS: dict[str, tuple[float, float]] = {
    "nvlink": (450e9, 3e-6),
    "nvlink5": (900e9, 3e-6),
    "ib-200": (25e9, 1e-5),
    "ib-400": (50e9, 1e-5),
    "roce-200": (25e9, 1.5e-5),
    "roce-400": (50e9, 1.5e-5),
    "pcie4": (32e9, 1e-5),
    "pcie5": (64e9, 1e-5),
}
DEFAULT_LINK = "ib-400"


@dataclass(frozen=True)
class LinkSpec:
    """A link's figures: bandwidth per GPU (bytes/s), latency per transfer (s), pipelining."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    pipelined: bool = False
    kv_bytes_per_token: int | None = None  # (None: the prefill profile's model shape says)
    layers: int | None = None

    def transfer_ns(self, nbytes: int, lanes: int, prefill_ns: int = 0, layers: int = 1) -> int:
        """How long a copy of ``nbytes`` over ``lanes`` links takes once it starts, ns; with
        pipelining, ``prefill_ns`` of it (all but the last of ``layers`` layers' share at most)
        already overlapped the prefill."""
        copy_ns = nbytes * NS / (self.bandwidth_bytes_per_s * max(lanes, 1))
        if self.pipelined and prefill_ns > 0:
            copy_ns = max(copy_ns - prefill_ns, copy_ns / max(layers, 1))
        return max(int(round(self.latency_s * NS + copy_ns)), 1)


def link_spec(value) -> LinkSpec:
    """The link a scenario's ``[cluster] link`` names: a preset name, or a table with
    ``bandwidth_bytes_per_s`` and ``latency_s`` (or ``preset`` to start from), ``pipelined``, and
    for a profile without a model shape ``kv_bytes_per_token`` and ``layers`` (validated by
    :class:`sim.tables.LinkConfig`); None: the default preset."""
    if value is None:
        value = DEFAULT_LINK
    if isinstance(value, str):
        bw, lat = LINK_PRESETS[value]
        return LinkSpec(value, bw, lat)
    base = value.preset or DEFAULT_LINK
    bw, lat = LINK_PRESETS[base]
    return LinkSpec(base if value.bandwidth_bytes_per_s is None and value.latency_s is None else "custom",
                    float(value.bandwidth_bytes_per_s if value.bandwidth_bytes_per_s is not None else bw),
                    float(value.latency_s if value.latency_s is not None else lat), bool(value.pipelined),
                    value.kv_bytes_per_token, value.layers)


class Links:
    """Every replica's link as a first-come-first-served channel (see the module docstring):
    ``free_at[i]``, when replica ``i``'s link is next free, ns; totals for the report."""

    def __init__(self, spec: LinkSpec, n_replicas: int) -> None:
        self.spec = spec
        self.free_at = [0] * n_replicas
        self.transfers = 0
        self.bytes = 0
        self.busy_ns = 0  # summed over transfers (a link-second each)
        self.queued_ns = 0  # waited for a busy link

    def send(self, src: int, dst: int, now_ns: int, nbytes: int, lanes: int, prefill_ns: int = 0,
             layers: int = 1) -> tuple[int, int]:
        """Start a copy of ``nbytes`` from replica ``src`` to ``dst`` asked for at ``now_ns``:
        returns (when it starts, when it lands), ns."""
        start = max(now_ns, self.free_at[src], self.free_at[dst])
        dur = self.spec.transfer_ns(nbytes, lanes, prefill_ns, layers)
        end = start + dur
        self.free_at[src] = self.free_at[dst] = end
        self.transfers += 1
        self.bytes += nbytes
        self.busy_ns += dur
        self.queued_ns += start - now_ns
        return start, end

    def min_transfer_ns(self, nbytes: int, lanes: int, layers: int = 1) -> int:
        """The shortest a copy of ``nbytes`` could take (an idle link; with pipelining, its
        last layer only): a lower bound of when a transfer not yet started can land."""
        spec = self.spec
        copy_ns = nbytes * NS / (spec.bandwidth_bytes_per_s * max(lanes, 1))
        if spec.pipelined:
            copy_ns /= max(layers, 1)
        return max(int(spec.latency_s * NS + copy_ns) - 1, 1)

    def report(self) -> dict:
        return {"link": self.spec.name, "bandwidth_bytes_per_s": self.spec.bandwidth_bytes_per_s,
                "latency_s": self.spec.latency_s, "pipelined": self.spec.pipelined, "transfers": self.transfers,
                "bytes": self.bytes, "transfer_s": self.busy_ns / NS, "link_queue_s": self.queued_ns / NS,
                "mean_transfer_s": self.busy_ns / NS / self.transfers if self.transfers else None}
