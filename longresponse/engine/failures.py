"""How a turn can fail: the context window, post-inference refusals, and the error sent.

:func:`fit_window` holds a rollout's context to its model's window as the
shipped ``truncation`` setting says (drop the oldest items, or fail with
:class:`ContextLengthExceeded`). :class:`TurnRefused` is raised by the serve
layer's post-inference work when it cannot accept a finished turn (a
``store=true`` write that failed). :func:`failure` is the ``error`` a
response that failed while running reports. :class:`UpstreamError` is raised
by a real model backend (``longresponse.backends``) whose engine failed or
refused; it carries the shipped code, HTTP status, ``param`` and retry hint
the server reports, and never the upstream's credentials. A turn it ends is
:func:`cut_short`: the item being written ends ``incomplete`` and what the
model wrote stays. In append mode the rollout then reports it with
:func:`upstream_error_event` and pauses, resumable (SPEC §16).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec

from protocol.events import ErrorBody, ErrorEvent
from protocol.items import FunctionCall, Item
from protocol.response import ResponseError

from .render import items_to_drop, render_item, render_prefix
from .sampling import ItemEnd

if TYPE_CHECKING:
    from .reply import Reply
    from .rollout import Rollout

__all__ = [
    "ContextLengthExceeded",
    "TurnRefused",
    "UpstreamError",
    "cut_short",
    "failure",
    "fit_window",
    "kept",
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


class UpstreamError(Exception):
    """The engine behind a model failed or refused a turn.

    ``code`` is the shipped error code (``upstream_unavailable`` with status
    502 when it cannot be reached or broke off; ``rate_limit_exceeded`` 429
    with ``retry_after`` seconds; ``context_length_exceeded`` or
    ``invalid_request_error`` codes 400 with ``param`` when it refused the
    request). ``output_started`` says whether any of the turn's output had
    already been produced when it failed.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "upstream_unavailable",
        status: int = 502,
        param: str | None = None,
        retry_after: float | None = None,
        output_started: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.param = param
        self.retry_after = retry_after
        self.output_started = output_started

    @property
    def transient(self) -> bool:
        """The engine could not serve the turn now (unreachable, failed, rate
        limited), rather than refusing the request: trying again may work."""
        return self.status == 429 or self.status >= 500

    @property
    def error_type(self) -> str:
        """The envelope's ``type``: who is at fault."""
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if 400 <= self.status < 500 else "server_error"


def fit_window(rollout: Rollout) -> bool:
    """History + new tokens against the model's window (shipped ``truncation`` rules).

    ``truncation: "auto"`` drops the oldest items until the context fits
    (the rest is rendered again; the model has to prefill it all) and
    returns True; otherwise :class:`ContextLengthExceeded` ends the
    response ``failed``.
    """
    window = rollout.model.context_window
    if len(rollout.tokens) <= window:
        return False
    if rollout.request.truncation != "auto":
        raise ContextLengthExceeded(rollout.model.too_long(len(rollout.tokens)))
    prefix = render_prefix(rollout.request.instructions, rollout.request.tools)
    lengths = [len(render_item(item)) for item in rollout.context]
    del rollout.context[: items_to_drop(len(prefix), lengths, window)]
    rollout.tokens = rollout.tokens.rerendered(prefix, rollout.context)
    rollout.model_seen = 0
    rollout.truncated = True
    return True


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


def kept(produced: list[Item]) -> list[Item]:
    """What a turn wrote that joins the rollout's context: all of it but a call
    cut short (``incomplete``), which never runs and gets no output; an
    engine given a call with no output refuses the context."""
    return [
        item
        for item in produced
        if not (isinstance(item, FunctionCall) and item.status == "incomplete")
    ]


async def cut_short(rollout: Rollout, reply: Reply, unbilled: tuple[int, int] | None) -> None:
    """A turn the engine broke off: the item being written ends ``incomplete``.

    ``unbilled``: the turn's (input, cached) estimate, taken back when the
    engine produced nothing (a refused or unreachable request reads no tokens).
    """
    if unbilled is not None:
        rollout.counts.input_tokens -= unbilled[0]
        rollout.counts.cached_tokens -= unbilled[1]
    await reply.sink.room()
    for event in reply.builder.feed(ItemEnd(incomplete=True)):
        reply.sink.push(event)


def upstream_error_event(exc: UpstreamError, response_id: str) -> ErrorEvent:
    """The ``error`` an append-mode rollout sends when its engine failed a turn."""
    return ErrorEvent(
        error=ErrorBody(type=exc.error_type, code=exc.code, message=exc.message, param=exc.param),
        status=exc.status,
        response_id=response_id,
        retry_after=exc.retry_after if exc.retry_after is not None else msgspec.UNSET,
    )
