"""Boundaries: where a rollout's shipped-shape segments ended, and what a fork at one starts from.

Theory of operation
-------------------
Each finished segment (``engine/segment.py``) leaves a :class:`Boundary`: the
lengths of the rollout's context and token cache then, the token prefix in
effect (instructions and tools, which a later segment may swap in place), the
client calls still pending, and the segment's Response. A continuation names
one by its segment id: the latest continues in place, an older one forks.

:class:`Boundaries` keeps one rollout's boundaries, oldest first, and is the
one place they are added (:meth:`Boundaries.mark`) or forgotten (a
compaction's window, :meth:`Boundaries.clear`). A fork at a boundary
(:meth:`Boundaries.fork_at`) is a :class:`ForkStart`: the context, tokens and
boundaries up to it, and how much of it the model has already processed. It
changes nothing of the rollout it is taken from; the rollout applies it to
its child (``Rollout.fork``), as every change to a rollout's context, tokens
and counts is the rollout's own.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterator, Sequence
from typing import Final, overload

from protocol.items import Item
from protocol.response import Response

from .render import TokenCache

__all__ = ["Boundaries", "Boundary", "ForkStart", "KnownPrefix"]

#: What one Boundary holds beside its prefix, about (its Response object and
#: pending calls; measured on the simulated model's short answers).
_BOUNDARY_BYTES: Final = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class Boundary:
    """Where a shipped-shape segment ended: enough to continue or fork from it."""

    segment_id: str
    #: ``len(context)`` and ``len(tokens)`` at the end of the segment.
    items: int
    tokens: int
    #: Tokens of the items alone (after the prefix), and the prefix in effect
    #: then: a later segment may have swapped the prefix in place. The prefix
    #: is one array shared by the boundaries that had the same one.
    item_tokens: int
    prefix: array[int]
    #: Client tool calls of the segment still waiting for their outputs.
    pending: dict[str, str]
    #: The finished segment's Response object.
    response: Response
    #: The lane (``stream_id``) the segment ran on; ``None`` = the default lane.
    stream_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ForkStart:
    """What a rollout forked at a boundary starts with (``Rollout.fork`` applies it)."""

    context: list[Item]
    tokens: TokenCache
    boundaries: Boundaries
    #: Tokens the model has already processed of it (its reusable prefix).
    model_seen: int


@dataclasses.dataclass(frozen=True, slots=True)
class KnownPrefix:
    """What a fresh rollout starts with when its input begins with a conversation
    rendered recently (``longresponse.serve.prefix_reuse``): its first ``items``
    items and their ``tokens``, read after the token ``prefix`` (instructions and
    tools) by ``model``, which has processed ``seen`` of those tokens; ``chain``:
    that conversation's first response id (its affinity key's source);
    ``classified``: the secrets classifier found nothing in it, so its items
    need not be read again (otherwise they are, and the Response flags them)."""

    items: int
    tokens: array[int]
    prefix: array[int]
    model: str
    seen: int
    chain: str = ""
    classified: bool = True


class Boundaries(Sequence[Boundary]):
    """One rollout's boundaries, oldest first (see the module docstring)."""

    __slots__ = ("_kept",)

    def __init__(self, kept: Sequence[Boundary] = ()) -> None:
        self._kept = list(kept)

    @overload
    def __getitem__(self, index: int) -> Boundary: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Boundary]: ...
    def __getitem__(self, index: int | slice) -> Boundary | Sequence[Boundary]:
        return self._kept[index]

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[Boundary]:
        return iter(self._kept)

    def mark(
        self,
        segment_id: str,
        *,
        items: int,
        tokens: TokenCache,
        pending: dict[str, str],
        response: Response,
        stream_id: str | None,
    ) -> Boundary:
        """Add where the segment ``segment_id`` ends now (``items`` in the context,
        ``tokens`` the rollout's cache): its :class:`Boundary`."""
        prefix = tokens.tokens[: tokens.prefix_length]
        if self._kept and self._kept[-1].prefix == prefix:
            prefix = self._kept[-1].prefix  # one copy for a whole chain
        boundary = Boundary(
            segment_id=segment_id,
            items=items,
            tokens=len(tokens),
            item_tokens=len(tokens) - tokens.prefix_length,
            prefix=prefix,
            pending=pending,
            response=response,
            stream_id=stream_id,
        )
        self._kept.append(boundary)
        return boundary

    def clear(self) -> None:
        """Forget them all: the context they ended in is gone (a compaction's window)."""
        self._kept.clear()

    def fork_at(
        self,
        boundary: Boundary,
        *,
        context: Sequence[Item],
        tokens: TokenCache,
        model_seen: int,
    ) -> ForkStart:
        """What a fork at ``boundary`` (one of these) starts with, given the rollout's
        ``context``, ``tokens`` and ``model_seen`` now (the shared prefix is reused).
        Raises ``ValueError`` if ``boundary`` is not one of these."""
        index = self._kept.index(boundary)
        # A model server's prefix cache is shared by every request, so the fork's
        # prefix counts as processed, unless the prefix changed since.
        same_prefix = tokens.tokens[: tokens.prefix_length] == boundary.prefix
        return ForkStart(
            context=list(context[: boundary.items]),
            tokens=tokens.fork_items(boundary.prefix, boundary.item_tokens),
            boundaries=Boundaries(self._kept[: index + 1]),
            model_seen=min(model_seen, boundary.tokens) if same_prefix else 0,
        )

    @property
    def nbytes(self) -> int:
        """Approximate memory held: each distinct prefix once, and the Responses."""
        prefixes = {id(b.prefix): len(b.prefix) * b.prefix.itemsize for b in self._kept}
        return sum(prefixes.values()) + _BOUNDARY_BYTES * len(self._kept)
