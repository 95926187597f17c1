"""Telemetry: per-request records, per-class counters and the time series.

Per-request rows are kept columnar (one Python list per column, turned into arrays once at the
end), written when a request *ends* (finished, rejected or unfinished), so live state stays
small however long the run. Inter-token gaps are kept per class as weighted samples — a
fast-forwarded run of k steps adds its k-1 step durations once, weighted by how many of the
class's requests decoded in it — so percentiles are exact without one entry per token.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from sim.costs import NS
from sim.request import Request, State

STATUS = {State.FINISHED: "finished", State.REJECTED: "rejected", State.UNFINISHED: "unfinished"}

COLUMNS = (
    "request_id", "tenant", "class", "priority", "stream", "user", "arrival_s", "admitted_s",
    "first_token_s", "finish_s", "prompt_tokens", "output_tokens", "max_tokens",
    "generated_tokens", "status", "reject_reason", "preemptions", "swapped_blocks",
    "recomputed_tokens", "swap_fallbacks", "max_itl_s", "itl_mean_s", "itl_std_s", "deadline_s",
)


class Telemetry:
    def __init__(self, class_names: list[str], interval_ns: int, costs=None, block_size: int = 16) -> None:
        self.class_names = class_names
        self.interval_ns = interval_ns
        self.costs = costs
        self.block_size = block_size
        self.cols: dict[str, list] = {c: [] for c in COLUMNS}
        nc = len(class_names)
        self.arrivals = [0] * nc
        self.preempt_by_mode: dict[str, int] = defaultdict(int)
        self.preempt_class = [0] * nc
        self.swap_ns_class = [0] * nc
        self.recompute_ns_class = [0] * nc
        self.itl_vals: list[list] = [[] for _ in range(nc)]  # per class: list of arrays or ints
        self.itl_wts: list[list] = [[] for _ in range(nc)]
        self.tokens_bin: dict[tuple[int, int], int] = defaultdict(int)
        self.tenant_tokens_bin: dict[tuple[int, str], int] = defaultdict(int)
        self.preempt_bin: dict[int, int] = defaultdict(int)
        self.samples: list[tuple] = []
        self.idle_with_work_ns = 0

    # ---- request lifecycle ---------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        self.arrivals[req.cls_idx] += 1

    def on_first_token(self, req: Request) -> None:
        pass

    def on_preempt(self, req: Request, mode: str, now_ns: int) -> None:
        self.preempt_by_mode[mode] += 1
        self.preempt_class[req.cls_idx] += 1
        self.preempt_bin[now_ns // self.interval_ns] += 1

    def on_swap(self, req: Request, blocks: int) -> None:
        if self.costs is not None and blocks:
            self.swap_ns_class[req.cls_idx] += self.costs.swap_ns(blocks, self.block_size)

    def on_end(self, req: Request) -> None:
        c = self.cols
        c["request_id"].append(req.request_id)
        c["tenant"].append(req.tenant)
        c["class"].append(req.cls)
        c["priority"].append(req.priority)
        c["stream"].append(req.stream)
        c["user"].append(req.user)
        c["arrival_s"].append(req.arrival_ns / NS)
        c["admitted_s"].append(req.first_admit_ns / NS if req.first_admit_ns >= 0 else np.nan)
        c["first_token_s"].append(req.first_token_ns / NS if req.first_token_ns >= 0 else np.nan)
        c["finish_s"].append(req.finish_ns / NS if req.state is State.FINISHED else np.nan)
        c["prompt_tokens"].append(req.prompt_tokens)
        c["output_tokens"].append(req._output)
        c["max_tokens"].append(req.max_tokens)
        c["generated_tokens"].append(req.generated)
        c["status"].append(STATUS[req.state])
        c["reject_reason"].append(req.reject_reason)
        c["preemptions"].append(req.preemptions)
        c["swapped_blocks"].append(req.swapped_blocks)
        c["recomputed_tokens"].append(req.recomputed_tokens)
        c["swap_fallbacks"].append(req.swap_fallbacks)
        n = req.itl_n
        c["max_itl_s"].append(req.max_itl_ns / NS if n else np.nan)
        if n:
            mean = req.itl_sum / n
            var = max(req.itl_sq / n - mean * mean, 0.0)
            c["itl_mean_s"].append(mean / NS)
            c["itl_std_s"].append(var ** 0.5 / NS)
        else:
            c["itl_mean_s"].append(np.nan)
            c["itl_std_s"].append(np.nan)
        c["deadline_s"].append(req.deadline_s)

    # ---- steps ---------------------------------------------------------------------------
    def on_step(self, plan, start_ns: int, durations: np.ndarray, compute_ns: int) -> None:
        """Count emitted tokens per class/tenant per interval; attribute recompute time."""
        k = len(durations)
        iv = self.interval_ns
        if k == 1:
            end = start_ns + int(durations[0])
            b = end // iv
            toks = sum(s.tokens for s in plan.items)
            for s in plan.items:
                r = s.req
                if s.decode or s.prefix + s.tokens >= r.tokens:
                    self.tokens_bin[(b, r.cls_idx)] += 1
                    self.tenant_tokens_bin[(b, r.tenant)] += 1
                if not s.decode and r.generated > 0 and toks:
                    self.recompute_ns_class[r.cls_idx] += compute_ns * s.tokens // toks
            return
        ends = start_ns + np.cumsum(durations)
        bins, counts = np.unique(ends // iv, return_counts=True)
        per_class: dict[int, int] = defaultdict(int)
        per_tenant: dict[str, int] = defaultdict(int)
        for s in plan.items:
            per_class[s.req.cls_idx] += 1
            per_tenant[s.req.tenant] += 1
        for b, cnt in zip(bins.tolist(), counts.tolist()):
            for ci, m in per_class.items():
                self.tokens_bin[(b, ci)] += m * cnt
            for t, m in per_tenant.items():
                self.tenant_tokens_bin[(b, t)] += m * cnt

    def itl_sample(self, cls_idx: int, gap_ns: int) -> None:
        self.itl_vals[cls_idx].append(gap_ns)
        self.itl_wts[cls_idx].append(1)

    def itl_run(self, plan, durations: np.ndarray) -> None:
        per_class: dict[int, int] = defaultdict(int)
        for s in plan.items:
            per_class[s.req.cls_idx] += 1
        rest = durations[1:]
        for ci, m in per_class.items():
            self.itl_vals[ci].append(rest)
            self.itl_wts[ci].append(m)

    def itl_arrays(self, cls_idx: int) -> tuple[np.ndarray, np.ndarray]:
        vals, wts = [], []
        for v, w in zip(self.itl_vals[cls_idx], self.itl_wts[cls_idx]):
            a = np.atleast_1d(np.asarray(v, dtype=np.int64))
            vals.append(a)
            wts.append(np.full(len(a), w, dtype=np.int64))
        if not vals:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(vals), np.concatenate(wts)

    # ---- time series ---------------------------------------------------------------------
    def sample(self, t_ns: int, engine) -> None:
        nc = len(self.class_names)
        waiting = [0] * nc
        running = [0] * nc
        for _, _, r in engine.waiting:
            waiting[r.cls_idx] += 1
        for r in engine.running:
            running[r.cls_idx] += 1
        pool = engine.pool
        self.samples.append((t_ns, waiting, running, pool.total - pool.free, pool.host_used))

    def columns(self) -> dict[str, list]:
        return self.cols
