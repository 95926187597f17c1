"""Prefix caching: named, reference-counted KV block groups shared by requests.

Requests may carry prefix hashes (``hash_ids``): one id per ``group_tokens`` prompt tokens
(512 in the Mooncake traces), equal ids meaning an identical prefix up to and including that
group. A group is cached once a request has computed its tokens; a later request whose prompt
starts with cached groups reuses them and prefills only the rest.

Model:
    * a group occupies ``group_blocks = group_tokens / block_size`` device blocks;
    * ``refs[h]`` counts the running requests using group ``h``; while > 0 it cannot be evicted;
    * a group whose count drops to 0 stays cached and joins the LRU list; when the pool needs
      blocks, the least recently released groups are evicted first. A request releases its
      groups tail first, so its tail is evicted before its head (vLLM's order) and a victim
      that resumes soon re-hits most of its prefix;
    * only full groups inside the prompt are shared, and at least one prompt token is always
      prefilled (the model must produce the next token's logits).

Attribution. Each group in the LRU list remembers who dropped its last reference (``owner``:
the engine passes (class index, tenant, request id)) and whether that was a preemption (the
group would still be pinned had its holder kept running) or an ordinary finish. An eviction is
booked to that owner and cause ("preemption" or "pressure"), and a later request that misses an
evicted group (:meth:`missed_after_eviction`) charges its tokens to the group's last eviction:
as the owner's own re-prefill when it is the owner itself coming back, else as re-prefill
pushed onto others. ``attribution`` holds, per (owner class, owner tenant, cause),
[evictions, own re-prefill tokens, re-prefill tokens pushed onto others].

Invariant (checked with the pool's): cached blocks = groups x group_blocks, and every group
with refs > 0 is held by exactly that many running requests.
"""
from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    def __init__(self, group_tokens: int, block_size: int) -> None:
        if group_tokens % block_size:
            raise ValueError(f"engine.prefix_block_tokens ({group_tokens}) must be a multiple of "
                             f"engine.block_size ({block_size})")
        self.group_tokens = group_tokens
        self.group_blocks = group_tokens // block_size
        self.refs: dict[int, int] = {}
        # groups with refs == 0, oldest first -> (owner, released by a preemption)
        self.lru: OrderedDict[int, tuple] = OrderedDict()
        self.ever_evicted: dict[int, tuple] = {}  # group -> its last eviction's (owner, by preemption)
        self.evictions = 0
        self.attribution: dict[tuple, list[int]] = {}  # (class, tenant, cause) -> [evictions, own, others]

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def cached_blocks(self) -> int:
        return len(self.refs) * self.group_blocks

    @property
    def evictable_blocks(self) -> int:
        return len(self.lru) * self.group_blocks

    def full_groups(self, prompt_tokens: int, hash_ids) -> int:
        """Groups of this prompt that may be shared (full, and leaving >= 1 token to prefill)."""
        return min(len(hash_ids), (prompt_tokens - 1) // self.group_tokens)

    # ---- lookups -------------------------------------------------------------------------
    def hit_groups(self, prompt_tokens: int, hash_ids) -> int:
        """Length of the longest cached prefix of this prompt, in groups (no side effects)."""
        n = self.full_groups(prompt_tokens, hash_ids)
        refs = self.refs
        i = 0
        while i < n and hash_ids[i] in refs:
            i += 1
        return i

    def acquire(self, hash_ids, groups: int) -> tuple[int, ...]:
        """Take a reference on the first ``groups`` groups; returns their ids."""
        held = tuple(hash_ids[:groups])
        for h in held:
            c = self.refs[h]
            if c == 0:
                del self.lru[h]
            self.refs[h] = c + 1
        return held

    def missed_after_eviction(self, prompt_tokens: int, hash_ids, hit: int, payer: int | None = None) -> int:
        """Groups beyond the hit that had been cached once and were evicted. With ``payer`` (the
        request id that will prefill them again) their tokens are charged to the evictions."""
        n = self.full_groups(prompt_tokens, hash_ids)
        missed = [h for h in hash_ids[hit:n] if h in self.ever_evicted]
        if payer is not None:
            for h in missed:
                owner, preempted = self.ever_evicted[h]
                row = self._book(owner, preempted)
                own = owner is not None and owner[2] == payer
                row[1 if own else 2] += self.group_tokens
        return len(missed)

    def _book(self, owner, preempted: bool) -> list[int]:
        key = (None, None) if owner is None else (owner[0], owner[1])
        k = (*key, "preemption" if preempted else "pressure")
        row = self.attribution.get(k)
        if row is None:
            row = self.attribution[k] = [0, 0, 0]
        return row

    def publish(self, h: int) -> bool:
        """A request computed group ``h`` and offers it; True if it became a cached group
        (held by that request), False if the id is already cached (the request keeps its copy)."""
        if h in self.refs:
            return False
        self.refs[h] = 1
        return True

    def release(self, held: tuple[int, ...] | list[int], owner: tuple | None = None,
                preempted: bool = False) -> None:
        """Drop one reference on each group, tail first (so tails are evicted first). ``owner``
        and ``preempted``: who drops them and why (for attribution, see the module docstring)."""
        for h in reversed(held):
            c = self.refs[h] - 1
            if c < 0:
                raise AssertionError(f"prefix group {h}: reference count below zero")
            self.refs[h] = c
            if c == 0:
                self.lru[h] = (owner, preempted)

    def evict_one(self) -> int:
        """Evict the least recently released unreferenced group; returns blocks freed."""
        h, why = self.lru.popitem(last=False)
        del self.refs[h]
        self.ever_evicted[h] = why
        self.evictions += 1
        self._book(*why)[0] += 1
        return self.group_blocks

    def attribution_rows(self) -> list[tuple]:
        """(owner class index, tenant, cause, evictions, own re-prefill tokens, tokens pushed
        onto others), sorted."""
        return sorted(((c, t, cause, *v) for (c, t, cause), v in self.attribution.items()),
                      key=lambda r: (r[0] if r[0] is not None else -1, str(r[1]), r[2]))
