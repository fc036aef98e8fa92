"""How a turn can fail: the context window, post-inference refusals, and the error sent.

:func:`cut_to_window` says how a rollout's context is held to its model's
window as the shipped ``truncation`` setting says (drop the oldest items, or
fail with :class:`ContextLengthExceeded`); the rollout applies it.
:class:`TurnRefused` is raised by the serve layer's post-inference work when
it cannot accept a finished turn (a ``store=true`` write that failed).
:func:`failure` is the ``error`` a response that failed while running
reports. An :class:`~longresponse.engine.sampling.UpstreamError` (part of
the sampler interface, re-exported here) is raised by a real model backend
whose engine failed or refused. A turn it ends is cut short
(``Rollout.cut_short``): the item being written ends ``incomplete`` and what
the model wrote stays, all of it but a call cut short (:func:`kept`). In
append mode the rollout then reports it with :func:`upstream_error_event` and
pauses, resumable (SPEC §16). Every such failure is logged in one line with
its cause (:func:`log_upstream_failure`); the operator sees what the client
was told and what lay under it, never a credential.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

import msgspec

from protocol.events import ErrorBody, ErrorEvent, ResponseCreate
from protocol.items import ClientCall, Item, is_cut
from protocol.response import ResponseError

from .render import items_to_drop, render_item, render_prefix
from .sampling import ModelSpec, UpstreamError

__all__ = [
    "ContextLengthExceeded",
    "TurnRefused",
    "cut_to_window",
    "failure",
    "kept",
    "log_upstream_failure",
    "upstream_error_event",
]

log = logging.getLogger(__name__)


class ContextLengthExceeded(Exception):
    """The context is longer than the model's window and truncation is off."""


class TurnRefused(Exception):
    """Post-inference work could not accept the turn's result (e.g. the store
    failed a ``store=true`` write): the response ends ``failed`` with ``error``."""

    def __init__(self, error: ResponseError) -> None:
        super().__init__(error.message)
        self.error = error


def cut_to_window(
    model: ModelSpec, request: ResponseCreate, tokens: int, context: Sequence[Item]
) -> tuple[list[int], int] | None:
    """A context of ``tokens`` tokens against ``model``'s window (shipped
    ``truncation`` rules): ``None`` when it fits.

    ``truncation: "auto"`` drops the oldest items until the context fits: the
    prefix to render the rest again with, and how many of ``context``'s first
    items to drop. Otherwise :class:`ContextLengthExceeded` ends the response
    ``failed``.
    """
    window = model.context_window
    if tokens <= window:
        return None
    if request.truncation != "auto":
        raise ContextLengthExceeded(model.too_long(tokens))
    prefix = render_prefix(request.instructions, request.tools)
    lengths = [len(render_item(item)) for item in context]
    return prefix, items_to_drop(len(prefix), lengths, window)


_E = TypeVar("_E", bound=BaseException)


def failure(exc: Exception, response_id: str) -> ResponseError:
    """The ``error`` of a response that failed while running."""
    if isinstance(exc, ContextLengthExceeded):
        return ResponseError(code="context_length_exceeded", message=str(exc))
    if isinstance(exc, TurnRefused):
        return exc.error
    if isinstance(exc, UpstreamError):
        return ResponseError(code=exc.code, message=exc.message)
    log.exception("response %s failed", response_id, exc_info=exc)
    return ResponseError(code="server_error", message="The model failed.")


def untraced(exc: _E) -> _E:
    """``exc`` and the exceptions it was raised from or during, their
    tracebacks dropped, once the failure is logged and answered: a traceback
    holds the frames that raised it, and a frame whose ``self`` keeps the
    exception (a segment's failure, read later by its transport) makes a
    cycle that only a full collection frees, with every token array the
    frames held (issue 28: +13 MiB kept per refused 8 MB create)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


def kept(produced: list[Item]) -> list[Item]:
    """What a turn wrote that joins the rollout's context: all of it but a call
    cut short (``incomplete``), which never runs and gets no output; an
    engine given a call with no output refuses the context."""
    return [item for item in produced if not (isinstance(item, ClientCall) and is_cut(item))]


def upstream_error_event(exc: UpstreamError, response_id: str) -> ErrorEvent:
    """The ``error`` an append-mode rollout sends when its engine failed a turn."""
    return ErrorEvent(
        error=ErrorBody(type=exc.error_type, code=exc.code, message=exc.message, param=exc.param),
        status=exc.status,
        response_id=response_id,
        retry_after=exc.retry_after if exc.retry_after is not None else msgspec.UNSET,
    )


def log_upstream_failure(exc: UpstreamError, *, model: str, response_id: str) -> None:
    """One log line for an engine's failure of a turn: the model, the response,
    the code and status the client gets, the message and the cause underneath.

    A server-side failure (the engine down, broken off, failing, or the
    server's settings wrong for it) is a WARNING, an ERROR when misconfigured;
    an engine's refusal of the request (4xx, 429) is INFO: the client's to mend.
    """
    if exc.misconfigured:
        level = logging.ERROR
    elif exc.status >= 500:
        level = logging.WARNING
    else:
        level = logging.INFO
    cause = exc.cause
    log.log(
        level,
        "upstream failed: model=%s response=%s code=%s status=%d: %s%s",
        model,
        response_id,
        exc.code,
        exc.status,
        exc.message,
        f" (cause: {cause})" if cause else "",
    )
