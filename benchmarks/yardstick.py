"""The yardstick every benchmark ratio is stated against: a fixed pure-Python discrete-event
workload, timed in the same run as the project, so that a speed target can be a ratio on a noisy
shared machine. An M/M/1 queue of 1M customers driven by a heapq event list (2M events), then
SimPy's own event loop on 200k timeouts. Prints seconds.

    python -m benchmarks.yardstick

The team's shared yardstick, kept here so the project owns it. Its code stays exactly as it is
(module-level loops, as written): a change would change its speed, and ratios measured before and
after would stop being comparable.
"""
import heapq
import random
import time

import simpy

if __name__ == "__main__":  # (the workload runs when called, not on import)
    t0 = time.perf_counter()
    rng = random.Random(1)
    ev, t, busy, q, done = [], 0.0, False, 0, 0
    for _ in range(1):
        heapq.heappush(ev, (rng.expovariate(0.8), 0))
    while done < 1_000_000:
        t, kind = heapq.heappop(ev)
        if kind == 0:
            heapq.heappush(ev, (t + rng.expovariate(0.8), 0))
            if busy:
                q += 1
            else:
                busy = True
                heapq.heappush(ev, (t + rng.expovariate(1.0), 1))
        else:
            done += 1
            if q:
                q -= 1
                heapq.heappush(ev, (t + rng.expovariate(1.0), 1))
            else:
                busy = False
    env = simpy.Environment()


    def proc(env):
        for _ in range(200_000):
            yield env.timeout(1)


    env.process(proc(env))
    env.run()
    print(f"{time.perf_counter() - t0:.2f}")
