"""Timing loops that give a step's duration the way a serving engine experiences it.

Each measurement warms up (first calls pay allocator, kernel selection and cache misses), then
repeats the call and keeps every duration; the row records the median with p10 and p90.

* CUDA: durations come from CUDA events recorded around the call on the current stream and read
  after ``torch.cuda.synchronize()``, so host launch overhead that overlaps with device work is not
  double-counted and queued work is not missed.
* CPU: the calling thread's CPU time (``time.thread_time``) around the call, by default, or
  wall time (``time.perf_counter``) with ``CPU_CLOCK = "wall"``. :func:`configure_cpu` pins
  torch to one thread, so all of a step's work runs on the calling thread and its CPU time is
  the step's cost; on a shared machine, wall time also counts the slices other processes got
  while the step waited for a core (it varied 2-3x within minutes here), CPU time does not.
  On a 2-core machine the default thread count makes steps tens of times slower and noisy,
  and a one-thread replica is what a CPU profile then describes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


#: How CPU steps are clocked: "thread" (CPU time of the calling thread) or "wall".
CPU_CLOCK = "thread"


def cpu_clock() -> Callable[[], float]:
    """The CPU-side clock (seconds) selected by :data:`CPU_CLOCK`."""
    return time.thread_time if CPU_CLOCK == "thread" else time.perf_counter


@dataclass(frozen=True)
class Timing:
    """Durations of repeated calls, in seconds."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int

    def as_row(self) -> dict:
        return {"time_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s,
                "repeats": self.repeats}


def keep_heap_pages() -> bool:
    """Make glibc malloc keep freed memory instead of returning it to the OS.

    PyTorch's CPU tensors come straight from malloc. By default glibc serves large blocks by
    ``mmap`` and trims the heap top after frees, so a step whose activations are larger than the
    previous step's page-faults on fresh memory: in the serving loop, where sizes change every
    step, prefill steps then ran 15-20% slower than the same steps timed in the grid. Raising
    the mmap and trim thresholds gives the process a heap that keeps its pages, which is what
    GPU serving engines get from a caching allocator. Returns False where glibc is absent.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    ok = mallopt(M_MMAP_THRESHOLD, 32 * 2**20)   # glibc's maximum on 64-bit
    ok &= mallopt(M_TRIM_THRESHOLD, 2**30)
    return bool(ok)


def configure_cpu(threads: int = 1) -> int:
    """Pin intra-op threads (and inter-op, where still allowed) and keep heap pages
    (:func:`keep_heap_pages`); returns the thread count."""
    keep_heap_pages()
    torch.set_num_threads(threads)
    set_interop = getattr(torch, "set_num_interop_threads", None)
    try:
        if set_interop is not None:
            set_interop(threads)
    except RuntimeError:
        pass  # can only be set once per process, before any parallel work
    return torch.get_num_threads()


def summarize(samples: list[float] | np.ndarray) -> Timing:
    a = np.asarray(samples, dtype=np.float64)
    return Timing(float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90)), len(a))


def time_call(fn: Callable[[], object], device: torch.device | str, warmup: int = 2,
              repeats: int = 5, min_time_s: float = 0.0, max_repeats: int = 1000) -> Timing:
    """Time ``fn()`` on ``device``: ``warmup`` discarded calls, then at least ``repeats`` timed
    ones (more, up to ``max_repeats``, until ``min_time_s`` of timed calls have passed)."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        total = 0.0
        while len(samples) < repeats or (total < min_time_s and len(samples) < max_repeats):
            dt = time_once(fn, device)
            samples.append(dt)
            total += dt
        return summarize(samples)
    clock = cpu_clock()
    t_end = time.perf_counter() + min_time_s
    while len(samples) < repeats or (time.perf_counter() < t_end and len(samples) < max_repeats):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return summarize(samples)


def time_once(fn: Callable[[], object], device: torch.device | str) -> float:
    """Seconds one call of ``fn()`` takes (CUDA events on a GPU, :func:`cpu_clock` on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    clock = cpu_clock()
    t0 = clock()
    fn()
    return clock() - t0


def time_interleaved(fns: list[Callable[[], object]], device: torch.device | str, warmup: int = 2,
                     rounds: int = 7) -> list[Timing]:
    """Time several calls round-robin: each round calls every ``fn`` once.

    A serving engine never runs the same step twice in a row; repeating one call keeps its
    working set hot and measures it optimistically (about 10-15% on a CPU). Round-robin also
    spreads slow drifts of a shared machine's load evenly over all cells.
    """
    device = torch.device(device)
    for _ in range(warmup):
        for f in fns:
            f()
    synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, f in enumerate(fns):
            samples[i].append(time_once(f, device))
    return [summarize(s) for s in samples]


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
