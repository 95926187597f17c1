"""The lazily-advanced decode batch: steady decoders the engine does not touch step by step.

A running request that emitted a token at the end of the last step and decodes one token in
every following step changes in a fully predictable way: each step adds one to its computed,
generated and known tokens, the step's duration to its attained service (and as an inter-token
gap), and every ``block_size`` tokens one KV block. Updating each such request every step is
O(batch) Python work per engine event, the floor the profile showed. Instead the engine keeps
them in a :class:`DecodeCohort` that advances with one counter, ``steps`` (cohort steps taken,
``g`` below). A member records ``g`` (as its ``cohort_base_step``, ``g0`` below) and its own
fields when it joins (or is last synced); its true fields are those plus ``g - g0`` steps,
brought up to date (:meth:`DecodeCohort.sync`) only when someone needs to look: when it
finishes, and for every member when a preemption, a policy re-key, an admission gate's estimate
or the end of the run needs them.

What the engine needs per step stays O(classes x block_size), whatever the batch size:

* decoders per class (the step's shape, and which classes' KV reservations apply);
* the sum of decode contexts of the next step: ``sum(c0 - g0) + D * (g + 1)``;
* the KV blocks a step needs: a member needs one in the step that starts with
  ``computed % block_size == 0``, i.e. in cohort step ``g`` with
  ``g % block_size == (g0 - c0) % block_size``, so counts per (class, residue) answer
  "how many blocks do steps g .. g+k-1 need" for any k;
* who emits a last token when: members sorted by the cohort step that ends with their last
  token, so a fast-forwarded run can go on past them (the batch shrinks at known steps);
* a member's largest inter-token gap: a monotone stack of step durations answers "largest
  duration of cohort steps j..g" by bisection.

Telemetry is kept as a log, not per step: every cohort step's duration (and each run's start
time), and each member's span of steps (joined at, left at, class, tenant). At the end of the
run :meth:`sim.core.telemetry.Telemetry.add_cohort` turns the log into tokens per interval and
inter-token gaps with numpy.

Exactness: members' fields after a sync equal what stepping them one by one gives (the same
integer additions); ``engine.lazy_batch = false`` keeps no cohort, and the tests assert
identical request tables both ways for every policy and preemption mode.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from typing import Final

from sim.core.costs import NS
from sim.core.plan import NO_PRIORITY, least_urgent, rank
from sim.core.request import Request

NOT_MEMBER: Final = -1  # Request.cohort_base_step of a request outside the cohort


class DecodeCohort:
    """Steady decoders advanced together (see the module docstring).

    Args:
        n_classes: number of scenario classes.
        block_size: tokens per KV block.
        grows_blocks: False when preemption is off (blocks are taken whole at admission).
        class_priority: each class's priority (default: all equal), for :meth:`least_urgent`.
    """

    def __init__(self, n_classes: int, block_size: int, grows_blocks: bool,
                 class_priority: list[int] | None = None) -> None:
        self.bs = block_size
        self.grows = grows_blocks
        self.steps = 0  # cohort steps taken
        self.steps_allocated = 0  # steps whose KV blocks have been allocated (``steps``, or more inside a run)
        self.end_ns = -1  # end of the last cohort step
        self.svc_ns = 0  # total duration of cohort steps, ns
        self.n_classes = n_classes
        self.class_priority = list(class_priority) if class_priority is not None else [0] * n_classes
        self._no_members()
        # the log (see the module docstring): step h of the cohort is log_durs[h]
        self.log_durs = array("q")
        self.log_run_at = array("q")  # first step of each run ...
        self.log_run_ns = array("q")  # ... and when it started
        # each member's span (:meth:`_log_span`): four values a span, read as log_j0 .. log_tenant
        self.log_spans = array("q")
        self.tenant_ids: dict[str, int] = {}
        # steps the members sat out (:meth:`sit_out`): the cohort step they come before, and
        # how long they lasted (ns), added to that step's gap
        self.log_pause_at = array("q")
        self.log_pause_ns = array("q")

    def _no_members(self) -> None:
        """The per-member state of an empty cohort (the step counters and the log go on)."""
        self.members: dict[int, Request] = {}
        self.n_cls = [0] * self.n_classes
        self.residues = [[0] * self.bs for _ in range(self.n_classes)]
        # the same counts per (residue, class): the next step's blocks per class in one copy
        self.by_residue = [[0] * self.n_classes for _ in range(self.bs)]
        self.ctx_off = 0  # sum over members of (computed0 - g0)
        # (cohort step that ends with the member's last token, admit_seq, member), ascending
        self.finish: list[tuple[int, int, Request]] = []
        self._max_step: list[int] = []  # monotone stack of step durations: step index (increasing) ...
        self._max_dur: list[int] = []  # ... and duration (decreasing): max of steps >= index
        self._last: Request | None = None  # the member ranked last; None: not known
        # the least urgent priority of the members' classes; None: not known (it changes only
        # when a class's member count becomes or stops being zero)
        self._top: int | None = NO_PRIORITY
        self.pause_ns = 0  # time since the last cohort step spent in steps the members sat out

    def __len__(self) -> int:
        return len(self.members)

    # ---- membership ----------------------------------------------------------------------
    def join(self, r: Request) -> None:
        """``r`` emitted a token at the end of the last step and now decodes one per step; its
        blocks cover exactly its computed tokens (the engine checks both)."""
        g = self.steps
        r.cohort_base_step = r.cohort_join_step = g
        r.cohort_base_svc_ns = self.svc_ns
        self.members[r.request_id] = r
        ci = r.cls_idx
        n = self.n_cls[ci] = self.n_cls[ci] + 1
        if n == 1:
            self._top = None
        if self.grows:
            h = (g - r.computed) % self.bs
            self.residues[ci][h] += 1
            self.by_residue[h][ci] += 1
        self.ctx_off += r.computed - g
        insort(self.finish, (g + r.hidden_output_tokens - r.generated, r.admit_seq, r))
        last = self._last
        if last is not None and rank(r) > rank(last):
            self._last = r

    def leave(self, r: Request) -> None:
        """Member ``r`` leaves alone (synced; its blocks cover the steps allocated so far)."""
        self.sync(r)
        # its finish entry, found by bisection (a list.remove compares its way through the
        # list); no two members share an admit_seq, so (step, admit_seq) precedes exactly it
        f = self.finish
        i = bisect_left(f, (self.steps + r.hidden_output_tokens - r.generated, r.admit_seq))
        assert f[i][2] is r
        del f[i]
        self._leave(r)
        if not self.members:
            # the last member took the blocks of the step in progress with it (as dissolve
            # does): a later joiner must not count a step ahead that nobody allocated
            self.steps_allocated = self.steps
            self.pause_ns = 0

    def leave_all(self, rs: list[Request]) -> None:
        """Members ``rs`` leave together (each as :meth:`leave`; the finish order is rebuilt
        once)."""
        for r in rs:
            self.sync(r)
            self._leave(r)
        self.finish = [f for f in self.finish if f[2].cohort_base_step != NOT_MEMBER]
        if not self.members:
            self.steps_allocated = self.steps
            self.pause_ns = 0

    def _leave(self, r: Request) -> None:
        """Remove synced member ``r`` from the counts (its finish entry is the caller's)."""
        del self.members[r.request_id]
        ci = r.cls_idx
        n = self.n_cls[ci] = self.n_cls[ci] - 1
        if not n:
            self._top = None
        if self.grows:
            h = (r.cohort_base_step - r.computed) % self.bs
            self.residues[ci][h] -= 1
            self.by_residue[h][ci] -= 1
        self.ctx_off -= r.computed - r.cohort_base_step
        self._log_span(r)
        r.cohort_base_step = NOT_MEMBER
        if r is self._last:
            self._last = None

    def _done(self, r: Request, run_max: int) -> None:
        """Member ``r`` emitted its last token at the end of the current step, inside a run whose
        steps so far lasted at most ``run_max`` and are not on the step-duration stack yet:
        :meth:`sync` (its blocks cover its computed tokens) and :meth:`_leave` in one (the
        engine's most frequent way out; its finish entry is the caller's)."""
        g = self.steps
        g0 = r.cohort_base_step
        c0 = r.computed
        d = g - g0
        c = c0 + d
        if d:
            r.computed = c
            r.generated += d
            r.tokens += d
            r.attained_ns += self.svc_ns - r.cohort_base_svc_ns
            r.last_token_ns = self.end_ns
            r.last_scheduled_s = self.end_ns / NS
            m = self.max_duration_since(g0 + 1)
            if run_max > m:
                m = run_max
            if m > r.max_itl_ns:
                r.max_itl_ns = m
            r.cohort_base_svc_ns = self.svc_ns
        del self.members[r.request_id]
        ci = r.cls_idx
        n = self.n_cls[ci] = self.n_cls[ci] - 1
        if not n:
            self._top = None
        if self.grows:
            r.blocks = -(-c // self.bs) - r.base_blocks
            h = (g0 - c0) % self.bs
            self.residues[ci][h] -= 1
            self.by_residue[h][ci] -= 1
        self.ctx_off -= c0 - g0
        self._log_span(r)
        r.cohort_base_step = NOT_MEMBER
        if r is self._last:
            self._last = None

    def _log_span(self, r: Request) -> None:
        """``r`` emitted a token at the end of cohort steps cohort_join_step .. g-1."""
        tid = self.tenant_ids.get(r.tenant)
        if tid is None:
            tid = self.tenant_ids[r.tenant] = len(self.tenant_ids)
        # (one call on a flat array, not four appends; fromlist: faster than extend)
        self.log_spans.fromlist([r.cohort_join_step, self.steps, r.cls_idx, tid])

    @property
    def log_j0(self) -> array:
        """Each logged span's first step (the member joined at it)."""
        return self.log_spans[0::4]

    @property
    def log_j1(self) -> array:
        """Each logged span's end: the member emitted a token at the end of steps j0 .. j1-1."""
        return self.log_spans[1::4]

    @property
    def log_cls(self) -> array:
        """Each logged span's class index."""
        return self.log_spans[2::4]

    @property
    def log_tenant(self) -> array:
        """Each logged span's tenant, as its index in ``tenant_ids``."""
        return self.log_spans[3::4]

    def last_member(self) -> Request:
        """The member ranked last (largest rank key); the cohort must not be empty."""
        last = self._last
        if last is None:
            last = self._last = max(self.members.values(), key=rank)
        return last

    def least_urgent(self) -> int:
        """The least urgent (largest) priority of the members' classes (NO_PRIORITY when the
        cohort is empty): :func:`sim.core.plan.least_urgent` of the class counts, kept."""
        top = self._top
        if top is None:
            top = self._top = least_urgent(self.class_priority, self.n_cls)
        return top

    def keys_changed(self) -> None:
        """The policy re-keyed the running requests: the member ranked last is not known."""
        self._last = None

    def sync(self, r: Request, blocks_ahead: bool = True) -> None:
        """Bring member ``r``'s fields up to date and rebase it at the current step; its blocks
        cover the steps allocated so far (``blocks_ahead``) or just its computed tokens."""
        d = self.steps - r.cohort_base_step
        if d:
            r.computed += d
            r.generated += d
            r.tokens += d
            r.attained_ns += self.svc_ns - r.cohort_base_svc_ns
            r.last_token_ns = self.end_ns
            r.last_scheduled_s = self.end_ns / NS
            m = self.max_duration_since(r.cohort_base_step + 1)
            if m > r.max_itl_ns:
                r.max_itl_ns = m
            r.cohort_base_step = self.steps
            r.cohort_base_svc_ns = self.svc_ns
        if self.grows:
            ahead = self.steps_allocated - self.steps if blocks_ahead else 0
            r.blocks = -(-(r.computed + ahead) // self.bs) - r.base_blocks

    def blocks_of(self, rs: list[Request]) -> int:
        """Members ``rs``'s device blocks, summed, as :meth:`sync` would set them (not synced)."""
        if not self.grows:
            return sum([r.blocks for r in rs])
        ahead, bs = self.steps_allocated, self.bs
        return sum([-(-(r.computed + ahead - r.cohort_base_step) // bs) - r.base_blocks for r in rs])

    def sync_all(self) -> None:
        for r in self.members.values():
            self.sync(r)

    def dissolve(self) -> list[Request]:
        """Sync every member and empty the cohort; returns the former members."""
        out = list(self.members.values())
        for r in out:
            self.sync(r)
            self._log_span(r)
            r.cohort_base_step = NOT_MEMBER
        self.steps_allocated = self.steps  # blocks taken for a step in progress now belong to the requests
        self._no_members()
        return out

    # ---- what the next steps need ----------------------------------------------------------
    def context_sum(self) -> int:
        """Sum over members of (computed + 1): the decode contexts of the next step."""
        return self.ctx_off + len(self.members) * (self.steps + 1)

    def steps_to_last_token(self) -> int:
        """Cohort steps until the first member emits its last token (>= 1)."""
        return self.finish[0][0] - self.steps

    def steps_to_empty(self) -> int:
        """Cohort steps until every member has emitted its last token."""
        return self.finish[-1][0] - self.steps

    def next_step_blocks(self) -> list[int]:
        """KV blocks, per class, that the next cohort step needs."""
        if not self.grows:
            return [0] * len(self.n_cls)
        return self.by_residue[self.steps % self.bs][:]

    def blocks_needed(self, j0: int, j1: int) -> list[int]:
        """KV blocks, per class, that steps j0 .. j1-1 of a run starting now need if every
        member took part in all of them (an upper bound when some finish inside the run)."""
        if not self.grows or j1 <= j0:
            return [0] * len(self.n_cls)
        bs = self.bs
        full, part = divmod(j1 - j0, bs)
        a = (self.steps + j0) % bs
        b = a + part
        out = []
        for n, res in zip(self.n_cls, self.residues):
            if not n:
                out.append(0)
                continue
            t = full * n  # (plus the residues a .. b-1, wrapping at bs: a loop, not slices and sums)
            for h in range(a, b if b <= bs else bs):
                t += res[h]
            for h in range(b - bs):
                t += res[h]
            out.append(t)
        return out

    def run_blocks(self, k: int) -> list[int]:
        """KV blocks, per class, that steps 1 .. k-1 of a run starting now take: members whose
        last token comes earlier take none after it."""
        need = self.blocks_needed(1, k)
        if not self.grows:
            return need
        bs, g = self.bs, self.steps
        b = g + k
        for g_f, _, r in self.finish:
            if g_f >= b:
                break
            # cohort steps starting at counts h in [max(g_f, g+1), g+k) that it sits out
            res = (r.cohort_base_step - r.computed) % bs
            a = g_f if g_f > g else g + 1
            need[r.cls_idx] -= (b - 1 - res) // bs - (a - 1 - res) // bs
        return need

    # ---- advancing -------------------------------------------------------------------------
    def sit_out(self, ns: int) -> None:
        """The members sat out steps lasting ``ns`` (a prefill step of ``engine.batching =
        "prefill_first"``, which holds no decode): nothing of theirs changes but the gap before
        their next token, which the next cohort step's gap carries (:meth:`advance`). A request
        that emitted its first token at the end of such a step joins only after a cohort step
        (its gap before the next one is that step's alone)."""
        self.pause_ns += ns

    def advance(self, durations: list[int], start_ns: int) -> list[tuple[int, int, list[Request]]]:
        """Members took part in these steps (from ``start_ns``), each emitting a token at the end
        of every step up to its last. Returns where membership changed, as ``(steps done, end
        ns, leavers)``: the leavers' last token ended that step; they are synced and removed."""
        g0, n = self.steps, len(durations)
        self.log_run_at.append(g0)  # (== len(log_durs): one logged duration a step)
        self.log_run_ns.append(start_ns)
        self.log_durs.fromlist(durations)  # (fromlist: half the time of extend on a list)
        # the gaps before the members' tokens: the steps' durations, the first one after steps
        # they sat out (:meth:`sit_out`) that much longer
        pause = self.pause_ns
        gaps = durations
        if pause:
            self.pause_ns = 0
            self.log_pause_at.append(g0)
            self.log_pause_ns.append(pause)
            gaps = list(durations)
            gaps[0] += pause
        fin = self.finish
        changes: list[tuple[int, int, list[Request]]] = []
        t = start_ns
        i = 0  # steps of the run accounted for in t
        if fin and fin[0][0] - g0 <= n:
            # members leave inside the run: each group synced at the end of its last step, when
            # the step-duration stack still holds only steps before the run (it takes the
            # run's steps below, at once): a leaver's largest gap is the larger of the stack's
            # answer for its steps before the run and the largest of the run's steps so far
            svc0 = self.svc_ns - start_ns  # svc at time x within the run: svc0 + x
            # largest gap of the run's steps 0 .. e-1 (the first step is in every leaver's)
            top = gaps[0] if pause else 0
            while fin and fin[0][0] - g0 <= n:
                g = fin[0][0]
                e = g - g0
                for d in durations[i:e]:  # (a loop: sum and max are generic calls in the compiled build)
                    t += d
                    if d > top:
                        top = d
                i = e
                self.steps, self.end_ns, self.svc_ns = g, t, svc0 + t
                leavers = []
                while fin and fin[0][0] == g:
                    r = fin.pop(0)[2]
                    self._done(r, top)
                    leavers.append(r)
                changes.append((e, t, leavers))
            if i < n:
                t += sum(durations[i:])
            self.svc_ns = svc0 + t
        else:
            t += durations[0] if n == 1 else sum(durations)
            self.svc_ns += t - start_ns
        self.steps, self.end_ns = g0 + n, t
        mg, md = self._max_step, self._max_dur
        if not self.members:  # nobody left to ask
            mg.clear()
            md.clear()
            return changes
        # The run's steps go on the step-duration stack. What pushing them one at a time leaves
        # there (each popping the entries not longer than it) is: the entries longer than all of
        # them, then each step longer than every step after it (a record), found in one walk
        # back from the run's last step. Runs often have several (steps get shorter as members
        # leave): searching the rest for each record's maximum again cost 3 to 4 times as much.
        last = gaps[-1]
        m = last  # (the largest step after the one looked at)
        records: list[int] = []  # (from the last one back)
        p = n - 1
        for d in reversed(gaps):
            if d > m:
                records.append(p)
                m = d
            p -= 1
        while md and md[-1] <= m:
            md.pop()
            mg.pop()
        for p in reversed(records):
            mg.append(g0 + p + 1)
            md.append(gaps[p])
        mg.append(g0 + n)  # the run's last step: the last record
        md.append(last)
        if len(mg) > 4096:
            self._trim_max()
        return changes

    def _trim_max(self) -> None:
        """Keep only the part of the step-duration stack a current member can ask for."""
        mg, md = self._max_step, self._max_dur
        del mg[:bisect_left(mg, min(r.cohort_base_step for r in self.members.values()) + 1)]
        del md[:len(md) - len(mg)]

    def max_duration_since(self, j: int) -> int:
        """Largest duration of cohort steps j .. g (0 when there are none)."""
        i = bisect_left(self._max_step, j)
        return self._max_dur[i] if i < len(self._max_dur) else 0
