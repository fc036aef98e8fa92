"""ResilientClient: append mode over as many connections as it takes.

See the package docstring (``longresponse.client``) for the user's view;
:func:`resilient` opens one.

Theory of operation
-------------------
A :class:`ResilientClient` holds one :class:`~longresponse.client.AppendClient`
at a time and one task of its own, the pump, in the nursery that
:func:`resilient` holds. The pump reads the connection's events, notes what
they say about the responses this client started or took up (its *held*
responses), and hands them on through a bounded channel, so a slow reader
slows the connection down as it does on an :class:`AppendClient`.

When the connection closes with a code the official SDKs reconnect on
(:data:`RETRYABLE_CLOSE_CODES`), or after the server's
``websocket_connection_limit_reached``, the pump opens a new connection, with
the SDKs' backoff (:func:`reconnect_delay`; at most ``max_retries`` attempts
in a row, the count starting again once a new connection delivers an event),
and sends ``response.resume`` for every held response. Each is answered by
``response.resumed`` (the response as its last checkpoint holds it) or by an
``error`` naming it (``response_not_found``: it kept no checkpoint), which
ends it here; both go to the reader like any event.

Tool outputs are the one input the client keeps: every output sent for a
call is remembered until its response takes it in (``response.in_progress``,
or a ``response.resumed`` that is ``in_progress``) or ends. A response
resumed ``requires_action`` gets the remembered outputs of the calls it still
waits for, sent again before the reader sees its ``response.resumed``; those
of other calls are dropped, never sent. A create whose ``response.created``
had not come back is sent again on the new connection, and a response the
client asked to cancel is asked again once it is resumed.

Sends wait while the client reconnects (a send for a held response waits
until it is resumed), and go out under one lock that the pump also takes to
send again what a resumed response still needs, so the two never interleave.
An append cut off by a drop raises nothing when it carries tool outputs only:
they are remembered, and the resume sends them if they are still waited for.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import random
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any, Final

import trio

from protocol import (
    APPEND_SUBPROTOCOL,
    MAX_MESSAGE_BYTES,
    CloseCode,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
)
from protocol.events import (
    ErrorEvent,
    ResponseAppend,
    ResponseCompleted,
    ResponseCreated,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseResumed,
    ServerEvent,
)
from protocol.items import CallOutput, InputItem, Item, McpApprovalResponse, answered_call_id
from protocol.response import RequiredAction, Response

from .connection import (
    ABNORMAL_CLOSURE,
    CLOSE_TIMEOUT,
    MAX_QUEUED_EVENTS,
    AppendClient,
    ClientError,
    ConnectionClosedError,
    _build_event,
    _ends_wait,
)
from .opening import closing, connect, unwrapped

__all__ = [
    "INITIAL_DELAY",
    "MAX_DELAY",
    "MAX_RETRIES",
    "RETRYABLE_CLOSE_CODES",
    "ResilientClient",
    "reconnect_delay",
    "resilient",
]

#: The close codes the official SDKs reconnect on (openai-python's
#: ``is_recoverable_close``): going away, no status, abnormal closure,
#: internal error, service restart, try again later, TLS handshake.
RETRYABLE_CLOSE_CODES: Final = frozenset({1001, 1005, 1006, 1011, 1012, 1013, 1015})
#: Reconnect attempts in a row before the client gives up (the SDKs' default).
MAX_RETRIES: Final = 5
#: The first attempt's delay in seconds, doubled for each later one up to :data:`MAX_DELAY`.
INITIAL_DELAY: Final = 0.5
MAX_DELAY: Final = 8.0

#: What a failed attempt to reconnect may raise (each uses up an attempt).
_ATTEMPT_FAILURES: Final = (OSError, ClientError, trio.TooSlowError)
_TERMINAL: Final = (ResponseDone, ResponseCompleted, ResponseIncomplete, ResponseFailed)


def reconnect_delay(
    attempt: int,
    *,
    initial_delay: float = INITIAL_DELAY,
    max_delay: float = MAX_DELAY,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before reconnect attempt ``attempt`` (1, 2, ...): the SDKs'
    backoff, ``initial_delay`` doubled per attempt up to ``max_delay``, times a
    jitter drawn from 0.75 to 1.0."""
    base = min(initial_delay * 2.0 ** (attempt - 1), max_delay)
    jitter: float = (rng or random).random()
    return base * (0.75 + 0.25 * jitter)


@dataclasses.dataclass(slots=True, eq=False)
class _Held:
    """A response this client started or took up, until it ends here."""

    response_id: str
    #: Tool outputs sent (call id → item) and not yet taken in by the response.
    outputs: dict[str, Item] = dataclasses.field(default_factory=dict)
    #: Every call id this client sent an output for (for :meth:`ResilientClient.unanswered`).
    answered: set[str] = dataclasses.field(default_factory=set)
    #: Waiting for its ``response.resumed`` (or the error that ends it) on the
    #: current connection; sends to it wait meanwhile.
    resuming: bool = False
    #: A cancel was sent: sent again whenever the response is resumed.
    cancel: bool = False


class ResilientClient:
    """Append mode over as many connections as it takes; made by :func:`resilient`.

    Reads and sends as :class:`~longresponse.client.AppendClient` does. Only
    a connection closed with a code of :data:`RETRYABLE_CLOSE_CODES` (or after
    ``websocket_connection_limit_reached``) is replaced; ``drops`` lists the
    close codes of the connections replaced so far, ``current`` is the
    connection in use (``None`` while reconnecting) and ``live_responses`` the
    ids of the responses the client would resume.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Sequence[tuple[str | bytes, str | bytes]] = (),
        connect_timeout: float = 10.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_queued_events: int = MAX_QUEUED_EVENTS,
        close_timeout: float = CLOSE_TIMEOUT,
        max_retries: int = MAX_RETRIES,
        initial_delay: float = INITIAL_DELAY,
        max_delay: float = MAX_DELAY,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url
        self.max_retries = max_retries
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        #: The close codes of the connections replaced so far, in order.
        self.drops: list[int] = []
        self._options: dict[str, Any] = {
            "subprotocols": (APPEND_SUBPROTOCOL,),
            "headers": list(headers),
            "connect_timeout": connect_timeout,
            "max_message_bytes": max_message_bytes,
            "max_queued_events": max_queued_events,
            "close_timeout": close_timeout,
        }
        self._rng = rng
        self._client: AppendClient | None = None
        self._held: dict[str, _Held] = {}
        self._latest: str | None = None
        #: Creates sent whose ``response.created`` (or refusal) has not come back.
        self._unconfirmed: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = trio.Lock()
        self._changed = trio.Event()
        self._attempt = 0
        self._limit_reached = False  # the server said the connection reached its lifetime
        self._closing = False
        self._ended: ConnectionClosedError | None = None
        self._queue_send, self._queue_receive = trio.open_memory_channel[
            ServerEvent | RemoteProtocolError
        ](max_queued_events)

    def __repr__(self) -> str:
        state = "reconnecting" if self._client is None else repr(self._client)
        return f"<ResilientClient {state} live={len(self._held)} drops={self.drops}>"

    @property
    def current(self) -> AppendClient | None:
        """The connection in use; ``None`` while the client reconnects or once it ended."""
        return self._client

    @property
    def live_responses(self) -> list[str]:
        """The ids of the responses this client holds (started or taken up, not ended)."""
        return list(self._held)

    def unanswered(self, response: Response) -> list[str]:
        """The calls ``response`` (from a ``response.done`` or ``response.resumed``)
        waits for that this client has sent no output for, in its order."""
        action = response.required_action
        if not isinstance(action, RequiredAction):
            return []
        held = self._held.get(response.id)
        answered: Collection[str] = held.answered if held is not None else ()
        return [call_id for call_id in action.call_ids if call_id not in answered]

    # --- sending -----------------------------------------------------------

    async def create(self, **fields: Any) -> None:
        """Send ``response.create`` (as :meth:`AppendClient.create`), on the next
        connection if the client is reconnecting. A create whose
        ``response.created`` has not come back when the connection drops is
        sent again on the next one. Raises :class:`protocol.LocalProtocolError`
        (nothing sent) as :meth:`AppendClient.create` does, and
        :class:`ConnectionClosedError` once the client has given up.
        """
        while True:
            client = await self._ready(None)
            async with self._lock:
                if client is not self._client:
                    continue
                self._unconfirmed.append(fields)
                try:
                    await client.create(**fields)
                except ConnectionClosedError:
                    pass  # checked, and sent again on the next connection
                except BaseException:
                    self._unconfirmed.pop()
                    raise
                return

    async def append(
        self, input: str | Sequence[Item | Mapping[str, Any]], response_id: str | None = None
    ) -> None:
        """Send ``response.append`` (as :meth:`AppendClient.append`; without
        ``response_id`` to the response created last), once the response is
        live on the connection: while the client reconnects it waits for the
        response to be resumed. Its tool outputs are remembered until the
        response takes them in, and sent again if it is resumed still waiting
        for them.

        Raises :class:`protocol.LocalProtocolError` (nothing sent, nothing
        remembered) where :meth:`AppendClient.append` would, and
        :class:`ConnectionClosedError` when the client has given up, or when a
        drop cut off an append that carried other input than tool outputs
        (its outputs are remembered all the same).
        """
        target = self._target(response_id)
        items: list[InputItem] = []
        if not isinstance(input, str):
            event = _build_event(ResponseAppend, {"input": list(input), "response_id": target})
            assert isinstance(event, ResponseAppend)
            assert isinstance(event.input, list)
            items = event.input
        answers: dict[str, Item] = {}  # call id -> the output that answers it
        for item in items:
            if isinstance(item, McpApprovalResponse):
                answers[item.approval_request_id] = item
            elif isinstance(item, CallOutput):
                answers[answered_call_id(item)] = item
        only_answers = not isinstance(input, str) and len(answers) == len(items)
        while True:
            client = await self._ready(target)
            async with self._lock:
                held = self._held.get(target)
                if client is not self._client or (held is not None and held.resuming):
                    continue
                try:
                    await client.append(input, target)
                except ConnectionClosedError:
                    if held is None:
                        raise
                    held.outputs.update(answers)
                    held.answered.update(answers)
                    if not only_answers:
                        raise
                    return
                if held is not None:
                    held.outputs.update(answers)
                    held.answered.update(answers)
                return

    async def cancel(self, response_id: str | None = None) -> None:
        """Send ``response.cancel`` for ``response_id`` (default: the response
        created last), once it is live on the connection; until the response
        ends, it is sent again whenever the response is resumed (the cancel
        may have been lost with the connection). Raises as
        :meth:`AppendClient.cancel` does, and :class:`ConnectionClosedError`
        once the client has given up."""
        target = self._target(response_id)
        while True:
            client = await self._ready(target)
            async with self._lock:
                held = self._held.get(target)
                if client is not self._client or (held is not None and held.resuming):
                    continue
                try:
                    await client.cancel(target)
                except ConnectionClosedError:
                    if held is None:
                        raise
                if held is not None:
                    held.cancel = True
                return

    async def resume(self, response_id: str) -> None:
        """Send ``response.resume`` for a response of an earlier client (or
        process) that kept a checkpoint; from then on this client holds it.
        The answer comes in the event stream: ``response.resumed``, or an
        ``error`` naming it. Raises :class:`protocol.LocalProtocolError`
        (nothing sent) if this client holds it already."""
        if response_id in self._held:
            raise LocalProtocolError(
                f"Response {response_id!r} is held by this client already.",
                code=ErrorCode.INVALID_VALUE,
                param="response_id",
                response_id=response_id,
            )
        while True:
            client = await self._ready(None)
            async with self._lock:
                if client is not self._client:
                    continue
                self._held[response_id] = _Held(response_id, resuming=True)
                try:
                    await client.resume(response_id)
                except ConnectionClosedError:
                    pass  # sent again on the next connection
                except BaseException:
                    del self._held[response_id]
                    raise
                return

    def _target(self, response_id: str | None) -> str:
        target = response_id if response_id is not None else self._latest
        if target is None:
            raise LocalProtocolError(
                "There is no response to target; send response.create first or name one "
                "with response_id.",
                code=ErrorCode.RESPONSE_NOT_FOUND,
                param="response_id",
                status=404,
            )
        return target

    async def _ready(self, response_id: str | None) -> AppendClient:
        """The connection to send on, once there is one and ``response_id`` (if
        held) is live on it; raises :class:`ConnectionClosedError` once the
        client has ended."""
        while True:
            ended = self._ended
            if ended is not None:
                raise ConnectionClosedError(ended.code, ended.reason) from ended.__cause__
            held = self._held.get(response_id) if response_id is not None else None
            client = self._client
            if client is not None and (held is None or not held.resuming):
                return client
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- receiving ---------------------------------------------------------

    async def next_event(self, timeout: float | None = 30.0) -> ServerEvent:  # noqa: ASYNC109
        """Return the next server event, whichever connection it came on, waiting
        at most ``timeout`` seconds (:class:`trio.TooSlowError`).

        ``response.resumed`` is among them: the response taken up on a new
        connection; the events of that response numbered from its
        ``sequence_number`` on that came before it are void (their turn runs
        again). Raises :class:`protocol.RemoteProtocolError` in place of a
        message that broke the protocol, and :class:`ConnectionClosedError`
        once the client has ended (closed, a close code it does not retry, or
        given up) and every event before has been returned.
        """
        with trio.fail_after(math.inf if timeout is None else timeout):
            try:
                item = await self._queue_receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                ended = self._ended or ConnectionClosedError(CloseCode.NORMAL_CLOSURE)
                raise ConnectionClosedError(ended.code, ended.reason) from ended.__cause__
        if isinstance(item, RemoteProtocolError):
            raise item
        return item

    async def events(self) -> AsyncIterator[ServerEvent]:
        """Iterate over server events until the client ends: quietly after its
        own close or the server's normal closure (1000), else raising
        :class:`ConnectionClosedError`."""
        while True:
            try:
                event = await self.next_event(timeout=None)
            except ConnectionClosedError as exc:
                if self._closing or exc.code == CloseCode.NORMAL_CLOSURE:
                    return
                raise
            yield event

    async def until_done(
        self,
        response_id: str | None = None,
        timeout: float | None = 30.0,  # noqa: ASYNC109
    ) -> list[ServerEvent]:
        """Collect events as :meth:`AppendClient.until_done` does, up to a terminal
        event or an ``error``; and up to a ``response.resumed`` that waits for
        an output this client has not sent (its ``response.done`` was lost with
        the connection: answer :meth:`unanswered`)."""
        collected: list[ServerEvent] = []
        with trio.fail_after(math.inf if timeout is None else timeout):
            while True:
                event = await self.next_event(timeout=None)
                collected.append(event)
                if _ends_wait(event, response_id) or self._waits_for_us(event, response_id):
                    return collected

    def _waits_for_us(self, event: ServerEvent, response_id: str | None) -> bool:
        if not isinstance(event, ResponseResumed):
            return False
        if response_id is not None and event.response.id != response_id:
            return False
        held = self._held.get(event.response.id)
        if held is not None and held.cancel:
            return False  # its cancel went again: it ends without its outputs
        return bool(self.unanswered(event.response))

    # --- closing -----------------------------------------------------------

    async def aclose(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Close the connection in use and stop reconnecting. Safe to call twice;
        events not yet read are discarded."""
        self._closing = True
        self._notify()
        self._queue_receive.close()
        client = self._client
        if client is not None:
            await client.aclose(code, reason)

    # --- the pump ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The pump (started by :func:`resilient`): connect, hand on events,
        reconnect and resume, until the client ends. Raises what the first
        connect raises."""
        first = True
        code, reason, failure = ABNORMAL_CLOSURE, "", None
        try:
            while not self._closing:
                if not first:
                    if self._limit_reached:
                        self._limit_reached = False  # a new connection at once
                    else:
                        self._attempt += 1
                        if self._attempt > self.max_retries:
                            reason = f"gave up after {self.max_retries} reconnect attempts"
                            break
                        await trio.sleep(self._delay(self._attempt))
                try:
                    async with connect(self.url, **self._options) as client:
                        if first:
                            first = False
                            task_status.started()
                        failure = None  # the attempts before this one succeeded
                        code, reason = await self._serve(client)
                except _ATTEMPT_FAILURES as exc:
                    if first:
                        raise
                    failure = exc
                    continue
                finally:
                    self._client = None
                if self._closing or not (code in RETRYABLE_CLOSE_CODES or self._limit_reached):
                    break
                self.drops.append(code)
                for held in self._held.values():
                    held.resuming = True
                self._notify()
        finally:
            ended = ConnectionClosedError(code, reason)
            ended.__cause__ = failure
            self._ended = ended
            self._client = None
            self._notify()
            self._queue_send.close()

    def _delay(self, attempt: int) -> float:
        return reconnect_delay(
            attempt, initial_delay=self.initial_delay, max_delay=self.max_delay, rng=self._rng
        )

    async def _serve(self, client: AppendClient) -> tuple[int, str]:
        """One connection: take up what the client holds, then hand on its events
        until it closes; its close code and reason."""
        with contextlib.suppress(ConnectionClosedError):  # then the pump sees the close
            async with self._lock:
                for held in self._held.values():
                    await client.resume(held.response_id)
                for fields in self._unconfirmed:
                    await client.create(**fields)
        self._client = client
        self._notify()
        while True:
            try:
                event = await client.next_event(timeout=None)
            except RemoteProtocolError as exc:
                item: ServerEvent | RemoteProtocolError = exc
            except ConnectionClosedError as exc:
                return exc.code, exc.reason
            else:
                if not isinstance(event, ErrorEvent):
                    self._attempt = 0  # the SDKs' rule: an event is progress
                if not await self._note(client, event):
                    continue
                item = event
            try:
                await self._queue_send.send(item)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # closed by aclose(): events are discarded

    async def _note(self, client: AppendClient, event: ServerEvent) -> bool:
        """Note what ``event`` says of the held responses; False to keep it from
        the reader (the lifetime limit's error, which this client answers)."""
        if isinstance(event, ResponseCreated):
            if self._unconfirmed:
                self._unconfirmed.popleft()
            response_id = event.response.id
            self._held[response_id] = _Held(response_id)
            self._latest = response_id
        elif isinstance(event, ResponseResumed):
            await self._resumed(client, event)
        elif isinstance(event, ResponseInProgress):
            held = self._held.get(event.response.id)
            if held is not None:
                held.outputs.clear()  # taken in: the checkpoint before this event holds them
        elif isinstance(event, _TERMINAL):
            if event.response.status != "requires_action":
                self._held.pop(event.response.id, None)
        elif isinstance(event, ErrorEvent):
            if event.error.code == ErrorCode.WEBSOCKET_CONNECTION_LIMIT_REACHED:
                self._limit_reached = True
                return False
            if not isinstance(event.response_id, str):
                if self._unconfirmed:
                    self._unconfirmed.popleft()  # a refused create
            else:
                held = self._held.get(event.response_id)
                if held is not None and held.resuming:  # nothing to resume: it ends here
                    del self._held[event.response_id]
                    self._notify()
        return True

    async def _resumed(self, client: AppendClient, event: ResponseResumed) -> None:
        """A held response is live on ``client`` again: the outputs it still waits
        for go again (before the reader sees the event), then a cut-off cancel."""
        response = event.response
        async with self._lock:
            held = self._held.setdefault(response.id, _Held(response.id))
            action = response.required_action
            waiting = set(action.call_ids) if isinstance(action, RequiredAction) else set()
            held.outputs = {c: item for c, item in held.outputs.items() if c in waiting}
            try:
                if held.outputs:
                    await client.append(list(held.outputs.values()), response.id)
                if held.cancel:
                    await client.cancel(response.id)
            except ConnectionClosedError:
                pass  # dropped again: the next connection resumes it again
            held.resuming = False
        self._notify()


@contextlib.asynccontextmanager
async def resilient(
    url: str,
    *,
    headers: Sequence[tuple[str | bytes, str | bytes]] = (),
    connect_timeout: float = 10.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_queued_events: int = MAX_QUEUED_EVENTS,
    close_timeout: float = CLOSE_TIMEOUT,
    max_retries: int = MAX_RETRIES,
    initial_delay: float = INITIAL_DELAY,
    max_delay: float = MAX_DELAY,
    rng: random.Random | None = None,
) -> AsyncIterator[ResilientClient]:
    """Connect to ``url`` in append mode and yield a :class:`ResilientClient`,
    which reconnects and resumes its responses when the connection drops.

    The first connection is opened as :func:`connect` opens one (and raises
    as it does); later ones are retried with :func:`reconnect_delay`
    (``initial_delay``, ``max_delay``, ``rng`` for the jitter), at most
    ``max_retries`` times in a row. On exit the connection is closed (1000,
    or 1011 if the block raised); exceptions from the block propagate unwrapped.
    """
    client = ResilientClient(
        url,
        headers=headers,
        connect_timeout=connect_timeout,
        max_message_bytes=max_message_bytes,
        max_queued_events=max_queued_events,
        close_timeout=close_timeout,
        max_retries=max_retries,
        initial_delay=initial_delay,
        max_delay=max_delay,
        rng=rng,
    )
    with unwrapped():
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            async with closing(client, nursery):
                yield client
