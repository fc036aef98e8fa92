"""A prefix cache in the manner of an inference engine's automatic prefix caching.

Theory of operation
-------------------
An engine that has computed the KV cache of a prompt keeps it in blocks and
reuses it for the next prompt that starts with the same tokens (vLLM's
automatic prefix caching). The simulated models have no KV cache, but the
chat endpoint charges prefill time only for the tokens not already cached
(``SampleRequest.uncached_tokens``) and reports the rest as
``usage.prompt_tokens_details.cached_tokens``, so this cache decides what
counts as cached, honestly and by the same rules:

- a prompt is cut into blocks of :data:`BLOCK_TOKENS` tokens; only full
  blocks are cached. Block ``i`` is named by a hash chained over every token
  before its end (``digest_i = blake2b(digest_{i-1} + tokens_i)``, the first
  seeded with the API key's owner and the model's name, :func:`cache_seed`),
  so a block is found only when its whole prefix matches, as in vLLM, and
  only by the tenant who sent it: another key cannot probe for a prompt
  through ``cached_tokens``;
- a lookup walks the chain from the first block until one is missing; the
  cached length is that many blocks, but never the whole prompt: at least
  one token is left to compute (the last block then counts as missing);
- what an engine computes, it keeps: the prompt's blocks when prefill is
  done, then the blocks of prompt plus answer (as the next request renders
  it) when the completion ends;
- the budget is in tokens (``--chat-prefix-cache-tokens``; 0 turns the
  cache off) and eviction is least-recently-used, block by block. A chain is
  touched and inserted tail first, so under pressure a prefix loses its
  last blocks before its first ones (as vLLM frees them).

Only digests are kept, not tokens: an entry is one 16-byte key in an
``OrderedDict``, about :data:`ENTRY_BYTES` bytes measured (CPython 3.11,
``tracemalloc`` over a million entries), so the default budget of 1,048,576
tokens holds 65,536 entries in about 9 MB. The hashing is pure and may run
in a worker thread (:func:`block_digests`); the cache itself is used from
one event loop.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Sequence
from typing import Final

from ..config import CHAT_PREFIX_CACHE_TOKENS

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_PREFIX_CACHE_TOKENS",
    "ENTRY_BYTES",
    "PrefixCache",
    "block_digests",
    "cache_seed",
]

#: Tokens per cached block (vLLM's default block size).
BLOCK_TOKENS: Final = 16
#: The default budget: a little over a million tokens (about 9 MB of digests).
DEFAULT_PREFIX_CACHE_TOKENS: Final = CHAT_PREFIX_CACHE_TOKENS
#: Bytes one cached block costs (its digest, and its place in the LRU order).
ENTRY_BYTES: Final = 140
_DIGEST_BYTES: Final = 16


def cache_seed(owner: str, model: str) -> str:
    """What the first block's digest is seeded with: one chain per owner and model."""
    return f"{owner}\0{model}"


def block_digests(seed: str, tokens: Sequence[int], *, known: Sequence[bytes] = ()) -> list[bytes]:
    """The chained digests of every full block of ``tokens`` (see the module
    docstring), the first seeded with ``seed`` (:func:`cache_seed`, or a model
    name); ``known``: the digests of its first blocks, already computed."""
    step = BLOCK_TOKENS * 4
    digests = list(known)
    if digests:
        digest = digests[-1]
    else:
        digest = hashlib.blake2b(seed.encode(), digest_size=_DIGEST_BYTES).digest()
    packed = array("I", tokens[len(digests) * BLOCK_TOKENS :]).tobytes()
    for start in range(0, (len(packed) // step) * step, step):
        digest = hashlib.blake2b(
            digest + packed[start : start + step], digest_size=_DIGEST_BYTES
        ).digest()
        digests.append(digest)
    return digests


class PrefixCache:
    """Block digests of recent prompts, least recently used out first."""

    def __init__(self, budget_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS) -> None:
        self.capacity = budget_tokens // BLOCK_TOKENS  # blocks
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        #: Counters (for ``/metrics`` and tests): lookups, tokens asked and found, blocks out.
        self.lookups = 0
        self.tokens_looked_up = 0
        self.tokens_found = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def tokens(self) -> int:
        """Tokens held (whole blocks)."""
        return len(self._blocks) * BLOCK_TOKENS

    @property
    def nbytes(self) -> int:
        """An estimate of the memory held (:data:`ENTRY_BYTES` per block)."""
        return len(self._blocks) * ENTRY_BYTES

    def cached_tokens(self, digests: Sequence[bytes], total: int) -> int:
        """How many leading tokens of a ``total``-token prompt (whose full
        blocks are ``digests``) are cached; the blocks found become the most
        recently used. At least one token is always left to compute."""
        found = 0
        for digest in digests:
            if digest not in self._blocks:
                break
            found += 1
        for digest in reversed(digests[:found]):  # tail first: the head ends up newest
            self._blocks.move_to_end(digest)
        cached = min(found * BLOCK_TOKENS, max(0, (total - 1) // BLOCK_TOKENS) * BLOCK_TOKENS)
        self.lookups += 1
        self.tokens_looked_up += total
        self.tokens_found += cached
        return cached

    def insert(self, digests: Sequence[bytes]) -> None:
        """Keep the blocks ``digests`` (most recently used), evicting beyond the budget."""
        if self.capacity <= 0:
            return
        blocks = self._blocks
        for digest in reversed(digests[: self.capacity]):
            blocks[digest] = None
            blocks.move_to_end(digest)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
            self.evictions += 1
