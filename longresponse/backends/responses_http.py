"""The Responses backend over HTTP: each model turn is one streaming ``POST /responses``.

Theory of operation
-------------------
:class:`ResponsesBackend` owns one ``httpx.AsyncClient`` (a connection pool)
for every rollout of its model; each rollout gets a :class:`ResponsesSampler`
of its own, which holds the rollout's :class:`~.responses_wire.Chain`. A turn
posts the create of :func:`~.responses_wire.create_body` with ``stream:
true`` and reads the Server-Sent Events as they come, each record's data
decoded and passed to a :class:`~.responses_wire.TurnReader`.

With ``upstream_store`` the upstream keeps every response, so a turn
continues the last one with ``previous_response_id`` and only the items
added since; without it each turn sends ``store: false`` and the whole
context. An upstream that no longer has the previous response
(``previous_response_not_found``) gets the full input at once; one that
refuses ``previous_response_id`` altogether (llama.cpp's server keeps no
responses) shows ``upstream_store`` wrongly set: a server error, never the
client's ``invalid_request_error``, logged as such with the setting to change.

Timeouts: connecting (``connect_timeout``, httpx's), the first event (any
event: ``response.created`` comes first, and a long reasoning phase sends
no visible output) within ``first_token_timeout`` of the request, then at
most ``idle_timeout`` between two events; an error answer's body is read
within the first deadline too, and at most :data:`MAX_ERROR_BYTES` of it.
A kept connection the upstream closed meanwhile is replaced by a fresh one
once, at once (nothing reached the upstream; the chat backend's
``send_kept_or_fresh``). A request the upstream cannot have begun (the connection could not be made,
or it answered 429 or 5xx before any event) is sent again up to
``max_retries`` times with exponential backoff from ``retry_backoff`` (or
the upstream's ``Retry-After`` if longer, up to :data:`MAX_RETRY_WAIT`).
Any other failure is final: one after the upstream's first event, a
timeout, a connection that broke once the request was on its way
(:attr:`~.responses_wire.TurnReader.begun`) — sending it again could run
the response twice. When the rollout's turn is cancelled (a client's
``response.cancel``, a disconnect) the generator is closed, and with it the
request: the streaming response's connection is closed. A turn that ended
reads the rest of the body (``[DONE]``, its end) for at most
:data:`DRAIN_TIMEOUT`, so the connection goes back to the pool for the
next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
import msgspec

from ..config import BackendConfig
from ..engine.sampling import SampleChunk, SampleRequest, Stop, UpstreamError, Usage
from .chat import send_kept_or_fresh
from .registry import missing_keys
from .responses_wire import (
    CHAIN_LOST,
    ChainedTurns,
    TurnReader,
    create_body,
    refused,
    turn_ended,
)
from .responses_wire import retryable as _retryable
from .served_model import ServedModel
from .settings import SettingsError
from .tls import client_context

__all__ = [
    "DRAIN_TIMEOUT",
    "MAX_ERROR_BYTES",
    "MAX_RETRY_WAIT",
    "ResponsesBackend",
    "ResponsesSampler",
    "api_key",
    "auth_headers",
    "retry_wait",
]


#: The longest wait before a retry; a longer ``Retry-After`` ends the turn at once.
MAX_RETRY_WAIT: Final = 10.0
#: The most of an error answer's body read (its message is all that is kept).
MAX_ERROR_BYTES: Final = 64 * 1024
#: Seconds a turn that ended waits for the rest of the body before it drops the connection.
DRAIN_TIMEOUT: Final = 1.0


def api_key(config: BackendConfig) -> str | None:
    """The API key ``config.api_key_env`` names (None without one).

    Raises :class:`SettingsError` naming the variable (never a value) if it is unset.
    """
    if (why := missing_keys([config])) is not None:
        raise SettingsError(why)
    return os.environ.get(config.api_key_env) if config.api_key_env else None


def auth_headers(key: str | None) -> dict[str, str]:
    """The ``Authorization`` header for ``key`` (:func:`api_key`; none without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def retry_wait(config: BackendConfig, exc: UpstreamError, attempt: int) -> float | None:
    """Seconds to wait before sending again, or None: the failure is final."""
    if attempt >= config.max_retries or not _retryable(exc):
        return None
    wait = max(config.retry_backoff * 2**attempt, exc.retry_after or 0.0)
    return wait if wait <= MAX_RETRY_WAIT else None


class ResponsesBackend:
    """A Responses server over HTTP (OpenAI, or another longresponse)."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/responses"
        self.key = api_key(config)
        headers = {**auth_headers(self.key), "Content-Type": "application/json"}
        timeout = httpx.Timeout(
            connect=config.connect_timeout,
            read=None,  # the first-token and idle deadlines are the sampler's
            write=config.idle_timeout,
            pool=config.connect_timeout,
        )
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout, verify=client_context())
        #: Keeps no connection: the one retry after a stale kept one goes on a new one.
        self.fresh = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            verify=client_context(),
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        parts = urlsplit(config.base_url)
        #: Where the upstream is, for the log (never the URL's credentials).
        self.where = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        self.served = ServedModel(config, self.key)

    def make_sampler(self) -> ResponsesSampler:
        return ResponsesSampler(self)

    async def check(self) -> None:
        """Ask the upstream once whether it serves the configured model (``served_model``)."""
        await self.served.check()

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.fresh.aclose()


class ResponsesSampler(ChainedTurns):
    """One rollout's turns: its chain of upstream responses, and its affinity key."""

    def __init__(self, backend: ResponsesBackend) -> None:
        super().__init__(backend.config)
        self.backend = backend

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        if request.max_output_tokens == 0:  # the budget is spent: nothing to ask for
            yield Stop("max_output_tokens")
            return
        config = self.backend.config
        attempt = 0
        while True:
            sent = list(request.context)
            previous, items = (
                self.chain.continuation(sent) if config.upstream_store else (None, sent)
            )
            self.reasoned.attach(sent)
            body = create_body(config, request, items, previous, self.reasoned)
            body["stream"] = True
            reader = TurnReader(secret=self.backend.key)
            try:
                async with contextlib.aclosing(self._turn(body, reader)) as chunks:
                    async for chunk in chunks:
                        if isinstance(chunk, Usage):  # the upstream response ended
                            chain = self.chain if config.upstream_store else None
                            turn_ended(reader, sent, items, previous, chain, self.reasoned)
                        yield chunk
                return
            except UpstreamError as exc:
                if reader.begun:
                    raise  # the upstream may have begun it: never run it twice
                if previous is not None and _refuses_chaining(exc):
                    raise _misconfigured(config, exc) from None
                if previous is not None and exc.code in CHAIN_LOST:  # (nothing started: not begun)
                    self.chain.forget()  # the upstream forgot it: send everything
                    continue
                wait = retry_wait(config, exc, attempt)
                if wait is None:
                    raise
            attempt += 1
            await asyncio.sleep(wait)

    async def _turn(
        self, body: dict[str, Any], reader: TurnReader
    ) -> AsyncGenerator[SampleChunk, None]:
        config = self.backend.config
        first_deadline = asyncio.get_running_loop().time() + config.first_token_timeout
        try:
            async with asyncio.timeout_at(first_deadline):
                response = await self._send(msgspec.json.encode(body))
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Nothing was sent: trying again is safe.
            raise UpstreamError(f"The upstream could not be reached ({_kind(exc)}).") from None
        except TimeoutError:
            reader.begun = True  # the request may be running upstream
            raise UpstreamError(
                f"The upstream did not answer within {config.first_token_timeout:g} s."
            ) from None
        except httpx.HTTPError as exc:
            reader.begun = True  # the request may have arrived
            raise UpstreamError(f"The upstream broke off the request ({_kind(exc)}).") from None
        try:
            if response.status_code != 200:
                raise refused(
                    response.status_code,
                    await _error_body(response, first_deadline),
                    response.headers.get("retry-after"),
                    secret=self.backend.key,
                )
            async with contextlib.aclosing(_records(response.aiter_lines())) as records:
                while not reader.ended:
                    data = await self._next(records, reader, first_deadline)
                    for chunk in reader.read(reader.decode(data)):
                        yield chunk
                await _drain(records)
        finally:
            await response.aclose()  # mid-stream: the connection is closed, not reused

    async def _send(self, content: bytes) -> httpx.Response:
        """The streaming answer, once more on a new connection if the kept one
        turns out closed by the upstream (``send_kept_or_fresh``)."""
        backend = self.backend
        return await send_kept_or_fresh(
            backend.client, backend.fresh, backend.url, content, self.headers, backend.where
        )

    async def _next(
        self, records: AsyncGenerator[str, None], reader: TurnReader, first_deadline: float
    ) -> str:
        """The next event's data, within the first-token or the idle deadline."""
        config = self.backend.config
        if reader.begun:
            wait = config.idle_timeout
            deadline = asyncio.get_running_loop().time() + wait
        else:
            wait, deadline = config.first_token_timeout, first_deadline
        try:
            async with asyncio.timeout_at(deadline):
                data = await anext(records, None)
        except TimeoutError:
            reader.begun = True
            raise UpstreamError(
                f"The upstream sent nothing for {wait:g} s.", output_started=reader.started
            ) from None
        except httpx.HTTPError as exc:
            reader.begun = True
            raise UpstreamError(
                f"The upstream broke off the stream ({_kind(exc)}).",
                output_started=reader.started,
            ) from None
        if data is None:
            reader.begun = True
            raise UpstreamError(
                "The upstream ended the stream before the response ended.",
                output_started=reader.started,
            )
        return data


def _refuses_chaining(exc: UpstreamError) -> bool:
    """The upstream refused ``previous_response_id`` itself (llama.cpp's server
    keeps no responses): not the client's request, this server's settings."""
    return (
        exc.status == 400
        and exc.code not in CHAIN_LOST
        and (exc.param == "previous_response_id" or "previous_response_id" in exc.message)
    )


def _misconfigured(config: BackendConfig, exc: UpstreamError) -> UpstreamError:
    """A server error for the client; for the operator (the log), what to change."""
    return UpstreamError(
        f"The server's upstream for model {config.name!r} is misconfigured.",
        code="server_error",
        status=500,
        misconfigured=True,
        cause=(
            f"upstream_store = true, but the upstream refuses previous_response_id "
            f"({exc.message!r}): set upstream_store = false in [models.{config.name}]"
        ),
    )


async def _records(lines: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """The data of each Server-Sent Event (``event:`` names and comments ignored)."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
        elif not line and data:
            record, data = "\n".join(data), []
            if record != "[DONE]":
                yield record


async def _drain(records: AsyncGenerator[str, None]) -> None:
    """Read what follows the terminal event, so the connection can be reused; an
    upstream that goes on past :data:`DRAIN_TIMEOUT` has its connection closed."""
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(DRAIN_TIMEOUT):
            async for _ in records:
                pass


async def _error_body(response: httpx.Response, deadline: float) -> Mapping[str, Any] | None:
    """An error answer's JSON body: at most :data:`MAX_ERROR_BYTES`, read by ``deadline``
    (None if it is not JSON, or did not come whole in time)."""
    kept = bytearray()
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout_at(deadline):
            async for chunk in response.aiter_bytes():
                kept += chunk
                if len(kept) >= MAX_ERROR_BYTES:
                    break
    try:
        body = msgspec.json.decode(kept)
    except msgspec.DecodeError:
        return None
    return body if isinstance(body, Mapping) else None


def _kind(exc: Exception) -> str:
    """What went wrong, without the request (whose headers hold the key)."""
    return type(exc).__name__
