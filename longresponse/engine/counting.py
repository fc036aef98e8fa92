"""Counting a turn's new input: before the model starts, or after its first output.

Theory of operation
-------------------
A turn's new input must be rendered and tokenized for three reasons: the
window (``context_length_exceeded``, ``truncation: "auto"``), compaction's
threshold, and the usage the Response reports. The first two are decided
before sampling; usage is read only when the turn has ended. Tokenizing a
2,000-token tool output takes about a quarter of a millisecond of CPU on
the event loop, which used to sit between the client's append and the
model's first token.

:meth:`~longresponse.engine.render.TokenCache.defer` answers at once with an
upper bound of the tokens the new items add (one per UTF-8 byte of their
text, plus three markers a segment: a byte-level BPE token never covers
less than a byte). When the context at that bound still fits the model's
window and stays under the compaction threshold, neither decision can
depend on the exact count, so the turn starts sampling at once
(:func:`may_defer`) and the rollout tokenizes and counts it after the
first output event has gone to the writer, while the model goes on
writing; at the latest as the turn ends, whatever way it ends. Otherwise
the count is taken before sampling, exactly as it always was.

A sampler that reads ``SampleRequest.cached_tokens`` / ``uncached_tokens``
before its first chunk (a simulated prefill rate, a Chat Completions engine
sizing ``max_tokens``) says so with ``counts_first = True`` (the default for
any sampler that does not say), and is given exact counts. A sampler with
``counts_first = False`` is given the bound as ``uncached_tokens``.

Nothing else changes: the same tokens, in the same order (the cache tokenizes
what it holds before anything reads it), the same usage, the same refusals.
The counting itself is the rollout's (``Rollout._hold_input``,
``_count_deferred``: only the rollout changes its tokens and counts); this
module keeps the decision, a pure function, and :func:`token_lengths`, the
count of items outside a rollout, which lets the event loop run between
pieces of a long text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from protocol.items import Item

from .render import TokenCache

__all__ = ["may_defer", "token_lengths"]


async def token_lengths(items: Iterable[Item]) -> list[int]:
    """The tokens of each item's segment, as :func:`~longresponse.engine.render.render_item`
    counts them, tokenized a piece of text at a time with the event loop
    given a turn between two (``TokenCache.tokenizing``): what counts a
    request's input without a rollout (``/input_tokens``, ``/compact``)."""
    lengths = []
    for item in items:
        cache = TokenCache()
        cache.defer([item])
        for _ in cache.tokenizing():
            await asyncio.sleep(0)
        lengths.append(len(cache))
    return lengths


def may_defer(sampler: object, bound: int, context_window: int, threshold: int | None) -> bool:
    """Whether counting the new input can wait for the first output: ``sampler``
    does not read the counts first, and a context of ``bound`` tokens fits the
    ``context_window`` and stays under the compaction ``threshold``."""
    if getattr(sampler, "counts_first", True):
        return False
    return bound <= context_window and (threshold is None or bound <= threshold)
