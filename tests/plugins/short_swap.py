"""A preemption mode in one file: swap a victim whose computed KV is short, recompute a long one.

Named in a scenario as ``engine.preemption = "tests.plugins.short_swap:ShortSwap"``.
"""
from sim.core.preemption import PreemptionMode

#: victims holding at most this many computed blocks are swapped (copies are cheap), the rest
#: recomputed
MAX_SWAP_BLOCKS = 8


class ShortSwap(PreemptionMode):
    """Swap a victim of at most MAX_SWAP_BLOCKS computed blocks (when the host space takes it)."""

    name = "short_swap"
    host_space = True  # (the scenario's engine.swap_blocks is its host pool)

    def how(self, eng, v) -> str:
        blocks = eng.pool.blocks_for(v.computed)
        if blocks > MAX_SWAP_BLOCKS:
            return "recompute"
        return "fallback" if blocks > eng.pool.host_free else "swap"
