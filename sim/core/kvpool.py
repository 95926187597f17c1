"""Paged KV-cache memory: device blocks with per-class reservations, and host swap space.

Model. The device holds ``total`` blocks of ``block_size`` tokens. A request holding ``c``
computed tokens holds ``ceil(c / block_size)`` blocks. Blocks are counted, not named: with no
prefix sharing, the identity of a block never matters to timing, and counting keeps every
operation O(1). (Prefix sharing adds named, reference-counted blocks on top of these counts.)

Reservations. A class may reserve ``reserved`` blocks that only it or a more urgent class may
use (the fix for priority inversion). A request of priority ``p`` may therefore use the
free blocks minus the still-unused reservations of every class *more urgent* than ``p``::

    available_for(p) = free - sum(max(0, reserved[c] - used[c]) for c with priority[c] < p)

Invariants (checked by :meth:`check`, asserted by the property tests):
    free + sum(used) + cached == total, 0 <= free, every per-class used >= 0,
    host_free + host_used == host_total.
"Does not fit" is a return value (``False``); a double free or negative count raises.
"""
from __future__ import annotations

from sim.core.errors import KVInvariantError  # noqa: F401  (re-exported)
from sim.core.request import Request


class KVPool:
    def __init__(self, total: int, block_size: int, class_priorities: list[int],
                 reserved: list[int], host_total: int = 0, cache=None) -> None:
        if total <= 0:
            raise ValueError(f"kv_blocks must be > 0 (got {total})")
        self.total = total
        self.block_size = block_size
        self.free = total
        self.prio = list(class_priorities)
        self.reserved = list(reserved)
        self.reserves = any(r > 0 for r in self.reserved)  # else ``available_for`` is the same for every priority
        self.used = [0] * len(class_priorities)
        self.host_total = host_total
        self.host_used = 0
        self.cache = cache  # a sim.core.prefix_cache.PrefixCache when prefix caching is on
        # classes strictly more urgent than priority p, precomputed per distinct priority
        self._more_urgent = {p: [c for c, q in enumerate(self.prio) if q < p and self.reserved[c] > 0]
                             for p in set(self.prio)}
        self._capacity: dict[int, int] = {}
        # no reservation and no cached groups: every free block is available to every class
        self.plain = cache is None and not self.reserves

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens (ceil division)."""
        return -(-tokens // self.block_size)

    def available_for(self, priority: int) -> int:
        """Blocks a request of this priority may take now (see the module docstring)."""
        if self.plain:
            return self.free
        held = -self.cache.evictable_blocks if self.cache is not None else 0
        for c in self._more_urgent.get(priority, ()):
            r = self.reserved[c] - self.used[c]
            if r > 0:
                held += r
        return self.free - held

    def capacity_for(self, priority: int) -> int:
        """Blocks a request of this priority could ever hold (empty pool)."""
        cap = self._capacity.get(priority)
        if cap is None:
            cap = self._capacity[priority] = self.total - sum(
                self.reserved[c] for c in self._more_urgent.get(priority, ()))
        return cap

    def allocate(self, cls_idx: int, n: int) -> None:
        """Take ``n`` blocks for class ``cls_idx``; the caller checked ``available_for``.
        Unreferenced cached prefix groups are evicted (LRU) when free blocks run short."""
        while n > self.free and self.cache is not None and self.cache.lru:
            self.free += self.cache.evict_one()
        if n < 0 or n > self.free:
            raise KVInvariantError(f"allocate {n} blocks with {self.free} free")
        self.free -= n
        self.used[cls_idx] += n

    def allocate_ahead(self, cls_idx: int, n: int, freeing: int) -> None:
        """Take ``n`` blocks for class ``cls_idx`` (a plain pool) while ``freeing`` more are still
        held by requests that ended inside a fast-forwarded run in flight and are freed when it
        is applied: until then ``free`` may be below zero (a disaggregated decode replica's
        reservation, :class:`sim.cluster.disagg.PDReplica`)."""
        if n < 0 or n > self.free + freeing or not self.plain:
            raise KVInvariantError(f"allocate {n} blocks with {self.free} free and {freeing} being freed")
        self.free -= n
        self.used[cls_idx] += n

    def allocate_each(self, blocks: list[int]) -> None:
        """Take ``blocks[c]`` blocks for each class ``c`` at once: the same as :meth:`allocate`
        class by class (the same cached groups evicted, as few as let the total fit), in one
        call (the decode cohort takes blocks for several classes every step)."""
        n = 0
        least = 0
        for b in blocks:  # (a loop: sum and min are generic calls in the compiled build)
            n += b
            if b < least:
                least = b
        if n == 0 and least == 0:
            return  # (nothing taken: fine even while ``free`` is below zero, see allocate_ahead)
        while n > self.free and self.cache is not None and self.cache.lru:
            self.free += self.cache.evict_one()
        if n > self.free or least < 0:
            raise KVInvariantError(f"allocate {blocks} blocks with {self.free} free")
        self.free -= n
        used = self.used
        for c, b in enumerate(blocks):
            if b:
                used[c] += b

    def release(self, cls_idx: int, n: int) -> None:
        if n < 0 or n > self.used[cls_idx]:
            raise KVInvariantError(f"release {n} blocks, class {cls_idx} holds {self.used[cls_idx]}")
        self.free += n
        self.used[cls_idx] -= n

    # ---- a request's blocks --------------------------------------------------------------
    def grow(self, r: Request, n: int) -> None:
        """Request ``r`` takes ``n`` more device blocks (the caller checked ``available_for``)."""
        self.allocate(r.cls_idx, n)
        r.blocks += n

    def release_request(self, r: Request, preempted: bool = False) -> None:
        """Free request ``r``'s own blocks and drop its references on shared prefix groups
        (``preempted``: for eviction attribution, see :mod:`sim.core.prefix_cache`)."""
        if r.blocks:
            self.release(r.cls_idx, r.blocks)
        r.blocks = 0
        if r.shared:
            self.cache.release(r.shared, (r.cls_idx, r.tenant, r.request_id), preempted)
            r.shared = ()
            r.base_blocks = 0

    def swap_out_request(self, r: Request) -> int:
        """Move ``r``'s computed blocks to host space (those taken for tokens not yet computed,
        and shared prefix groups, are released: the groups are copied too); returns the blocks
        copied."""
        keep = self.blocks_for(r.computed)
        self.release_request(r, preempted=True)
        self.to_host(keep)
        r.host_blocks = keep
        return keep

    def swap_in_request(self, r: Request) -> int:
        """Bring swapped-out ``r``'s blocks back to the device; returns the blocks copied."""
        n = r.host_blocks
        self.swap_in(r.cls_idx, n)
        r.blocks = n
        r.host_blocks = 0
        return n

    def acquire_prefix(self, r: Request, hit: int) -> None:
        """``r`` is admitted on top of its ``hit`` cached prefix groups: it holds them and their
        tokens count as computed (and, at its first admission, as its prefix hit)."""
        cache = self.cache
        r.shared = cache.acquire(r.hash_ids, hit)
        r.base_blocks = hit * cache.group_blocks
        r.computed = hit * cache.group_tokens
        if r.first_admit_ns < 0:
            r.prefix_hit_tokens = r.computed
        self.count_misses(r, hit)

    def count_misses(self, r: Request, hit: int) -> None:
        """``r``, admitted to prefill its prompt on ``hit`` cached groups (none too), prefills the
        groups after them that had been cached and were evicted again: counted on it, and their
        tokens charged to the evictions (the prefix cache's attribution)."""
        cache = self.cache
        missed = cache.missed_after_eviction(r.prompt_tokens, r.hash_ids, hit, r.request_id)
        r.evicted_miss_tokens += missed * cache.group_tokens

    def publish_prompt(self, r: Request, before: int) -> None:
        """Offer the prompt groups that ``r``'s prefill completed this step (it had ``before``
        tokens computed) to the prefix cache: each becomes a shared group it holds."""
        cache = self.cache
        g = cache.group_tokens
        n_full = cache.full_groups(r.prompt_tokens, r.hash_ids)
        lo, hi = before // g, min(r.computed // g, n_full)
        if lo >= hi or len(r.shared) != lo:
            return  # only extend an unbroken shared chain
        hashes = r.hash_ids
        new: list[int] = []
        for j in range(lo, hi):
            h = hashes[j]
            if not cache.publish(h):
                break  # (the chain stops at a group already cached)
            new.append(h)
        if new:
            # (the chain extended once: a tuple rebuilt per group cost O(groups^2), 1-token
            # groups made that hundreds of microseconds a prompt)
            n = len(new) * cache.group_blocks
            self.publish(r.cls_idx, n)
            r.blocks -= n
            r.base_blocks += n
            r.shared = (*r.shared, *new)

    # ---- host swap space ---------------------------------------------------------------
    @property
    def host_free(self) -> int:
        return self.host_total - self.host_used

    def to_host(self, n: int) -> None:
        """Store ``n`` blocks' copy in host space (the caller released the device side)."""
        if n > self.host_free:
            raise KVInvariantError(f"swap out {n} blocks with {self.host_free} host blocks free")
        self.host_used += n

    def swap_in(self, cls_idx: int, n: int) -> None:
        if n > self.host_used:
            raise KVInvariantError(f"swap in {n} blocks, host holds {self.host_used}")
        self.host_used -= n
        self.allocate(cls_idx, n)

    @property
    def cached(self) -> int:
        """Blocks held by cached prefix groups (shared; owned by no class)."""
        return self.cache.cached_blocks if self.cache is not None else 0

    def publish(self, cls_idx: int, n: int) -> None:
        """``n`` blocks a request of class ``cls_idx`` owned became a shared cached group."""
        if n > self.used[cls_idx]:
            raise KVInvariantError(f"publish {n} blocks, class {cls_idx} holds {self.used[cls_idx]}")
        self.used[cls_idx] -= n

    def check(self) -> None:
        if (self.free < 0 or self.free + sum(self.used) + self.cached != self.total
                or min(self.used, default=0) < 0):
            raise KVInvariantError(f"device blocks not conserved: free={self.free} used={self.used} "
                                   f"cached={self.cached} total={self.total}")
        if not 0 <= self.host_used <= self.host_total:
            raise KVInvariantError(f"host blocks not conserved: {self.host_used}/{self.host_total}")
