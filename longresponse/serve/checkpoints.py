"""Append-mode rollouts kept in the store from their start and at every pause, and taken up again.

Theory of operation
-------------------
An append-mode ``response.create`` with ``store: true`` gives its rollout a
:class:`CheckpointWriter` (``longresponse.engine.checkpoint`` says when the
rollout calls it). The first call opens the response's checkpoint in the
store; each later one rewrites its small state and appends only the items the
conversation gained since (all of them again when the context was replaced,
a compaction). Each durable checkpoint also writes the usage so far to the
ledger, which keeps one record per response: a rollout that is lost is billed
what it had done at its last checkpoint, and whoever finishes it replaces
that record with the whole.

``response.resume`` (:meth:`Checkpoints.take`) takes the checkpoint over: the
store bumps its epoch, so the copy that was running (a socket that broke
while its process lives, or another process) learns at its next checkpoint
that it is no longer the holder and stops (``TakenOver``). What it holds is
turned back into a :class:`~longresponse.engine.checkpoint.RolloutCheckpoint`
for a fresh rollout to start from.

A checkpoint expires ``--checkpoint-ttl`` after it was last written or taken,
and is deleted when its response ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from protocol.events import ResponseCreate
from protocol.items import Item
from protocol.response import Response

from ..engine.checkpoint import RolloutCheckpoint
from ..storage.persistence import Persistence
from .transport import Transport

__all__ = ["CheckpointWriter", "Checkpoints", "TakenUp"]


class _State(msgspec.Struct, frozen=True, kw_only=True):
    """The small part of a checkpoint, rewritten at every checkpoint (the items are
    kept apart, appended)."""

    request: ResponseCreate
    model: str
    response: Response
    sequence: int
    context: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    model_seen: bool
    chain: str


_encoder: Final = msgspec.msgpack.Encoder()
_state_decoder: Final = msgspec.msgpack.Decoder(_State)
_item_decoder: Final = msgspec.msgpack.Decoder(Item)


class CheckpointWriter:
    """One rollout's checkpoints in the store: its epoch once open, and the items
    already written (the objects, to tell what the conversation gained)."""

    def __init__(
        self,
        checkpoints: Checkpoints,
        *,
        owner: str,
        response_id: str,
        epoch: int | None = None,
        written: Sequence[Item] = (),
    ) -> None:
        self._checkpoints = checkpoints
        self.owner = owner
        self.response_id = response_id
        #: The epoch this rollout holds (None until its first checkpoint).
        self.epoch = epoch
        self._written = list(written)

    async def __call__(self, checkpoint: RolloutCheckpoint) -> bool:
        """Make ``checkpoint`` durable; False when another holder took it over."""
        persistence = self._checkpoints.persistence()
        ttl = self._checkpoints.ttl
        items = checkpoint.items
        keep = len(self._written) if _begins_with(items, self._written) else 0
        # Encoded off the loop: a 15 MB tool output would hold every other client
        # for the time it takes (the items and the state are frozen: safe to read).
        state, blobs = await asyncio.to_thread(_encode, _state_of(checkpoint), items[keep:])
        if self.epoch is None:
            self.epoch = await persistence.checkpoint_open(
                self.response_id, owner=self.owner, state=state, items=blobs, ttl=ttl
            )
        else:
            written = await persistence.checkpoint_write(
                self.response_id,
                owner=self.owner,
                epoch=self.epoch,
                state=state,
                keep=keep,
                items=blobs,
                ttl=ttl,
            )
            if not written:
                return False
        self._written = list(items)
        await persistence.bill_so_far(
            checkpoint.response, owner=self.owner, transport=Transport.APPEND
        )
        return True

    async def forget(self) -> None:
        """The response ended: its checkpoint goes (if this rollout still holds it)."""
        if self.epoch is not None:
            await self._checkpoints.persistence().checkpoint_delete(
                self.response_id, owner=self.owner, epoch=self.epoch
            )


@dataclasses.dataclass(frozen=True, slots=True)
class TakenUp:
    """A checkpoint taken over: what a fresh rollout starts from, and its writer."""

    checkpoint: RolloutCheckpoint
    writer: CheckpointWriter


class Checkpoints:
    """The server's checkpoints of append-mode rollouts, in its store."""

    def __init__(self, persistence: Callable[[], Persistence], ttl: float) -> None:
        self.persistence = persistence
        self.ttl = ttl

    def writer(self, *, owner: str, response_id: str) -> CheckpointWriter:
        """The checkpoints of ``owner``'s new rollout ``response_id``."""
        return CheckpointWriter(self, owner=owner, response_id=response_id)

    async def take(self, response_id: str, *, owner: str) -> TakenUp | None:
        """Take ``owner``'s response ``response_id`` over from its checkpoint; None
        when it has none (never stored, ended, expired, or another key's)."""
        held = await self.persistence().checkpoint_take(response_id, owner=owner, ttl=self.ttl)
        if held is None:
            return None
        state, items = await asyncio.to_thread(_decode, held.state, held.items)
        checkpoint = RolloutCheckpoint(
            response=state.response,
            sequence=state.sequence,
            request=state.request,
            model=state.model,
            items=items,
            context=state.context,
            input_tokens=state.input_tokens,
            cached_tokens=state.cached_tokens,
            output_tokens=state.output_tokens,
            model_seen=state.model_seen,
            chain=state.chain,
        )
        writer = CheckpointWriter(
            self, owner=owner, response_id=response_id, epoch=held.epoch, written=items
        )
        return TakenUp(checkpoint, writer)


def _encode(state: _State, items: Sequence[Item]) -> tuple[bytes, list[bytes]]:
    return _encoder.encode(state), [_encoder.encode(item) for item in items]


def _decode(state: bytes, items: Sequence[bytes]) -> tuple[_State, list[Item]]:
    return _state_decoder.decode(state), [_item_decoder.decode(blob) for blob in items]


def _state_of(checkpoint: RolloutCheckpoint) -> _State:
    return _State(
        request=checkpoint.request,
        model=checkpoint.model,
        response=checkpoint.response,
        sequence=checkpoint.sequence,
        context=checkpoint.context,
        input_tokens=checkpoint.input_tokens,
        cached_tokens=checkpoint.cached_tokens,
        output_tokens=checkpoint.output_tokens,
        model_seen=checkpoint.model_seen,
        chain=checkpoint.chain,
    )


def _begins_with(items: Sequence[Item], written: Sequence[Item]) -> bool:
    """Whether ``items`` still begin with the ``written`` ones (the same objects):
    a conversation grows at its end or is replaced whole (a compaction)."""
    if len(items) < len(written):
        return False
    return all(a is b for a, b in zip(items, written, strict=False))
