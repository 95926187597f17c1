"""A synthetic shared-prefix model: prefix-block hashes for streams that have none.

Real chat traffic shares prompt prefixes in two ways: every request of a tenant starts with the
same system prompt, and every turn of a conversation repeats the conversation so far. A stream
with ``prefix = { system_tokens = 1024, conversations = 200, block_tokens = 512 }`` gives each
request one hash id per ``block_tokens`` prompt tokens (as the Mooncake traces do):

* the first ``system_tokens / block_tokens`` ids are the tenant's system prompt (shared by all
  of the tenant's requests);
* the following ids belong to one of ``conversations`` conversations, picked uniformly at
  random per request: two requests of the same conversation share those ids up to the
  shorter prompt (``conversations = 0``: no conversation sharing);
* the last, partial block is the request's own.

Ids are stable integers derived from the tenant name (CRC-32), so two streams of the same
tenant share the system prompt, and runs repeat exactly.
"""
from __future__ import annotations

import zlib

import numpy as np

from workloads.errors import WorkloadError, integer, prefixed, unknown_keys

PREFIX_KEYS = {"system_tokens", "conversations", "block_tokens"}


def check_prefix(path: str, spec) -> dict:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{path}: expected a table {{ system_tokens, conversations, block_tokens }} (got {spec!r})")
    unknown_keys(path, spec, PREFIX_KEYS)
    try:
        out = {"system_tokens": integer("system_tokens", spec.get("system_tokens", 0), ge=0),
               "conversations": integer("conversations", spec.get("conversations", 0), ge=0),
               "block_tokens": integer("block_tokens", spec.get("block_tokens", 512), ge=1)}
    except WorkloadError as exc:
        raise prefixed(path, exc) from None
    return out


def synthetic_hash_ids(spec: dict, tenant: str, prompt_tokens: np.ndarray, rng: np.random.Generator,
                       first_unique: int) -> list[tuple[int, ...]]:
    """One tuple of hash ids per request (see module docstring)."""
    bt = spec["block_tokens"]
    sys_groups = spec["system_tokens"] // bt
    base = zlib.crc32(tenant.encode()) << 24
    convs = rng.integers(0, spec["conversations"], len(prompt_tokens)) if spec["conversations"] else None
    out = []
    unique = first_unique
    for i, p in enumerate(prompt_tokens.tolist()):
        n = -(-p // bt)
        full = p // bt
        ids = []
        for j in range(min(full, n)):
            if j < sys_groups:
                ids.append(base + j)
            elif convs is not None:
                ids.append(((zlib.crc32(f"{tenant}/{int(convs[i])}".encode()) << 24) + j))
            else:
                ids.append(-(unique := unique + 1))
        if n > full:  # the partial last block is the request's own
            ids.append(-(unique := unique + 1))
        out.append(tuple(ids))
    return out
