"""The fairness accountant: a Virtual Token Counter (Sheng et al., OSDI 2024) per tenant.

It is a policy *wrapper*: the rank key of a request becomes

    (class priority, tenant's normalised counter, *inner_policy.key(req, now))

so a more urgent class always ranks first (priority governs order between classes), and inside
a class the most under-served tenant ranks first (fairness governs totals within a class); the
inner policy's order is kept among one tenant's own requests. Counters move after every step,
so the wrapper is ``dynamic`` (the engine re-keys before each plan).

Counters. ``measure = "tokens"``: a tenant is charged ``prompt_price`` per prompt token
prefilled here (recompute after a preemption is not charged again; a prefix-cache hit and, on a
disaggregated decode replica, the prefill replica's work are not prefilled here) plus
``output_price`` per output token (defaults 1 and 2, as in VTC), divided by its ``share``
weight. ``measure = "gpu_seconds"``:
each step's duration is split between the requests in it in proportion to the tokens each
processed in that step, divided by the share. Both are tracked and reported; ``measure`` picks
the one that orders.

Lift. A tenant that arrives with nothing waiting (back from idle) has its counter raised to the
minimum counter of the backlogged tenants (tenants with waiting requests), so idle time banks no
credit, and lowered to at most that minimum plus its in-flight allowance ``U`` (below), so old
debt does not lock it out either. With no tenant backlogged it keeps its counter. The GPU-seconds
counters are lifted the same way, ``C`` there being the most GPU time one finished request was
charged.

Bound (see docs/admission.md). Let ``C = prompt_price * P_max + output_price * O_max`` be the
largest charge of one request and ``N_t`` the most requests tenant t can have in flight
(``min(max_num_seqs, max_concurrency_t)``); ``U_t = N_t * C / share_t``. For two tenants f, g
backlogged in the same class, at every instant: ``|c_f - c_g| <= 2 * max(U_f, U_g)``, so over
any interval in which both stay backlogged their normalised service ``W/share`` differs by at
most ``4 * max(U_f, U_g)``. The report carries ``bound`` and the largest gap observed.
"""
from __future__ import annotations

import heapq
from collections import defaultdict

from policies.base import BasePolicy, listens_before_ranking
from sim.core.apply import run_totals
from sim.core.costs import NS


class FairShare(BasePolicy):
    """VTC fairness accountant wrapping any policy (see module docstring)."""

    dynamic = True

    def __init__(self, inner, *, enabled: bool = True, shares: dict[str, float] | None = None, measure: str = "tokens",
                 window_s: float = 10.0, prompt_price: float = 1.0, output_price: float = 2.0,
                 max_num_seqs: int = 256, max_concurrency: dict[str, int] | None = None) -> None:
        self.inner = inner
        self.enabled = enabled
        if not enabled:  # accounting only: the inner policy's keys, its dynamism
            self.dynamic = bool(getattr(inner, "dynamic", False))
        self.name = f"fair({getattr(inner, 'name', type(inner).__name__)})"
        self.oracle = bool(getattr(inner, "oracle", False))
        # a prefix-aware inner policy is told what it would be told unwrapped: the engine reads
        # these two from the policy it holds, which is this wrapper
        self.needs_prefix_info = bool(getattr(inner, "needs_prefix_info", False))
        hook = getattr(inner, "before_ranking", None)
        if hook is not None and (self.needs_prefix_info or listens_before_ranking(inner)):
            self.before_ranking = hook
        self.shares = dict(shares or {})
        self.measure = measure
        self.window_s = float(window_s)
        self.wp = float(prompt_price)
        self.wo = float(output_price)
        self.max_num_seqs = int(max_num_seqs)
        self.max_conc = dict(max_concurrency or {})
        self.tok = defaultdict(float)  # normalised token counters
        self.gpu = defaultdict(float)  # normalised GPU-second counters
        self.raw_tok = defaultdict(float)  # un-normalised service, tokens (priced)
        self.raw_gpu = defaultdict(float)
        self.waiting_n = defaultdict(int)  # requests waiting per tenant
        self.active_n = defaultdict(int)  # waiting or running per tenant
        self._waiting: set[int] = set()
        # per request, the prompt position (tokens) up to which its prefill has been charged: a
        # step's tokens at positions [computed before it, + tokens) that are prompt positions not
        # charged before are its prompt tokens (a cached prefix, a re-prefill and decode steps
        # are none)
        self._charged_in: dict[int, int] = {}
        self._last_gen: dict[int, int] = {}
        self._pending: list = []
        self._pending_now = None
        self.max_charge = 0.0  # C: largest single-request charge seen
        # the GPU-seconds measure's C: the most GPU time one finished request was charged (s),
        # and what each request in flight has been charged so far
        self.max_gpu_charge = 0.0
        self._req_gpu: dict[int, float] = {}
        self.max_gap = 0.0  # largest |c_f - c_g| among backlogged tenants observed
        self.lifts = 0
        self.windows: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    # ---- delegation --------------------------------------------------------------------------
    def bind(self, classes, seed) -> None:
        if hasattr(self.inner, "bind"):
            self.inner.bind(classes, seed)

    def next_change(self, now: float):
        return self.inner.next_change(now)

    def share(self, tenant: str) -> float:
        return self.shares.get(tenant, 1.0)

    def waiting_queues(self) -> "TenantQueues | None":
        """The engine's waiting set as per-(class, tenant) queues (see :class:`TenantQueues`),
        when this wrapper orders tenants over an inner policy whose keys never change on their
        own; None otherwise (the engine keeps one heap and re-keys it before every plan)."""
        inner = self.inner
        static = (not getattr(inner, "dynamic", False) and not getattr(inner, "needs_prefix_info", False)
                  and getattr(type(inner), "next_change", None) is BasePolicy.next_change)
        return TenantQueues(self) if self.enabled and static else None

    def counter(self, tenant: str) -> float:
        self._flush()
        return (self.gpu if self.measure == "gpu_seconds" else self.tok)[tenant]

    def key(self, req, now: float) -> tuple:
        if not self.enabled:
            return self.inner.key(req, now)
        if self._pending:
            self._flush()
        c = (self.gpu if self.measure == "gpu_seconds" else self.tok)[req.tenant]
        return (req.priority, c, *self.inner.key(req, now))

    # ---- books -------------------------------------------------------------------------------
    def allowance(self, tenant: str, gpu: bool = False) -> float:
        """U_t: the most charge tenant t can have in flight, normalised by its share; ``gpu``:
        in GPU-seconds (the most one request was charged, as far as any has finished)."""
        n = min(self.max_num_seqs, self.max_conc.get(tenant, self.max_num_seqs))
        return n * (self.max_gpu_charge if gpu else self.max_charge) / self.share(tenant)

    def on_arrival(self, req, now: float) -> None:
        self._flush()
        t = req.tenant
        self.max_charge = max(self.max_charge, self.wp * req.prompt_tokens + self.wo * req.max_tokens)
        if self.waiting_n[t] == 0:
            backlogged = [u for u, n in self.waiting_n.items() if n > 0 and u != t]
            if backlogged:
                for ctr, gpu in ((self.tok, False), (self.gpu, True)):
                    m = min(ctr[u] for u in backlogged)
                    hi = m + self.allowance(t, gpu)
                    new = min(max(ctr[t], m), hi)
                    if new != ctr[t] and ctr is self._ordering():
                        self.lifts += 1
                    ctr[t] = new
        self.waiting_n[t] += 1
        self.active_n[t] += 1
        self._waiting.add(req.request_id)
        self._charged_in[req.request_id] = req.computed  # (a decode replica's: the whole prompt)
        # a disaggregated decode replica's request was prefilled elsewhere, where the token it
        # sampled was charged: its landing here emits that token again, not a new one
        self._last_gen[req.request_id] = req.generated + (req.computed >= req.prompt_tokens)
        self.inner.on_arrival(req, now)

    def _ordering(self):
        return self.gpu if self.measure == "gpu_seconds" else self.tok

    def on_preempt(self, req, now: float) -> None:
        self._flush()
        if req.request_id not in self._waiting:
            self._waiting.add(req.request_id)
            self.waiting_n[req.tenant] += 1
        self.inner.on_preempt(req, now)

    def on_finish(self, req, now: float) -> None:
        self._flush()
        rid = req.request_id
        if rid in self._waiting:  # pragma: no cover - finishes are always running
            self._waiting.discard(rid)
            self.waiting_n[req.tenant] -= 1
        self.active_n[req.tenant] -= 1
        self._charged_in.pop(rid, None)
        self._last_gen.pop(rid, None)
        self.max_gpu_charge = max(self.max_gpu_charge, self._req_gpu.pop(rid, 0.0))
        self.inner.on_finish(req, now)

    def on_scheduled(self, req, tokens: int, service_s: float, now: float) -> None:
        # the output tokens this step emitted are read now: the next step's apply moves
        # ``generated`` on before the books of this one are flushed (by the next step's calls)
        rid = req.request_id
        out = req.generated - self._last_gen.get(rid, 0)
        self._last_gen[rid] = req.generated
        self._book(req, self._prompt_part(req, req.computed - tokens, tokens), tokens, out, service_s, now)
        self.inner.on_scheduled(req, tokens, service_s, now)

    def _prompt_part(self, req, before: int, tokens: int) -> int:
        """The prompt tokens, not charged before, among ``tokens`` processed from position
        ``before`` (the tokens computed before the step); moves the request's charged mark."""
        rid = req.request_id
        mark = self._charged_in.get(rid, 0)
        end = min(before + tokens, req.prompt_tokens)
        pre = end - max(before, mark)
        if pre <= 0:
            return 0
        self._charged_in[rid] = end
        return pre

    def on_scheduled_run(self, items: list, start_ns: int, durations: list[int]) -> None:
        """A fast-forwarded run of ``len(durations)`` steps (integer ns, the first starting at
        ``start_ns``), booked step by step as stepping books them: each step charged to the
        window of its own end, its seconds split among the requests in it, the counter gap
        checked after it. ``items``: ``(request, tokens of the first step, steps it takes part
        in)`` in the plan's order; after the first step each emits one token a step. The
        inner policy is told as the engine would tell it: its own ``on_scheduled_run``, else
        ``on_scheduled`` once per request with the run's totals."""
        outs, pres = [], []
        for req, tokens, kk in items:
            rid = req.request_id
            outs.append(req.generated - self._last_gen.get(rid, 0) - (kk - 1))  # the first step's
            self._last_gen[rid] = req.generated
            # (its later steps decode: one token each, computed after the first step's)
            pres.append(self._prompt_part(req, req.computed - (kk - 1) - tokens, tokens))
        end = start_ns
        for j, d in enumerate(durations):
            end += d
            service_s, now = d / NS, end / NS  # (as stepping passes them)
            for (req, tokens, kk), out, pre in zip(items, outs, pres):
                if j == 0:
                    self._book(req, pre, tokens, out, service_s, now)
                elif j < kk:
                    self._book(req, 0, 1, 1, service_s, now)
        inner_run = getattr(self.inner, "on_scheduled_run", None)
        if inner_run is not None:
            inner_run(items, start_ns, durations)
            return
        for req, tokens, service_s, end_s in run_totals(items, start_ns, durations):
            self.inner.on_scheduled(req, tokens, service_s, end_s)

    def _book(self, req, pre: int, tokens: int, out: int, service_s: float, now: float) -> None:
        """Queue one request's share of the step that ends at ``now`` (s): ``tokens`` processed,
        ``pre`` of them prompt tokens charged, ``out`` output tokens emitted, in a ``service_s``
        s step. A step's requests are charged
        together (:meth:`_flush`) once the next step's are booked, or before anything reads a
        counter."""
        if self._pending and now != self._pending_now:
            self._flush()
        self._pending_now = now
        self._pending.append((req, pre, tokens, out, service_s))

    def _flush(self) -> None:
        """Charge the last step's requests (GPU time split by tokens processed)."""
        items = self._pending
        if not items:
            return
        self._pending = []
        now = self._pending_now
        total = sum(e[2] for e in items) or 1
        win = self.windows[int(now // self.window_s)] if self.window_s > 0 else None
        for req, pre, tokens, out, service_s in items:
            rid = req.request_id
            t = req.tenant
            sh = self.share(t)
            if rid in self._waiting:  # first step since it was queued: admitted
                self._waiting.discard(rid)
                self.waiting_n[t] -= 1
            charge = self.wp * pre + self.wo * out
            gpu = service_s * tokens / total
            self._req_gpu[rid] = self._req_gpu.get(rid, 0.0) + gpu
            self.raw_tok[t] += charge
            self.raw_gpu[t] += gpu
            self.tok[t] += charge / sh
            self.gpu[t] += gpu / sh
            if win is not None:
                win[t] += charge
        back = [u for u, n in self.waiting_n.items() if n > 0]
        if len(back) >= 2:
            ctr = self._ordering()
            vals = [ctr[u] for u in back]
            gap = max(vals) - min(vals)
            if gap > self.max_gap:
                self.max_gap = gap

    def bound(self) -> float:
        """2 * max_t U_t: the bound on |c_f - c_g| between backlogged tenants (token measure)."""
        tenants = set(self.active_n) | set(self.shares)
        return 2.0 * max((self.allowance(t) for t in tenants), default=0.0)

    def report(self) -> dict:
        self._flush()
        inner = self.inner.report() if hasattr(self.inner, "report") else {}
        tot_tok = sum(self.raw_tok.values()) or 1.0
        tot_gpu = sum(self.raw_gpu.values()) or 1.0
        out = dict(inner)
        out["fairness"] = {
            "enabled": self.enabled,
            "measure": self.measure,
            "prompt_price": self.wp,
            "output_price": self.wo,
            "window_s": self.window_s,
            "lifts": self.lifts,
            "max_counter_gap": self.max_gap,
            "counter_gap_bound": self.bound() if self.measure == "tokens" else None,
            "tenants": {t: {"share_weight": self.share(t), "tokens_charged": self.raw_tok[t],
                            "token_share": self.raw_tok[t] / tot_tok, "gpu_s": self.raw_gpu[t],
                            "gpu_share": self.raw_gpu[t] / tot_gpu, "counter": self._ordering()[t]}
                        for t in sorted(set(self.raw_tok) | set(self.active_n))},
            "windows": [{"start_s": w * self.window_s, **{t: v for t, v in sorted(d.items())}}
                        for w, d in sorted(self.windows.items())],
        }
        return out


class TenantQueues:
    """The waiting set under the fairness accountant, without re-keying every waiting request.

    A waiting request's key is ``(class priority, tenant counter, *inner key)``; only the counter
    moves between plans, and it is the same for every request of a tenant. So the requests wait
    in one heap per (class priority, tenant), ordered by ``(inner key, seq)``, which never changes
    while they wait, and the head of the whole set is the least of the heaps' heads under the
    current counters (as VTC picks among tenants' queues). A re-key costs nothing, a peek
    O(queues), a push or pop O(log n): a plan touches O(tenants), not O(waiting).

    The engine uses it as it uses its heap of ``(key, seq, request)`` entries: ``push``, ``pop``,
    ``[0]`` (the head, its key current), ``len`` and iteration (every entry, keys current). The
    order is the heap's: entries compare by ``(key, seq)`` and the keys are the same values.
    """

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.queues: dict[tuple, list] = {}  # (priority, tenant) -> heap of (inner key, seq, request)
        self.n = 0
        self._head: tuple | None = None  # the current head entry (cached until anything changes)

    def _ctr(self):
        f = self.fair
        if f._pending:
            f._flush()
        return f.gpu if f.measure == "gpu_seconds" else f.tok

    def push(self, entry: tuple) -> None:
        key, seq, req = entry
        q = self.queues.get((req.priority, req.tenant))
        if q is None:
            q = self.queues[(req.priority, req.tenant)] = []
        heapq.heappush(q, (key[2:], seq, req))  # the key without (priority, counter)
        self.n += 1
        self._head = None

    def rekey(self) -> None:
        """The counters may have moved: the head is recomputed when next asked for."""
        self._head = None

    def _best(self) -> tuple:
        ctr = self._ctr()
        best = None
        best_q = None
        for (prio, tenant), q in self.queues.items():
            inner, seq, req = q[0]
            cand = ((prio, ctr[tenant], *inner), seq)
            if best is None or cand < best:
                best, best_q = cand, q
        assert best is not None and best_q is not None
        req = best_q[0][2]
        req.key = best[0]
        return (best[0], best[1], req)

    def __getitem__(self, i: int) -> tuple:
        if i != 0:
            raise IndexError("only the head of the waiting set can be read by position")
        if self._head is None:
            if not self.n:
                raise IndexError("the waiting set is empty")
            self._head = self._best()
        return self._head

    def pop(self) -> tuple:
        head = self[0]
        req = head[2]
        q = self.queues[(req.priority, req.tenant)]
        heapq.heappop(q)
        if not q:
            del self.queues[(req.priority, req.tenant)]
        self.n -= 1
        self._head = None
        return head

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        ctr = self._ctr()
        for (prio, tenant), q in self.queues.items():
            c = ctr[tenant]
            for inner, seq, req in q:
                yield ((prio, c, *inner), seq, req)
