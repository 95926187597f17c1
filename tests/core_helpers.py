"""A bench for unit tests of the step rules: an engine built from a small dict, requests made by
hand, steps planned and applied one at a time, with no scenario, no SimPy process and no trace.

vLLM's scheduler tests build a ``Scheduler`` from a tiny config, add a few requests and call
``schedule()``; this is the same for :func:`sim.core.planner.plan`. A test reads, e.g.::

    b = Bench(kv_blocks=8, max_num_seqs=2)
    a, c = b.add("lo", prompt=16, output=4), b.add("hi", prompt=16, output=4)
    plan = b.plan()
    assert b.tokens(plan) == {c.request_id: 16, a.request_id: 16}

:class:`Bench` builds the engine the way :func:`sim.assembly.build_engine` does (KV pool with
per-class reservations, host space for the modes that swap, prefix cache, the policy from its
registry), with ``fast_forward`` off (a step is one event: the reference stepper). Test modules
import the :func:`both_ways` fixture, which runs each of their tests twice: with every running
request stepped (``lazy_batch = false``, the specification) and with steady decoders in the
cohort (the default engine); :meth:`Bench.tokens` reads both alike. ``env`` is None: the
planner, preemption and apply never read the clock; the bench keeps its own (``now``, ns).
Every preemption is logged with how it was done (:attr:`Bench.preempted`), since a plan counts
preemptions but does not name them.
"""
from __future__ import annotations

import pytest

from policies import make_policy
from sim.config import ClassConfig, EngineConfig
from sim.core.costs import load_profile
from sim.core.engine import Engine
from sim.core.kvpool import KVPool
from sim.core.plan import StepPlan
from sim.core.preemption import PREEMPTION_MODES
from sim.core.prefix_cache import PrefixCache
from sim.core.request import Request
from sim.core.telemetry import Telemetry

#: 1 ms a step plus 1 us a prefill token (a step's duration only orders events here; the
#: swap term makes swap cheaper than recompute for the ``auto`` mode's choice unless a test
#: prices it otherwise)
STEP_1MS = {"kind": "linear", "base_s": 1e-3, "prefill_token_s": 1e-6, "decode_token_s": 0.0,
            "context_token_s": 0.0, "swap_block_s": 1e-6}

#: the bench's engine settings unless a test gives its own: 4-token blocks, so block arithmetic
#: stays small enough to write out in a docstring
BASE = {"profile": STEP_1MS, "overhead": "none", "block_size": 4, "kv_blocks": 64, "max_num_seqs": 8,
        "max_batched_tokens": 256, "preempt_for_waiting": "never", "lazy_batch": False,
        "fast_forward": False}


@pytest.fixture(params=[False, True], ids=["stepped", "cohort"], autouse=True)
def both_ways(request, monkeypatch):
    """Run a test with the decode cohort off, then on (``engine.lazy_batch``), unless the test
    sets it itself; imported by a test module, it applies to each of its tests."""
    monkeypatch.setitem(BASE, "lazy_batch", request.param)
    return request.param


#: two classes: "hi" (priority 0, most urgent) and "lo" (priority 1)
TWO_CLASSES = ({"name": "hi", "priority": 0}, {"name": "lo", "priority": 1})


class Bench:
    """One engine and its clock, for tests that drive the planner step by step.

    Args:
        classes: class tables (``name``, ``priority``, optionally ``reserved_blocks``,
            ``max_prefill_tokens_per_step``, ``speculate``), as in a scenario's ``[[classes]]``.
        policy: a registered policy's name (or a policy object).
        **engine: ``[engine]`` keys over :data:`BASE` (checked by ``EngineConfig``).
    """

    def __init__(self, classes=TWO_CLASSES, policy="priority", **engine) -> None:
        cfg = EngineConfig(**{**BASE, **engine})
        self.classes = [ClassConfig(**c) for c in classes]
        self.cfg = cfg
        costs = load_profile(cfg.profile, overhead=cfg.overhead)
        cache = PrefixCache(cfg.prefix_block_tokens, cfg.block_size) if cfg.prefix_caching else None
        host = cfg.swap_blocks if PREEMPTION_MODES.resolve(cfg.preemption).host_space else 0
        pool = KVPool(cfg.kv_blocks, cfg.block_size, [c.priority for c in self.classes],
                      [c.reserved_blocks for c in self.classes], host_total=host, cache=cache)
        if isinstance(policy, str):
            policy = make_policy(policy)
            if hasattr(policy, "bind"):
                policy.bind({c.name: c.model_dump() for c in self.classes}, 0)
        self.tel = Telemetry([c.name for c in self.classes], 10**9, costs, cfg.block_size)
        self.tel.preempt_log = []  # (each preemption and how it was done: ``preempted``)
        self.eng = Engine(None, cfg, costs, policy, self.classes, pool, self.tel)
        self.now = 0  # ns
        self._next_id = 0
        self._cohort_ids: dict[int, tuple[StepPlan, list[int]]] = {}

    # ---- requests ----------------------------------------------------------------------------
    def request(self, cls: str, prompt: int, output: int, max_tokens: int | None = None, hash_ids=None,
                at_ns: int | None = None) -> Request:
        """A request of class ``cls`` (not yet arrived) with the next id (ids count up from 0 in
        the order requests are made), arriving now or at ``at_ns`` (which may be earlier: the
        arrival time only orders it); ``max_tokens`` defaults to ``output``."""
        idx = [c.name for c in self.classes].index(cls)
        rid = self._next_id
        self._next_id += 1
        arrival = self.now if at_ns is None else at_ns
        return Request(rid, arrival, cls, cls, idx, self.classes[idx].priority, prompt, output,
                       output if max_tokens is None else max_tokens, hash_ids=hash_ids)

    def arrive(self, r: Request) -> bool:
        """``r`` arrives now (the engine's arrival gate); False when it was rejected."""
        return self.eng.admit_arrival(r, self.now)

    def add(self, cls: str, prompt: int, output: int, max_tokens: int | None = None, hash_ids=None,
            at_ns: int | None = None) -> Request:
        """:meth:`request` and :meth:`arrive`: the request joins the waiting set (it must not be
        rejected)."""
        r = self.request(cls, prompt, output, max_tokens, hash_ids, at_ns)
        assert self.arrive(r), f"request {r.request_id} rejected at arrival: {r.reject_reason}"
        return r

    # ---- steps -------------------------------------------------------------------------------
    def plan(self) -> StepPlan:
        """Plan the next step (the policy re-ranked first, as the loop does); not applied."""
        self.eng.refresh_ranking(self.now)
        plan = self.eng.plan(self.now)
        coh = self.eng.cohort
        # the cohort's decoders in this step (a count in the plan; who they are is read now,
        # before applying the step changes the cohort)
        self._cohort_ids[id(plan)] = (plan, list(coh.members) if coh is not None and plan.cohort else [])
        return plan

    def apply(self, plan: StepPlan) -> None:
        """Price and apply ``plan`` as one step (the reference stepper), advance the clock, check
        the KV invariants."""
        eng = self.eng
        compute = eng.compute_ns(plan)
        dur = max(1, compute + eng.transfer_ns(plan))
        eng.apply(plan, self.now, [dur], compute)
        self.now += dur
        eng.check_invariants()

    def step(self) -> StepPlan:
        """Plan and apply one step; returns its plan."""
        plan = self.plan()
        self.apply(plan)
        return plan

    def steps(self, n: int) -> list[StepPlan]:
        """``n`` steps, one after another."""
        return [self.step() for _ in range(n)]

    # ---- reading a plan and the state --------------------------------------------------------
    def cohort_ids(self, plan: StepPlan) -> list[int]:
        """Ids of the cohort's decoders in ``plan`` (planned by this bench), one token each."""
        held, ids = self._cohort_ids[id(plan)]
        assert held is plan
        return ids

    def tokens(self, plan: StepPlan) -> dict[int, int]:
        """``{request id: tokens}`` of everyone in a plan: its items, and the cohort's decoders
        (1 token each), so a test reads the same with the cohort on or off."""
        out = {s.req.request_id: s.tokens for s in plan.items}
        out.update((i, 1) for i in self.cohort_ids(plan))
        return out

    @staticmethod
    def admitted(plan: StepPlan) -> list[int]:
        """Ids of the requests a plan admitted, in admission order."""
        return [s.req.request_id for s in plan.items if s.admitted]

    def decoding(self, plan: StepPlan) -> list[int]:
        """Ids of a plan's decoders: its decoding items, then the cohort's."""
        return [s.req.request_id for s in plan.items if s.decode] + self.cohort_ids(plan)

    @property
    def preempted(self) -> list[tuple[int, str]]:
        """Every preemption so far, ``(request id, how)``, in order."""
        return self.tel.preempt_log

    @property
    def running(self) -> list[int]:
        """Ids of the running requests, in admission order."""
        return list(self.eng.queues.running)

    @property
    def waiting(self) -> list[int]:
        """Ids of the waiting requests, in rank order."""
        return [r.request_id for _, _, r in sorted(self.eng.queues.waiting, key=lambda e: e[:2])]

    @property
    def free(self) -> int:
        """Free device blocks."""
        return self.eng.pool.free
