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
This module keeps the decision (:func:`may_defer`, a pure function) and the
count left waiting (:class:`DeferredCount`: taken once, whichever comes
first of the first output, a real engine's usage, a failure or the turn's
end). The tokenizing and counting themselves are the rollout's, asked
through :class:`CountedInput`: only the rollout changes its tokens and
counts. :func:`token_lengths` counts items outside a rollout, letting the
event loop run between pieces of a long text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol

from protocol.items import Item

from .render import TokenCache
from .timing import TurnTiming

__all__ = ["CountedInput", "DeferredCount", "may_defer", "token_lengths"]


class CountedInput(Protocol):
    """What a count asks of its rollout, which alone changes its tokens and counts."""

    def tokenize_input(self) -> int:
        """Tokenize the turn's held input; the tokens it added."""
        ...

    async def tokenize_input_stepwise(self) -> int:
        """:meth:`tokenize_input`, the event loop given a turn between pieces."""
        ...

    def note_rendering(self) -> None:
        """Add the token cache's new rendering work to the pipeline's counters."""
        ...

    def count_input(self, timing: TurnTiming, cached: int, added: int) -> int:
        """Count the turn's input (``added`` tokens of it new); its uncached tokens."""
        ...


class DeferredCount:
    """A turn's new input, held in the token cache: its count, taken later or not.

    ``pending`` while the count waits (:func:`may_defer` said it may); the
    first :meth:`settle` or :meth:`settle_stepwise` takes it, once, with its
    time in the turn's ``timing.count``; after that they do nothing. A count
    that did not wait is never pending: the rollout took it before sampling.
    The rollout keeps it (``Rollout.uncounted``) and is handed in to each
    call, never held: no reference cycle keeps a finished rollout alive.
    """

    __slots__ = ("_cached", "_clock", "_timing", "bound", "pending")

    def __init__(
        self,
        *,
        bound: int,
        pending: bool,
        timing: TurnTiming,
        cached: int,
        clock: Callable[[], float],
    ) -> None:
        #: The context's tokens at most, new input included (0 without the token cache).
        self.bound = bound
        self.pending = pending
        self._timing = timing
        #: The turn's cached tokens, counted with its input.
        self._cached = cached
        self._clock = clock

    def settle(self, conversation: CountedInput) -> None:
        """Tokenize and count the input of ``conversation`` (the rollout that holds
        this count) if its count is still pending (a no-op otherwise). Then the
        rollout's context's tokens are exact."""
        if not self.pending:
            return
        self.pending = False
        started = self._clock()
        added = conversation.tokenize_input()
        conversation.note_rendering()
        self._timing.count = self._clock() - started
        conversation.count_input(self._timing, self._cached, added)

    async def settle_stepwise(self, conversation: CountedInput) -> None:
        """:meth:`settle`, the event loop given a turn between pieces of the text."""
        if not self.pending:
            return
        started = self._clock()
        added = await conversation.tokenize_input_stepwise()
        if not self.pending:  # pragma: no cover - counted meanwhile (the turn ended)
            return
        self.pending = False
        conversation.note_rendering()
        self._timing.count = self._clock() - started
        conversation.count_input(self._timing, self._cached, added)


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
