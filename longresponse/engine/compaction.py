"""Compaction: a conversation's context, shrunk to a window and sealed into one item.

Theory of operation
-------------------
A **compaction** replaces a rollout's context with a smaller **window**: the
``compaction`` item, then the summary it stands for. The summary is the
model's: its :class:`~longresponse.engine.sampling.ModelSpec` says how it
summarizes (``summarize``). Every model served here builds the window's items
with the engine's summary (``longresponse.engine.summary``), within a budget
drawn from the compaction threshold (:func:`~longresponse.engine.summary.budget`),
so the window does not grow with the rollout. A model whose sampler
``summarizes`` (a real engine) writes the summary's text itself: a **summary
turn** (:func:`summary_turn`), the context with
:data:`~longresponse.engine.summary.SUMMARY_PROMPT` as its last user message,
no tool calls, its output limited to the text's budget. A summary turn that
fails, or writes nothing, leaves the engine's deterministic summary in its
place (:func:`model_summary` logs it); one that runs long is cut to its budget.

The summary travels inside the item. :class:`CompactionKey` seals it with
AES-256-GCM (``cryptography``): the plaintext is the msgpack of the summary
items; the associated data is the owner (a digest of the API key), so an item
made for one key does not open for another; the ``encrypted_content`` is
``base64url(version ‖ nonce ‖ ciphertext ‖ tag)``. An altered, forged or
foreign item fails to open (:class:`InvalidCompaction`) and admission refuses
it with ``invalid_encrypted_content``. The sealed plaintext carries when the
item was sealed and when it expires (``lifetime`` seconds later,
``--compaction-lifetime``); an expired item is refused the same way
(:class:`ExpiredCompaction`, its message says so), so an item does not
outlive its lifetime whatever became of the response that made it. Items
sealed before the expiry was added carry only their sealing time: they expire
``lifetime`` seconds after it, as the opening server counts. Where the key comes from (a configured
secret, or a random key kept in the store) is the serve layer's business.

A :class:`Compactor` is one owner's view of the key: it seals windows and
opens items (keeping the last few it opened, so admission's check and the
turn that drains the inbox decrypt once). :func:`drain` is what new input
becomes as a rollout drains its inbox into the context: a ``compaction`` item
supersedes everything before it (the context and earlier input alike), so the
context starts again from its window; a final ``compaction_trigger`` asks for a
compaction turn and never enters the context. The rollout applies both
(``Rollout._compact``, ``Rollout._start_window``): this module never changes
a rollout.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Final

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from protocol import ErrorCode, RemoteProtocolError
from protocol.events import ResponseCreate
from protocol.items import Compaction, CompactionTrigger, Item, Message

from ..config import COMPACTION_LIFETIME
from ..ids import new_id
from .render import render_item
from .sampling import (
    Sampler,
    SampleRequest,
    Stop,
    Summarize,
    SummaryBudget,
    TextDelta,
    UpstreamError,
    Usage,
)
from .summary import summary_prompt

__all__ = [
    "KEY_BYTES",
    "MIN_COMPACT_THRESHOLD",
    "MIN_SUMMARY_TOKENS",
    "CompactionKey",
    "Compactor",
    "Drained",
    "ExpiredCompaction",
    "InvalidCompaction",
    "ModelSummary",
    "check_context_management",
    "compact",
    "compact_threshold",
    "drain",
    "instruction_tokens",
    "model_summary",
    "refused",
    "summarizes",
    "summary_request",
    "summary_turn",
    "threshold_or_default",
]

log = logging.getLogger(__name__)

#: Bytes of the AES-256-GCM key.
KEY_BYTES: Final = 32
#: The smallest ``compact_threshold`` the shipped API accepts.
MIN_COMPACT_THRESHOLD: Final = 1000
#: Without a ``compact_threshold``: compact at this share of the model's window.
DEFAULT_THRESHOLD_SHARE: Final = 0.9
#: Opened items a Compactor keeps (admission opens them, the turn takes them in).
OPENED_KEPT: Final = 16
#: A summary message's budget below this many tokens leaves no room for the
#: model's text beside its heading: no summary turn is asked for.
MIN_SUMMARY_TOKENS: Final = 64

_VERSION: Final = b"\x01"
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16
_ASSOCIATED: Final = b"longresponse.compaction.v1\x00"
_DERIVE_INFO: Final = b"longresponse compaction key v1"


class InvalidCompaction(Exception):
    """An ``encrypted_content`` that does not open: altered, forged, another
    server's key, or another owner's item."""


class ExpiredCompaction(InvalidCompaction):
    """An ``encrypted_content`` that verifies but whose lifetime is over."""


class _Sealed(msgspec.Struct, frozen=True, array_like=True):
    created_at: int
    items: list[Item]
    #: Unix time past which it does not open (``None``: sealed before expiries,
    #: counted from ``created_at``).
    expires_at: int | None = None


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(_Sealed)


class CompactionKey:
    """The server's sealing key: AES-256-GCM, the owner as associated data."""

    def __init__(self, key: bytes, *, lifetime: float = COMPACTION_LIFETIME) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a compaction key is {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)
        #: Seconds an item opens for after it was sealed.
        self.lifetime = lifetime

    @classmethod
    def derive(cls, secret: str, *, lifetime: float = COMPACTION_LIFETIME) -> CompactionKey:
        """The key for a configured secret of any length (HKDF-SHA256).

        Raises ``ValueError`` for an empty secret.
        """
        if not secret:
            raise ValueError("the compaction key secret is empty")
        hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_DERIVE_INFO)
        return cls(hkdf.derive(secret.encode()), lifetime=lifetime)

    def seal(self, items: Sequence[Item], owner: str, *, now: float | None = None) -> str:
        """The ``encrypted_content`` carrying ``items`` for ``owner``, sealed at ``now``
        (Unix time, default the clock's): it opens for ``lifetime`` seconds."""
        nonce = os.urandom(_NONCE_BYTES)
        now = int(time.time() if now is None else now)
        sealed_window = _Sealed(
            created_at=now, items=list(items), expires_at=now + math.ceil(self.lifetime)
        )
        plain = _encoder.encode(sealed_window)
        sealed = self._aead.encrypt(nonce, plain, _ASSOCIATED + owner.encode())
        return _base64url(_VERSION + nonce + sealed)

    def open(self, token: str, owner: str, *, now: float | None = None) -> list[Item]:
        """The items ``token`` carries, at ``now`` (Unix time, default the clock's).

        Raises :class:`InvalidCompaction`; :class:`ExpiredCompaction` when it
        verifies but its lifetime is over.
        """
        try:
            blob = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise InvalidCompaction("not base64url") from None
        if len(blob) < 1 + _NONCE_BYTES + _TAG_BYTES or blob[:1] != _VERSION:
            raise InvalidCompaction("not a sealed window")
        nonce, sealed = blob[1 : 1 + _NONCE_BYTES], blob[1 + _NONCE_BYTES :]
        try:
            window = _decoder.decode(
                self._aead.decrypt(nonce, sealed, _ASSOCIATED + owner.encode())
            )
        except (InvalidTag, msgspec.DecodeError):
            raise InvalidCompaction("does not verify") from None
        expires_at = (
            window.expires_at
            if window.expires_at is not None
            else window.created_at + self.lifetime
        )
        if (time.time() if now is None else now) >= expires_at:
            raise ExpiredCompaction(f"expired at {int(expires_at)}")
        return window.items


class Compactor:
    """One owner's compactions: seals windows, opens (and checks) items."""

    def __init__(self, key: CompactionKey, owner: str) -> None:
        self.key = key
        self.owner = owner
        self._opened: dict[str, list[Item]] = {}

    def seal(self, summary: Sequence[Item]) -> Compaction:
        """A new ``compaction`` item standing for ``summary``."""
        return Compaction(id=new_id("cmp"), encrypted_content=self.key.seal(summary, self.owner))

    def open(self, item: Compaction) -> list[Item]:
        """The summary ``item`` stands for. Raises :class:`InvalidCompaction`."""
        summary = self._opened.get(item.encrypted_content)
        if summary is None:
            summary = self.key.open(item.encrypted_content, self.owner)
            if len(self._opened) >= OPENED_KEPT:
                self._opened.clear()
            self._opened[item.encrypted_content] = summary
        return summary

    def check(self, item: Compaction, param: str) -> None:
        """Admission: ``item`` opens for this owner. Raises :class:`RemoteProtocolError`."""
        try:
            self.open(item)
        except InvalidCompaction as exc:
            raise refused(param, exc) from None


def refused(param: str, why: InvalidCompaction | None = None) -> RemoteProtocolError:
    """The error of a compaction item that does not open (or cannot be opened here)."""
    if isinstance(why, ExpiredCompaction):
        return RemoteProtocolError(
            "The compaction item has expired: it opens for a limited time after it was "
            "made. Compact the conversation again.",
            code=ErrorCode.INVALID_ENCRYPTED_CONTENT,
            param=param,
        )
    return RemoteProtocolError(
        "The compaction item's encrypted_content does not verify: it was altered, made "
        "by a server with another key, or made for another API key.",
        code=ErrorCode.INVALID_ENCRYPTED_CONTENT,
        param=param,
    )


# --- the window ----------------------------------------------------------------


def compact(
    context: Sequence[Item],
    compactor: Compactor,
    summarize: Summarize,
    limit: SummaryBudget | None = None,
    text: str | None = None,
) -> tuple[Compaction, list[Item]]:
    """Compact ``context`` with the model's ``summarize`` within ``limit`` (around
    the model's own summary ``text``, if it wrote one): its compaction item, and
    the window that replaces it."""
    summary = summarize(context, limit, text)
    item = compactor.seal(summary)
    return item, [item, *summary]


# --- the model's own summary: a summary turn ----------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSummary:
    """What a summary turn wrote: its text, the engine's count of the turn (if it
    sent one), and whether it stopped at its limit (the text runs long)."""

    text: str
    usage: Usage | None
    cut: bool


def summarizes(sampler: Sampler) -> bool:
    """Whether ``sampler`` writes its own compaction summary (a real engine's)."""
    return bool(getattr(sampler, "summarizes", False))


def instruction_tokens(limit: SummaryBudget) -> int:
    """The tokens of a summary turn's instruction (what it reads after the context)."""
    return len(render_item(Message(role="user", content=summary_prompt(limit))))


def summary_request(turn: SampleRequest, limit: SummaryBudget) -> SampleRequest:
    """The summary turn of a rollout whose next turn would be ``turn``: the same
    context, tools and settings, then the instruction as a user message; no tool
    call; its output limited to the summary message's budget."""
    prompt = Message(role="user", content=summary_prompt(limit))
    return dataclasses.replace(
        turn,
        context=[*turn.context, prompt],
        tool_choice="none",
        uncached_tokens=turn.uncached_tokens + len(render_item(prompt)),
        max_output_tokens=limit.text,
        text_format=None,
    )


async def summary_turn(sampler: Sampler, request: SampleRequest) -> ModelSummary:
    """Ask ``sampler`` for its summary (a :func:`summary_request`): the text it
    wrote. A tool call it makes anyway is not read. Raises
    :class:`~longresponse.engine.sampling.UpstreamError` if its engine fails;
    the engine's stream is closed whatever happens."""
    texts: list[str] = []
    usage: Usage | None = None
    cut = False
    async with contextlib.aclosing(sampler.sample(request)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, TextDelta):
                texts.append(chunk.text)
            elif isinstance(chunk, Usage):
                usage = chunk
            elif isinstance(chunk, Stop):
                cut = chunk.reason != "stop"
    return ModelSummary("".join(texts).strip(), usage, cut)


async def model_summary(
    sampler: Sampler, request: SampleRequest, *, model: str, response_id: str
) -> ModelSummary | None:
    """The model's own summary, or ``None``: its sampler does not summarize, the
    budget leaves it no room (:data:`MIN_SUMMARY_TOKENS`), or the summary turn
    failed or wrote nothing (logged at WARNING). The window then holds the
    engine's deterministic summary."""
    room = request.max_output_tokens
    if not summarizes(sampler) or (room is not None and room < MIN_SUMMARY_TOKENS):
        return None
    try:
        written = await summary_turn(sampler, request)
    except UpstreamError as exc:
        log.warning(
            "compaction: model=%s response=%s: the summary turn failed (%s: %s); the "
            "window holds the deterministic summary",
            model,
            response_id,
            exc.code,
            exc.message,
        )
        return None
    if not written.text:
        log.warning(
            "compaction: model=%s response=%s: the summary turn wrote no text; the "
            "window holds the deterministic summary",
            model,
            response_id,
        )
        return None
    return written


@dataclasses.dataclass(frozen=True, slots=True)
class Drained:
    """New input as it is drained from an inbox into a context."""

    #: The items that join the context (a compaction item followed by its summary).
    items: list[Item]
    #: A compaction item came in: the context starts again from its window.
    replaces: bool = False
    #: The input ended in ``compaction_trigger``: compact, then stop.
    trigger: bool = False


def drain(items: Sequence[Item], compactor: Compactor | None) -> Drained:
    """``items`` drained into a context: the latest compaction item opened into its
    window, the rest before it dropped.

    Raises :class:`InvalidCompaction` if it does not open (admission has
    checked it, so only a bug gets here).
    """
    trigger = bool(items) and isinstance(items[-1], CompactionTrigger)
    kept: list[Item] = [item for item in items if not isinstance(item, CompactionTrigger)]
    latest = next(
        (i for i in range(len(kept) - 1, -1, -1) if isinstance(kept[i], Compaction)), None
    )
    if latest is None:
        return Drained(kept, trigger=trigger)
    item = kept[latest]
    assert isinstance(item, Compaction)
    if compactor is None:
        raise InvalidCompaction("no compaction key here")
    return Drained([item, *compactor.open(item), *kept[latest + 1 :]], True, trigger)


# --- context_management ------------------------------------------------------------


def check_context_management(request: ResponseCreate) -> None:
    """A create's ``context_management`` entries. Raises :class:`RemoteProtocolError`."""
    for index, entry in enumerate(request.context_management or ()):
        where = f"context_management[{index}]"
        if entry.type != "compaction":
            raise RemoteProtocolError(
                f"Invalid value: '{entry.type}'. Supported values are: 'compaction'.",
                code=ErrorCode.INVALID_VALUE,
                param=f"{where}.type",
            )
        threshold = entry.compact_threshold
        if threshold is not None and threshold < MIN_COMPACT_THRESHOLD:
            raise RemoteProtocolError(
                f"Invalid '{where}.compact_threshold': {threshold}; the minimum is "
                f"{MIN_COMPACT_THRESHOLD} tokens.",
                code=ErrorCode.INVALID_VALUE,
                param=f"{where}.compact_threshold",
            )


def compact_threshold(request: ResponseCreate, context_window: int) -> int | None:
    """Rendered tokens past which the turn compacts first; ``None``: never."""
    for entry in request.context_management or ():
        if entry.type == "compaction":
            if entry.compact_threshold is not None:
                return entry.compact_threshold
            return int(context_window * DEFAULT_THRESHOLD_SHARE)
    return None


def threshold_or_default(request: ResponseCreate | None, context_window: int) -> int:
    """The threshold a window is compacted under (its budget's source): the
    request's, else :data:`DEFAULT_THRESHOLD_SHARE` of the model's window (a
    ``compaction_trigger``, ``POST /v1/responses/compact``)."""
    threshold = compact_threshold(request, context_window) if request is not None else None
    return threshold if threshold is not None else int(context_window * DEFAULT_THRESHOLD_SHARE)


#: Bytes encoded at a time (a multiple of 3: the pieces join without padding).
#: base64 holds the interpreter for a whole call: 60 ms for a 15 MB window in
#: one piece, in a worker thread beside the event loop.
_BASE64_PIECE: Final = 3 << 16


def _base64url(blob: bytes) -> str:
    """``urlsafe_b64encode(blob)`` as text, :data:`_BASE64_PIECE` bytes at a time."""
    pieces = [
        base64.urlsafe_b64encode(blob[at : at + _BASE64_PIECE]).decode("ascii")
        for at in range(0, len(blob), _BASE64_PIECE)
    ]
    return "".join(pieces)
