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
(:func:`may_defer`) and :func:`settle_count` tokenizes and counts after the
first output event has gone to the writer, while the model goes on
writing; at the latest as the turn ends, whatever way it ends. Otherwise
the count is taken before sampling, exactly as it always was.

A sampler that reads ``SampleRequest.cached_tokens`` / ``uncached_tokens``
before its first chunk (a simulated prefill rate, a Chat Completions engine
sizing ``max_tokens``) says so with ``counts_first = True`` (the default for
any sampler that does not say), and is given exact counts. A sampler with
``counts_first = False`` is given the bound as ``uncached_tokens``.

Nothing else changes: the same tokens, in the same order (the cache settles
before anything reads it), the same usage, the same refusals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .render import render_prefix
from .timing import TurnTiming

if TYPE_CHECKING:
    from protocol.items import Item

    from .rollout import Rollout

__all__ = [
    "count_input",
    "hold_input",
    "may_defer",
    "note_rendering",
    "rerender",
    "settle_count",
    "tokenize_input",
]


def hold_input(
    rollout: Rollout, items: list[Item], *, trigger: bool, threshold: int | None
) -> int:
    """Hold the turn's new ``items`` in the token cache and decide whether their count
    can wait (``rollout.uncounted``); the context's tokens at most (0 without the
    token cache, whose ablation renders everything again: :func:`rerender`)."""
    rollout.uncounted = False
    if not rollout.pipeline.switches.token_cache:
        return 0
    rollout.input_from = len(rollout.tokens)
    bound = rollout.input_from + rollout.tokens.defer(items)
    rollout.uncounted = not trigger and may_defer(rollout, bound, threshold)
    return bound


def tokenize_input(rollout: Rollout) -> int:
    """Tokenize the input :func:`hold_input` held (without the token cache: the whole
    context, :func:`rerender`); the tokens it added, counted from the cache's length
    (so a reader that settled the cache first changes nothing)."""
    if not rollout.pipeline.switches.token_cache:
        return rerender(rollout)
    rollout.tokens.settle()
    return len(rollout.tokens) - rollout.input_from


def may_defer(rollout: Rollout, bound: int, threshold: int | None) -> bool:
    """Whether counting the new input can wait for the first output: the sampler
    does not read the counts first, and a context of ``bound`` tokens fits the
    window and stays under the compaction ``threshold``."""
    if getattr(rollout.sampler, "counts_first", True):
        return False
    return bound <= rollout.model.context_window and (threshold is None or bound <= threshold)


def count_input(rollout: Rollout, timing: TurnTiming, cached: int, added: int) -> int:
    """Count the turn's input (``added`` tokens of it new); its uncached tokens."""
    total = len(rollout.tokens)
    rollout.counts.input_tokens += total
    rollout.counts.cached_tokens += cached
    timing.new_tokens, timing.cached_tokens, timing.input_tokens = added, cached, total
    return total - cached


def settle_count(rollout: Rollout, timing: TurnTiming, cached: int) -> None:
    """Tokenize and count the new input a turn left uncounted (once; a no-op
    otherwise). Then the context's tokens are ``len(rollout.tokens)``."""
    if not rollout.uncounted:
        return
    rollout.uncounted = False
    started = rollout.clock()
    added = tokenize_input(rollout)
    note_rendering(rollout)
    timing.count = rollout.clock() - started
    count_input(rollout, timing, cached, added)


def rerender(rollout: Rollout) -> int:
    """Without the token cache (the ablation): the whole context rendered and
    tokenized again, as a stateless server must; the tokens added."""
    before = len(rollout.tokens)
    prefix = render_prefix(rollout.request.instructions, rollout.request.tools)
    rollout.tokens = rollout.tokens.rerendered(prefix, rollout.context)
    return len(rollout.tokens) - before


def note_rendering(rollout: Rollout) -> None:
    """Add the token cache's new rendering work to the pipeline's counters."""
    counters, tokens = rollout.pipeline.counters, rollout.tokens
    counters.tokens_rendered += tokens.tokens_rendered - rollout.rendered_seen
    counters.items_rendered += tokens.items_rendered - rollout.items_seen
    rollout.rendered_seen, rollout.items_seen = tokens.tokens_rendered, tokens.items_rendered
