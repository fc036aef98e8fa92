"""The Chat Completions backend: a model turn is one streaming ``POST /chat/completions``.

Theory of operation
-------------------
vLLM, llama.cpp's ``llama-server``, Ollama, SGLang and OpenAI all serve the
Chat Completions API. :class:`ChatBackend` holds one ``httpx.AsyncClient``
(one connection pool) for its model, with the API key read once from the
variable ``api_key_env`` names and sent as ``Authorization: Bearer``; it is
never logged and never part of an error (cut out of what the engine says,
mid-stream too; httpx's per-request INFO logs, which show the URL, are
turned down to WARNING). Each rollout gets a
:class:`ChatSampler` of its own: its turns send the whole context (the rollout
holds the conversation; :func:`chat_body` maps the items to messages, the
instructions to the leading system message, function tools, ``tool_choice``,
``parallel_tool_calls``, the turn's output budget, ``temperature``, ``top_p``
and the metadata), with ``stream_options.include_usage``. Two settings fit
an engine's template: ``tool_choice_auto`` sends ``required`` for the
client's ``auto`` (an engine that cannot parse its model's free choice), and
``text_grammar`` goes as llama.cpp's ``grammar`` on a turn that may not call
a tool (an answer must begin with the marker the template's parser expects).

**Affinity.** A resume sends the engine the same token prefix again. The
conversation's key (``SampleRequest.affinity``: from the client's
``prompt_cache_key``, else from the chain's first response id, so an HTTP
chain keeps one key for its whole life; the sampler's own random key where
there is neither) goes in the configured header (default
``x-longresponse-affinity``) on every turn, so a router in front of several
engines can keep the conversation on one, whose prefix cache then holds the
prefix; with ``cache_prompt`` the body asks llama.cpp to keep it too.
With ``slots`` (llama.cpp's ``--parallel``) a turn is pinned to its key's home
slot (``id_slot``) only while that slot is free: while the backend's own
turns fill as many slots as there are, or one holds the home slot, the slot
is left to the engine. A pinned request waits for its slot even while others
are idle, and llama.cpp saves and restores prompts on it as it goes; left to
choose, llama.cpp takes the idle slot whose cache is most like the prompt and
restores the rest from its host-memory prompt cache (``--cache-ram``).
Issue 22 measured pinning always at 46-51% of the prefix reused with six
rollouts over two slots; docs/BENCHMARKS.md has the figures since.

**Timeouts** (the backend's configuration): ``connect_timeout`` to open a
connection; ``first_token_timeout`` from sending the request to the first
stream record (retries included); ``idle_timeout`` between two records. Each
ends the turn with ``upstream_unavailable``, naming the timeout.

**Retries.** A kept connection the engine closed meanwhile (llama.cpp's
server closes one after each streamed answer while its headers say
keep-alive, and the close can come just after the next turn took the
connection from the pool) fails before any answer: the request is sent again
at once, one time, on a fresh connection (:func:`send_kept_or_fresh`):
nothing had reached the engine. Before anything is produced, a connection that cannot be made
and an answer of 429, 502, 503 or 504 are retried up to ``max_retries``
times, after ``retry_backoff * 2**n`` seconds (or the engine's
``Retry-After``, when it asks for at most :data:`MAX_RETRY_WAIT`). Once a
stream has begun nothing is retried: the turn fails with what it wrote
(``Rollout.cut_short`` in ``longresponse.engine.rollout``).

**A stream's end.** ``data: [DONE]`` before the engine's ``finish_reason``
is a cut stream (some proxies end one so), as is a body that ends early. A
finished stream is read on to the body's end (briefly: :func:`_drain`) so
that httpx keeps the connection for the rollout's next turn.

**Cancellation.** The sampler is an async generator that the rollout closes
(``contextlib.aclosing``) when the client cancels or goes away; its
``finally`` closes the HTTP response at once, which closes the connection,
and the engine sees the stream end.

**Counting.** The rollout bills the engine's own ``usage``; with
``running_counts`` the body asks llama.cpp for its counts in every record
(``timings_per_token``, ``return_progress``), which the rollout bills as
they come, so a turn cut before the last record (a cancel, a client gone, a
steer) is billed the engine's count too (``chat_stream``). The engine's
``/v1/models`` is asked once at start whether it serves ``upstream_model``
(``served_model``), and while that had no answer, each record's ``model``.
Before a turn the
sampler checks the context against ``context_window`` by the engine's own
count where it has one: ``POST /tokenize`` when configured (``tokenize``),
else the ``prompt_tokens`` the engine reported last turn plus the o200k
estimate of what was added since (scaled down with the context after a
compaction replaced it); on the first turn the rollout's own o200k check
stands. The turn's output limit is the budget left, never past the backend's
cap nor the window less that count and a margin (:func:`window_margin`);
with no count of the engine's, a limit only the window would set is left out
(the engine stops at its own window). A prompt that leaves the window no
room beside the margin is refused before the engine is asked
(``context_length_exceeded``, never a limit of one token), and a turn the
window's room cut short stops ``context_length_exceeded``, not
``max_output_tokens``: the budget was not spent. A spent budget (0) asks
the engine for nothing: the turn stops ``max_output_tokens``.

**Compaction.** The sampler ``summarizes``: when its rollout compacts, it is
asked for the summary's text in a turn of its own (``engine/compaction.py``:
the context, the instruction as the last user message, ``tool_choice:
"none"``, the text's budget as the output limit), sent as any turn is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
import msgspec

from protocol.response import FormatText

from ..chat.mapping import (
    McpFunction,
    format_to_chat,
    mcp_functions,
    messages_from_items,
    tool_choice_to_chat,
    tools_to_chat,
)
from ..config import BackendConfig
from ..engine.sampling import SampleChunk, SampleRequest, Stop, UpstreamError, Usage
from .chat_stream import ChunkReader, decode_chunk, refusal
from .served_model import ServedModel
from .tls import client_context

__all__ = [
    "MAX_RETRY_WAIT",
    "STALE_CONNECTION",
    "ChatBackend",
    "ChatSampler",
    "chat_body",
    "home_slot",
    "send_kept_or_fresh",
    "set_output_limit",
    "window_margin",
]

log = logging.getLogger(__name__)

#: The longest ``Retry-After`` a retry waits for; a longer one is the client's to honour.
MAX_RETRY_WAIT: Final = 5.0
#: Bytes of an engine's error answer read (the rest is not needed to report it).
MAX_ERROR_BYTES: Final = 64 * 1024
#: Connections to one engine at once (a turn holds one while it streams).
MAX_CONNECTIONS: Final = 1024
_RETRIED: Final = frozenset({429, 502, 503, 504})
#: How a kept connection the engine had closed fails before any answer came:
#: sent again once, at once, on a fresh connection.
STALE_CONNECTION: Final = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
#: How long, and for how many lines, a finished stream is read on to its end.
DRAIN_SECONDS: Final = 0.25
MAX_DRAIN_LINES: Final = 64


def chat_body(
    config: BackendConfig,
    request: SampleRequest,
    affinity: str = "",
    prompt_tokens: int | None = None,
    mcp: Mapping[str, McpFunction] | None = None,
) -> dict[str, Any]:
    """The ``POST /chat/completions`` body of one turn of the rollout whose
    affinity key (hex) is ``affinity``; ``prompt_tokens`` is the engine's count
    of the prompt, where known (:func:`set_output_limit`); ``mcp`` the MCP
    tools offered as functions (:func:`mcp_functions` of the request)."""
    messages = messages_from_items(request.context, request.instructions)
    if mcp is None:
        mcp = mcp_functions(request.tools, request.context)
    body: dict[str, Any] = {
        "model": config.model,
        "messages": msgspec.to_builtins(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # Function tools, then the listed tools of the request's MCP servers.
    chat_tools = [*tools_to_chat(request.tools), *(f.tool for f in mcp.values())]
    choice: object = tool_choice_to_chat(request.tool_choice)
    if chat_tools:
        if choice == "auto":
            choice = config.tool_choice_auto  # (checked: auto or required)
        body["tools"] = msgspec.to_builtins(chat_tools)
        body["tool_choice"] = msgspec.to_builtins(choice)
        body["parallel_tool_calls"] = request.parallel_tool_calls
    formatted = request.text_format is not None and not isinstance(request.text_format, FormatText)
    if config.text_grammar and (not chat_tools or choice == "none") and not formatted:
        body["grammar"] = config.text_grammar
    set_output_limit(body, config, request, prompt_tokens)
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.metadata:
        body["metadata"] = dict(request.metadata)
    if formatted:
        body["response_format"] = msgspec.to_builtins(format_to_chat(request.text_format))
    if config.cache_prompt:
        body["cache_prompt"] = True
    if config.running_counts:
        body["timings_per_token"] = True
        body["return_progress"] = True
    slot = home_slot(config, affinity)
    if slot is not None:
        body["id_slot"] = slot
    return body


class _Opened:
    """httpcore's trace of one request: whether it opened a new connection
    (else it went out on one the pool had kept)."""

    __slots__ = ("opened",)

    def __init__(self) -> None:
        self.opened = False

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        if name.startswith(("connection.connect_tcp.", "connection.connect_unix_socket.")):
            self.opened = True


async def send_kept_or_fresh(
    kept: httpx.AsyncClient,
    fresh: httpx.AsyncClient,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    where: str,
) -> httpx.Response:
    """``POST`` ``content`` to ``url`` for a streaming answer, on a connection
    ``kept`` holds if it has one. When that connection turns out to be one the
    engine had closed meanwhile (:data:`STALE_CONNECTION` on a connection the
    pool kept, not one opened for this request: nothing reached the engine),
    the request goes once more, at once, on a new connection (``fresh`` keeps
    none); a connection opened for the request that fails so is not retried
    here (the engine may have read the request).

    Raises what httpx raises; nothing is left open then.
    """
    trace = _Opened()
    request = kept.build_request(
        "POST", url, content=content, headers=headers, extensions={"trace": trace}
    )
    try:
        return await kept.send(request, stream=True)
    except STALE_CONNECTION as exc:
        if trace.opened:
            raise
        log.info(
            "the engine at %s had closed a kept connection (%s); sending again on a new one",
            where,
            type(exc).__name__,
        )
    request = fresh.build_request("POST", url, content=content, headers=headers)
    return await fresh.send(request, stream=True)


def home_slot(config: BackendConfig, affinity: str) -> int | None:
    """The llama.cpp slot a conversation with key ``affinity`` (hex) is pinned to
    while it is free (``slots``), or None."""
    if not config.slots or not affinity:
        return None
    return int(affinity[:8], 16) % config.slots


def window_margin(count: int) -> int:
    """Tokens of the window kept free beyond a prompt counted ``count``: the
    count may be partly an estimate, and engines count a little differently."""
    return count // 20 + 32


def set_output_limit(
    body: dict[str, Any], config: BackendConfig, request: SampleRequest, prompt_tokens: int | None
) -> bool:
    """The turn's output limit in ``body``: the budget left, never past the
    backend's cap nor what the window leaves after the prompt less a margin
    (an engine refuses a limit past its window with a 400). With no count of
    the engine's (a first turn without ``tokenize``), the limit is left out
    where only the window would bind: the engine then stops at its own window.
    True when the window, not the budget, bounds the turn's output.

    Raises :class:`UpstreamError` ``context_length_exceeded`` (``body``
    without a limit) when the engine's count of the prompt leaves no room."""
    body.pop(config.max_tokens_field, None)
    if request.max_output_tokens is None:
        return False
    limit = min(request.max_output_tokens, config.max_output_tokens)
    count = prompt_tokens
    if count is None:
        count = request.cached_tokens + request.uncached_tokens  # our o200k estimate
    room = config.context_window - count - window_margin(count)
    if room < limit and prompt_tokens is None:
        return True
    if room < 1:
        raise UpstreamError(
            f"Your input is about {count} tokens; the context window of {config.name} is "
            f"{config.context_window}, which leaves no room for output beside it.",
            code="context_length_exceeded",
            status=400,
            param="input",
        )
    body[config.max_tokens_field] = min(limit, room)
    return room < limit


class ChatBackend:
    """One engine's Chat Completions API: the connection pool and the key."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        for name in ("httpx", "httpcore"):  # they log each request's URL at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
        #: The API key, read once; only ever sent in the Authorization header.
        self._key = os.environ.get(config.api_key_env) if config.api_key_env else None
        headers = {"authorization": f"Bearer {self._key}"} if self._key else {}
        root = config.base_url.rstrip("/")
        self.url = f"{root}/chat/completions"
        #: vLLM serves /tokenize beside /v1, not under it.
        self.tokenize_url = f"{root.removesuffix('/v1')}/tokenize"
        parts = urlsplit(root)
        #: Where the engine is, for messages (never the URL's credentials).
        self.where = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        timeout = httpx.Timeout(None, connect=config.connect_timeout, pool=config.connect_timeout)
        self.client = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            verify=client_context(),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=64),
        )
        #: For the one retry after a stale kept connection: keeps none, so every
        #: request it sends goes on a new connection.
        self.fresh = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            verify=client_context(),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=0),
        )
        #: This backend's turns talking to the engine now, and the slots pinned
        #: among them (``slots``: a turn is pinned only while its slot is free).
        self.in_flight = 0
        self.pinned: set[int] = set()
        #: Whether the engine serves ``upstream_model``: asked at start, else its first answer.
        self.served = ServedModel(config, self._key)

    def make_sampler(self) -> ChatSampler:
        return ChatSampler(self)

    async def check(self) -> None:
        """Ask the engine once whether it serves the configured model (``served_model``)."""
        await self.served.check()

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.fresh.aclose()

    def claim_slot(self, body: dict[str, Any]) -> int | None:
        """Keep the body's ``id_slot`` while the slot is free (the module's rule) and
        note it taken, else drop it: the engine picks. Call before the turn is
        counted in :attr:`in_flight`; :meth:`release_slot` gives it back."""
        slot = body.get("id_slot")
        if slot is None:
            return None
        if self.in_flight >= self.config.slots or slot in self.pinned:
            del body["id_slot"]
            return None
        self.pinned.add(slot)
        return int(slot)

    def release_slot(self, slot: int | None) -> None:
        """A turn no longer talks to the engine: its slot (if pinned) is free."""
        self.in_flight -= 1
        if slot is not None:
            self.pinned.discard(slot)

    def unreachable(self, why: str) -> UpstreamError:
        return UpstreamError(f"The upstream engine at {self.where} {why}.")

    async def open_stream(
        self, body: bytes, headers: dict[str, str], deadline: float
    ) -> httpx.Response:
        """The engine's streaming answer (status 200), retried as the module says.

        Raises :class:`UpstreamError`; nothing is left open then.
        """
        config, loop = self.config, asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    response = await send_kept_or_fresh(
                        self.client, self.fresh, self.url, body, headers, self.where
                    )
            except httpx.ConnectTimeout:
                limit = config.connect_timeout
                failed = self.unreachable(
                    f"could not be connected to within connect_timeout ({limit:g} s)"
                )
            except httpx.ConnectError:
                failed = self.unreachable("could not be reached (the connection was refused)")
            except TimeoutError:
                raise self._first_token_timeout() from None
            except httpx.TransportError as exc:
                raise self.unreachable(
                    f"closed the connection before answering ({type(exc).__name__})"
                ) from None
            else:
                if response.status_code == 200:
                    return response
                try:
                    answer = await _read_some(response.aiter_bytes(), MAX_ERROR_BYTES)
                except httpx.TransportError:
                    answer = b""
                finally:
                    await response.aclose()
                retry = response.headers.get("retry-after")
                failed = refusal(response.status_code, answer, retry=retry, secret=self._key)
                if response.status_code not in _RETRIED:
                    raise failed
            wait = config.retry_backoff * 2**attempt
            if failed.retry_after is not None:
                wait = max(wait, failed.retry_after)
            attempt += 1
            late = loop.time() + wait >= deadline
            if attempt > config.max_retries or wait > MAX_RETRY_WAIT or late:
                raise failed
            await asyncio.sleep(wait)

    def ended_early(self, reader: ChunkReader) -> UpstreamError:
        return UpstreamError(
            f"The upstream engine at {self.where} ended the stream before the turn ended.",
            output_started=reader.output_started,
        )

    def _first_token_timeout(self) -> UpstreamError:
        return self.unreachable(
            f"sent nothing within first_token_timeout ({self.config.first_token_timeout:g} s)"
        )

    async def count(self, body: dict[str, Any], headers: dict[str, str]) -> int | None:
        """The engine's count of the prompt (``POST /tokenize``), or None if it gave none."""
        payload = {"model": body["model"], "messages": body["messages"]}
        if "tools" in body:
            payload["tools"] = body["tools"]
        try:
            async with asyncio.timeout(self.config.first_token_timeout):
                answer = await self.client.post(
                    self.tokenize_url, content=msgspec.json.encode(payload), headers=headers
                )
            count = answer.json().get("count") if answer.status_code == 200 else None
        except (httpx.HTTPError, TimeoutError, ValueError, AttributeError):
            return None
        return count if isinstance(count, int) else None


class ChatSampler:
    """One rollout's sampler: its affinity key and the engine's last count."""

    #: It writes its rollout's compaction summary (a summary turn).
    summarizes = True

    def __init__(self, backend: ChatBackend) -> None:
        self.backend = backend
        self.affinity = secrets.token_hex(16)
        self._headers = {"content-type": "application/json"}
        if backend.config.affinity_header:
            self._headers[backend.config.affinity_header] = self.affinity
        #: The engine's ``prompt_tokens`` last turn, and the o200k count of that context.
        self._prompt_tokens: int | None = None
        self._estimated_then = 0

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        backend = self.backend
        if request.max_output_tokens == 0:  # the budget is spent: nothing to ask for
            yield Stop("max_output_tokens")
            return
        affinity = request.affinity or self.affinity
        headers = self._headers
        if backend.config.affinity_header and affinity != self.affinity:
            headers = {**headers, backend.config.affinity_header: affinity}
        mcp = mcp_functions(request.tools, request.context)
        body = chat_body(backend.config, request, affinity, mcp=mcp)
        estimated = request.cached_tokens + request.uncached_tokens
        count = await self._check_window(body, estimated)
        window_bound = set_output_limit(body, backend.config, request, count)
        slot = backend.claim_slot(body)
        backend.in_flight += 1
        deadline = asyncio.get_running_loop().time() + backend.config.first_token_timeout
        try:
            response = await backend.open_stream(msgspec.json.encode(body), headers, deadline)
        except BaseException:
            backend.release_slot(slot)
            raise
        reader = ChunkReader(secret=backend._key, mcp=mcp, window_bound=window_bound)
        try:
            async with contextlib.aclosing(self._payloads(response, reader, deadline)) as payloads:
                async for data in payloads:
                    record = decode_chunk(data)
                    if record.model is not None:
                        backend.served.answered_as(record.model)
                    for chunk in reader.feed(record):
                        self._note(chunk, estimated)
                        yield chunk
            for chunk in reader.end():
                self._note(chunk, estimated)
                yield chunk
        except httpx.TransportError as exc:
            raise UpstreamError(
                f"The upstream engine at {backend.where} broke off the stream "
                f"({type(exc).__name__}).",
                output_started=reader.output_started,
            ) from None
        finally:
            backend.release_slot(slot)
            await response.aclose()

    def _note(self, chunk: SampleChunk, estimated: int) -> None:
        """Keep the engine's latest count of the prompt (with our estimate of that
        context) for the next turn's window check."""
        if isinstance(chunk, Usage):
            self._prompt_tokens, self._estimated_then = chunk.input_tokens, estimated

    async def _payloads(
        self, response: httpx.Response, reader: ChunkReader, deadline: float
    ) -> AsyncGenerator[str, None]:
        """The ``data:`` payloads of the engine's stream up to ``[DONE]``, each
        within its deadline: ``first_token_timeout`` until the stream starts
        (its first record but llama.cpp's prefill progress, as ``reader`` read
        it), then ``idle_timeout`` between lines. A stream that ends before the
        engine said it finished, or goes silent, is an :class:`UpstreamError`."""
        backend, config = self.backend, self.backend.config
        loop = asyncio.get_running_loop()
        lines = response.aiter_lines()
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    line = await anext(lines)
            except StopAsyncIteration:
                if not reader.finished:
                    raise backend.ended_early(reader) from None
                return
            except TimeoutError:
                if reader.started_stream:
                    raise backend.unreachable(
                        f"sent nothing for idle_timeout ({config.idle_timeout:g} s)"
                    ) from None
                raise backend._first_token_timeout() from None
            if not line.startswith("data:"):
                if reader.started_stream:
                    deadline = loop.time() + config.idle_timeout
                continue  # blank lines, comments, event names
            data = line[5:].strip()
            if data == "[DONE]":
                if not reader.finished:  # a proxy's cut stream can end so too
                    raise backend.ended_early(reader)
                await _drain(lines)  # to the body's end: the connection is kept
                return
            yield data  # read: from the answer's first record the idle deadline holds
            if reader.started_stream:
                deadline = loop.time() + config.idle_timeout

    async def _check_window(self, body: dict[str, Any], estimated: int) -> int | None:
        """Refuse a context longer than the window by the engine's count (module
        docstring); that count, or None where the engine has given none yet."""
        config = self.backend.config
        count: int | None = None
        if config.tokenize:
            count = await self.backend.count(body, self._headers)
        then = self._estimated_then
        if count is None and self._prompt_tokens is not None:
            if estimated >= then:  # the context grew by what was added since
                count = self._prompt_tokens + estimated - then
            else:  # replaced by a smaller one (a compaction's window): scaled down
                count = math.ceil(self._prompt_tokens * estimated / then)
        if count is not None and count > config.context_window:
            raise UpstreamError(
                f"Your input is about {count} tokens; the context window of {config.name} "
                f"is {config.context_window}.",
                code="context_length_exceeded",
                status=400,
                param="input",
            )
        return count


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read a finished stream to its end, briefly: httpx returns a connection to
    its pool only when its answer was read whole (else the next turn opens
    another). An engine that keeps it open longer loses the connection only."""
    with contextlib.suppress(TimeoutError, StopAsyncIteration, httpx.HTTPError):
        async with asyncio.timeout(DRAIN_SECONDS):
            for _ in range(MAX_DRAIN_LINES):
                await anext(lines)


async def _read_some(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    kept = bytearray()
    async for chunk in chunks:
        kept += chunk
        if len(kept) >= limit:
            break
    return bytes(kept[:limit])
