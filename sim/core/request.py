"""A request's lifecycle inside the engine.

States: WAITING (never run, or preempted by recompute) -> RUNNING -> FINISHED, or
RUNNING -> SWAPPED (KV on host) -> RUNNING, or REJECTED at arrival, or UNFINISHED at the horizon.

Token bookkeeping follows vLLM: ``tokens = prompt_tokens + generated`` is every token the request
knows; ``computed`` of them have KV in the cache. A step schedules ``tokens - computed`` tokens
(capped by the budget and chunk limit); when ``computed`` reaches ``tokens`` the model samples the
next output token. Prefill therefore ends by emitting the first token, and a request resumed by
recompute re-prefills its prompt plus everything generated so far, then samples its next token.

Times are integer nanoseconds inside the engine (``*_ns``) and float seconds for policies.
"""
from __future__ import annotations

import math

from sim.core.errors import OracleAccessError  # noqa: F401  (re-exported)
from sim.core.states import State  # noqa: F401  (re-exported)

NAN = math.nan
WAITING = State.WAITING  # (a module global reads about 8 times faster than an enum member, Python 3.11)


#: every attribute of a request, in the order a pickled one lists them (:meth:`Request.__reduce__`)
FIELDS: tuple[str, ...] = (
    # identity and declaration
    "request_id", "arrival_s", "arrival_ns", "tenant", "cls", "cls_idx", "priority",
    "prompt_tokens", "max_tokens", "hidden_output_tokens", "deadline_s", "stream", "user", "features",
    "predicted", "hash_ids", "reveals_output",
    # progress
    "state", "tokens", "computed", "generated", "blocks", "host_blocks", "key", "admit_seq",
    "first_token_ns", "last_token_ns", "finish_ns", "admitted_s", "last_scheduled_s",
    "attained_ns", "first_admit_ns",
    # lazily-advanced decode batch (sim.core.cohort): the cohort step and the cohort's service
    # (ns) its fields were last brought up to date at (-1: not a member), the step it joined at
    "cohort_base_step", "cohort_base_svc_ns", "cohort_join_step",
    # speculative decoding: its own draft acceptance rate when drawn per request (-1: not drawn)
    "spec_acceptance",
    # accounting
    "preemptions", "recomputed_tokens", "swapped_blocks", "swap_fallbacks", "max_itl_ns",
    "reject_reason",
    # prefix caching: shared groups held, their blocks, tokens hit at first admission,
    # tokens prefilled again because a group they needed had been evicted
    "shared", "base_blocks", "prefix_hit_tokens", "evicted_miss_tokens",
)


class Request:
    """One request: what the workload declared, what a scheduler may see, and its progress.

    ``true_output_tokens`` is readable only when the engine's policy is an oracle; every other
    field is what a real scheduler would know (policies never read the true output length).
    """

    __slots__ = FIELDS

    def __init__(self, request_id: int, arrival_ns: int, tenant: str, cls: str, cls_idx: int,
                 priority: int, prompt_tokens: int, output_tokens: int, max_tokens: int,
                 deadline_s: float = NAN, stream: int = -1, user: int = -1,
                 features: dict | None = None, hash_ids=None) -> None:
        self.request_id = request_id
        self.arrival_ns = arrival_ns
        self.arrival_s = arrival_ns / 1e9
        self.tenant = tenant
        self.cls = cls
        self.cls_idx = cls_idx
        self.priority = priority
        self.prompt_tokens = prompt_tokens
        # the true output length: the engine and telemetry read it; policies only as oracles
        self.hidden_output_tokens = output_tokens
        self.max_tokens = max_tokens
        self.deadline_s = deadline_s
        self.stream = stream
        self.user = user
        self.features = features if features is not None else {}
        self.predicted: dict = {}
        self.hash_ids = hash_ids
        self.reveals_output = False  # true_output_tokens readable: set by the engine for an oracle policy
        self.state = WAITING
        self.tokens = prompt_tokens
        self.computed = 0
        self.generated = 0
        self.blocks = 0
        self.host_blocks = 0
        self.key: tuple = ()
        self.admit_seq = -1
        self.first_token_ns = -1
        self.last_token_ns = -1
        self.finish_ns = -1
        self.first_admit_ns = -1
        self.admitted_s = NAN
        self.last_scheduled_s = NAN
        self.attained_ns = 0
        self.cohort_base_step = -1
        self.cohort_base_svc_ns = 0
        self.cohort_join_step = -1
        self.spec_acceptance = -1.0
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_blocks = 0
        self.swap_fallbacks = 0
        self.max_itl_ns = 0
        self.reject_reason = ""
        self.shared: tuple[int, ...] = ()
        self.base_blocks = 0
        self.prefix_hit_tokens = 0
        self.evicted_miss_tokens = 0

    @property
    def true_output_tokens(self) -> int:
        """The real output length; only oracle policies (``oracle = True``) may read it."""
        if not self.reveals_output:
            raise OracleAccessError(
                "true_output_tokens is hidden from non-oracle policies: a real scheduler "
                "cannot know it (declare `oracle = True` on an oracle policy)"
            )
        return self.hidden_output_tokens

    @property
    def attained_s(self) -> float:
        """Engine seconds of service received (kept in integer ns so that sums are exact)."""
        return self.attained_ns / 1e9

    @property
    def remaining_output(self) -> int:
        """Engine-side: output tokens still to generate (uses the true length)."""
        return self.hidden_output_tokens - self.generated

    def __reduce__(self) -> tuple:
        # (pickled to a windowed run's workers, sim.cluster.executors: the compiled build's class
        # can be neither made without its __init__'s arguments nor given a __dict__)
        return _rebuilt, (tuple(getattr(self, k) for k in FIELDS),)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Request(id={self.request_id}, cls={self.cls}, state={self.state.name}, "
                f"gen={self.generated}/{self.hidden_output_tokens}, computed={self.computed}/{self.tokens})")


def _rebuilt(values: tuple) -> Request:
    """A request with these attribute values (:data:`FIELDS` order): unpickled."""
    r = Request(0, 0, "", "", 0, 0, 0, 0, 0)
    for k, v in zip(FIELDS, values):
        setattr(r, k, v)
    return r
