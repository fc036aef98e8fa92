"""``longresponse bench``: every transport side by side on simulated agent rollouts.

Theory of operation
-------------------
A rollout is one simulated agent loop: the client sends the task, the model
(the deterministic ``sim``) asks for ``--tool-calls`` tool calls one at a
time, the client "runs" each (sleeping ``--tool-latency-ms``) and sends back a
tool output of about ``--output-tokens`` tokens, and the model ends with an
answer that quotes every tool output. The same rollout is driven through each
transport:

``http``         ``POST /v1/responses`` chained with ``previous_response_id``
                 (``store: true``): the server rebuilds the history from the
                 store on every turn. The stateless baseline.
``http-full``    HTTP resending the whole input every turn (``store: false``).
``http-cached``  ``http`` against a server with ``--http-token-cache``.
``ws-full``      the shipped WebSocket shape resending the whole input.
``ws``           the shipped WebSocket shape with ``previous_response_id``
                 (``store: false``; the connection-scoped cache).
``append``       one long-running Response continued with ``response.append``.
``ws-sdk``       ``ws`` driven by the official ``openai`` SDK, unchanged:
                 ``client.responses.connect()``, ``conn.response.create(...)``,
                 every frame read with ``conn.recv_bytes()`` (the SDK's
                 ``recv()`` does not know the timing event) and ``json``.
``http-sdk``     ``http`` driven by the official SDK:
                 ``client.responses.with_raw_response.create(...)``, then
                 ``.parse()`` (the raw response carries ``Server-Timing``).

The SDK is synchronous: each SDK rollout runs whole in a worker thread
(``trio.to_thread.run_sync``), with its own ``openai.OpenAI`` client
(``max_retries=0``), so the rest of the bench is unchanged; the other
transports are driven by the trio client (:mod:`longresponse.client`) or a
small httpx client. The SDK transports' end-to-end time includes making the
client and the thread hand-off; their per-turn figures are taken the same
way as the others'.

and, with ``--ablations``, ``append`` and ``ws`` with each reuse switch of the
pipeline turned off (``append/no-token-cache``, ...).

Every transport at every decode speed runs against its own server process,
started with the matching flags and reused for all of its rollouts, so the
server CPU (``process_cpu_seconds_total`` on ``/metrics``, read before and
after each batch of concurrent rollouts) belongs to that transport alone. The
processes of one speed run side by side and the transports take turns, one
batch each per round, so drift in the machine hits them all alike. Each
process first serves one short unrecorded rollout (imports, tokenizer).

Per turn the bench records, on the client's clock (``time.perf_counter``):
the observed time from sending the turn's request to its terminal event, the
time to the first output event, the wire bytes sent, and the server's phase
times (``responsesapi.websocket_timing`` events on WebSockets, asked for with
``x-responsesapi-include-timing-metrics: true``; the ``Server-Timing`` header
on HTTP). The simulated model's own time is computed from the knobs
(:data:`MODEL_TIME_FORMULA`); what remains of the observed time is the
client-observed overhead. A "turn" is one model call: turn 0 answers the
create, turn k (k >= 1) the k-th tool output.

The floor: the same continuation frames are sent to a bare Starlette/uvicorn
WebSocket echo endpoint (:mod:`longresponse.bench.echo`) and the round trip
of each (send the frame, receive it back) is timed; a continuation's overhead
minus that round trip is what the server and the protocol add.

A separate "growth" scenario runs ``append``, ``ws`` and ``http`` with
``--growth-tool-calls`` calls, long enough for the history to pass 100,000
tokens (targets 1 and 2 of the benchmark issue).

Results go to ``--out``: ``turns.json`` (every turn of every rollout, the
knobs and the machine), ``summary.md`` (tables and targets, see
:mod:`longresponse.bench.report`) and PNG plots.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import msgspec
import trio

from longresponse.client import connect
from longresponse.server_process import ServerProcess
from protocol import (
    APPEND_SUBPROTOCOL,
    ErrorEvent,
    FunctionCall,
    FunctionCallArgumentsDelta,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    ResponseCompleted,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    TimingEvent,
    decode_client_event,
    encode_event,
    item_text,
)
from protocol import Message as MessageItem

from .scrape import server_cpu_seconds as read_server_cpu_seconds

__all__ = [
    "ABLATION_SWITCHES",
    "BASE_TRANSPORTS",
    "MODEL_TIME_FORMULA",
    "SERVER_OVERHEAD_FORMULA",
    "BenchOptions",
    "Transport",
    "Workload",
    "add_arguments",
    "main",
    "run_bench",
]

BASE_TRANSPORTS: Final = (
    "http",
    "http-full",
    "http-cached",
    "ws-full",
    "ws",
    "append",
    "http-sdk",
    "ws-sdk",
)
#: Transports driven by the official ``openai`` SDK (its sync client, in a worker thread).
SDK_TRANSPORTS: Final = ("http-sdk", "ws-sdk")
#: Transports whose continuation frames get an echo floor (WebSocket, shipped or append).
ECHO_SHAPES: Final = ("append", "ws", "ws-full", "ws-sdk")
#: The pipeline's reuse switches, as ``longresponse serve --no-<switch>`` flags.
ABLATION_SWITCHES: Final = (
    "incremental-validation",
    "incremental-classification",
    "token-cache",
    "resolution-reuse",
    "overlapped-post-inference",
)
#: The transports whose reuse switches are ablated.
ABLATED: Final = ("append", "ws")
#: The transports of the growth scenario (targets 1 and 2).
GROWTH_TRANSPORTS: Final = ("append", "ws", "http")
#: Transports that need no server flag of their own (usable with ``--url``).
URL_TRANSPORTS: Final = ("http", "http-full", "ws-full", "ws", "append", "http-sdk", "ws-sdk")

MODEL_TIME_FORMULA: Final = (
    "model_ms = ttft_ms + 1000 * output_tokens / tokens_per_second "
    "+ 1000 * uncached_input_tokens / prefill_tokens_per_second "
    "(a term is 0 when its rate is 0 = unthrottled; output_tokens counts the sim's paced "
    "chunks: one per answer word, one per 8 characters of call arguments)"
)
SERVER_OVERHEAD_FORMULA: Final = (
    "server_overhead_ms = resume_ms + post_inference_ms (resume: from the decoded request "
    "to the sampler being called, incl. store reads, validation, classification, resolution, "
    "render; post_inference: work done before the terminal event). Encoding the model's "
    "output events (encode_ms) is left out: it scales with the output, the same in every "
    "transport."
)

TIMING_HEADER: Final = ("x-responsesapi-include-timing-metrics", "true")
#: The SDK clients' API key (the bench's own servers take none).
SDK_API_KEY: Final = "longresponse-bench"
#: Event types whose arrival is a turn's first output (client-side TTFT).
FIRST_OUTPUT_EVENTS: Final = frozenset(
    {
        "response.output_item.added",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
    }
)
#: Worker threads for SDK rollouts (at most one per concurrent rollout).
SDK_THREADS: Final = 1000
TASK: Final = "Run the test suite until it passes."
TOOL: Final = {
    "type": "function",
    "name": "run_tests",
    "description": "Run the project's tests and return their output.",
    "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
}
_WORDS: Final = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
#: Characters of call arguments per paced chunk of the sim (``sampler.py``).
ARGUMENT_CHUNK_CHARS: Final = 8
#: Seconds any one turn may take before the rollout is abandoned.
TURN_TIMEOUT: Final = 300.0
#: Round trips per frame against the echo endpoint (the median is kept).
ECHO_REPEATS: Final = 7


def tool_output(turn: int, tokens: int) -> str:
    """A tool output of about ``tokens`` tokens; deterministic, and different per turn."""
    return " ".join(
        f"{_WORDS[(turn + i) % len(_WORDS)]}{i % 97}" for i in range(max(1, tokens // 2))
    )


# --- what is measured ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Transport:
    """One column of the comparison: a client shape and the server flags it needs."""

    name: str
    shape: str  # one of BASE_TRANSPORTS
    switch_off: str | None = None

    @classmethod
    def parse(cls, name: str) -> Transport:
        shape, _, switch = name.partition("/no-")
        if shape not in BASE_TRANSPORTS or (switch and switch not in ABLATION_SWITCHES):
            raise ValueError(f"unknown transport {name!r}")
        if switch and shape not in ABLATED:
            raise ValueError(f"ablations exist for {' and '.join(ABLATED)} only, not {name!r}")
        return cls(name=name, shape=shape, switch_off=switch or None)

    @property
    def websocket(self) -> bool:
        return self.shape in ("append", "ws", "ws-full", "ws-sdk")

    @property
    def sdk(self) -> bool:
        return self.shape in SDK_TRANSPORTS

    @property
    def resends_history(self) -> bool:
        return self.shape in ("ws-full", "http-full")

    @property
    def store(self) -> bool:
        return self.shape in ("http", "http-cached", "http-sdk")

    @property
    def server_flags(self) -> tuple[str, ...]:
        flags: list[str] = []
        if self.shape == "http-cached":
            flags.append("--http-token-cache")
        if self.switch_off:
            flags.append(f"--no-{self.switch_off}")
        return tuple(flags)


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """The knobs of one rollout."""

    tool_calls: int
    output_tokens: int
    tool_latency_ms: float
    tokens_per_second: float
    ttft_ms: float
    prefill_tokens_per_second: float

    def model_ms(self, output_tokens: int, uncached_tokens: int) -> float:
        """The simulated model's own time for one turn (:data:`MODEL_TIME_FORMULA`)."""
        ms = self.ttft_ms
        if self.tokens_per_second > 0:
            ms += 1000 * output_tokens / self.tokens_per_second
        if self.prefill_tokens_per_second > 0:
            ms += 1000 * uncached_tokens / self.prefill_tokens_per_second
        return ms


@dataclasses.dataclass(frozen=True, slots=True)
class BenchOptions:
    tool_calls: int = 25
    output_tokens: int = 2000
    tool_latency_ms: float = 0.0
    concurrency: int = 1
    speeds: tuple[float, ...] = (65.0, 1000.0, 4000.0)
    ttft_ms: float = 0.0
    prefill_tokens_per_second: float = 0.0
    rollouts: int = 5
    transports: tuple[str, ...] = BASE_TRANSPORTS
    ablations: bool = True
    ablation_speed: float = 1000.0
    growth_tool_calls: int = 50
    growth_output_tokens: int = 2000
    url: str | None = None
    store: str = "sqlite"
    out: Path = Path("bench-results")
    echo: bool = True
    progress: bool = True

    def workload(self, speed: float, *, growth: bool = False) -> Workload:
        return Workload(
            tool_calls=self.growth_tool_calls if growth else self.tool_calls,
            output_tokens=self.growth_output_tokens if growth else self.output_tokens,
            tool_latency_ms=self.tool_latency_ms,
            tokens_per_second=speed,
            ttft_ms=self.ttft_ms,
            prefill_tokens_per_second=self.prefill_tokens_per_second,
        )


@dataclasses.dataclass(slots=True)
class Endpoint:
    """Where one transport's rollouts go, and how to read its server's CPU."""

    ws_url: str
    host: str
    port: int
    flags: tuple[str, ...] = ()

    @classmethod
    def from_url(cls, url: str, flags: tuple[str, ...] = ()) -> Endpoint:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "http") or not parts.hostname:
            raise ValueError(f"expected ws://host:port[/v1/responses], not {url!r}")
        port = parts.port or 80
        return cls(f"ws://{parts.hostname}:{port}/v1/responses", parts.hostname, port, flags)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"


# --- wire helpers: server CPU, request and frame sizes ---


async def server_cpu_seconds(endpoint: Endpoint) -> float:
    """``process_cpu_seconds_total`` of the server process behind ``endpoint`` (NaN if absent)."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        try:
            return await read_server_cpu_seconds(http, endpoint.http_url)
        except (httpx.HTTPError, RuntimeError):
            return math.nan


def http_request_bytes(request: httpx.Request) -> int:
    """Bytes on the wire of an HTTP/1.1 request: request line, headers, body."""
    line = len(request.method) + 1 + len(request.url.raw_path) + len(b" HTTP/1.1\r\n")
    head = sum(len(name) + 2 + len(value) + 2 for name, value in request.headers.raw)
    return line + head + 2 + len(request.content)


def websocket_frame_bytes(payload_bytes: int) -> int:
    """Bytes on the wire of one masked client text frame (RFC 6455 §5.2)."""
    header = 2 if payload_bytes < 126 else 4 if payload_bytes < 65536 else 10
    return header + 4 + payload_bytes


def _client_frame(fields: dict[str, Any]) -> bytes:
    """The payload the trio client sends for ``fields`` (same decoder and encoder)."""
    return encode_event(decode_client_event(msgspec.json.encode(fields)))


# --- one rollout ----------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Turn:
    """What the client saw of one turn; turned into a JSON row by :func:`_turn_row`."""

    index: int
    sent_bytes: int
    observed_ms: float
    client_ttft_ms: float
    output_tokens: int
    input_tokens: int
    cached_tokens: int
    server: dict[str, float]
    tool_latency_ms: float
    frame: bytes | None = None  # the WebSocket payload (kept for the echo floor)


def _output_tokens(calls: Sequence[tuple[str, str, str]], answer: str | None) -> int:
    """Paced chunks the sim emitted: one per 8 argument characters, one per answer word."""
    tokens = sum(math.ceil(len(args) / ARGUMENT_CHUNK_CHARS) for _, _, args in calls)
    if answer is not None:
        tokens += len(answer.split(" "))
    return tokens


def _metadata(workload: Workload, *, via_url: bool) -> dict[str, str]:
    meta = {"sim_tool_calls": str(workload.tool_calls)}
    if via_url:  # no server flags to set the speed with: per request instead
        meta["sim_tokens_per_second"] = str(workload.tokens_per_second)
        meta["sim_ttft_ms"] = str(workload.ttft_ms)
    return meta


def _server_timing(header: str) -> dict[str, float]:
    metrics = {}
    for part in header.split(","):
        name, _, duration = part.strip().partition(";dur=")
        if duration:
            metrics[f"{name}_ms"] = float(duration)
    return metrics


class _RolloutState:
    """The client's view of the conversation, for the next request body."""

    def __init__(self, transport: Transport, workload: Workload, *, via_url: bool) -> None:
        self.transport = transport
        self.workload = workload
        self.metadata = _metadata(workload, via_url=via_url)
        self.history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": TASK}]
        self.previous_id: str | None = None

    def first_body(self) -> dict[str, Any]:
        return self._body(list(self.history))

    def next_body(self, calls: Sequence[tuple[str, str, str]], turn: int) -> dict[str, Any]:
        outputs = [
            {
                "type": "function_call_output",
                "call_id": call_id,
                "output": tool_output(turn, self.workload.output_tokens),
            }
            for call_id, _, _ in calls
        ]
        self.history.extend(
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}
            for call_id, name, args in calls
        )
        self.history.extend(outputs)
        if self.transport.resends_history:
            return self._body(list(self.history))
        if self.transport.shape == "append":
            return {"input": outputs}
        return self._body(outputs) | {"previous_response_id": self.previous_id}

    def _body(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "model": "sim",
            "input": items,
            "tools": [TOOL],
            "metadata": self.metadata,
            "store": self.transport.store,
        }


async def _ws_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[_Turn], str]:
    state = _RolloutState(transport, workload, via_url=via_url)
    subprotocols = (APPEND_SUBPROTOCOL,) if transport.shape == "append" else ()
    turns: list[_Turn] = []
    async with connect(
        endpoint.ws_url, subprotocols=subprotocols, headers=[TIMING_HEADER]
    ) as client:
        body = state.first_body()
        latency = 0.0
        for index in range(workload.tool_calls + 1):
            if transport.shape == "append" and index > 0:
                frame = _client_frame(body | {"type": "response.append"})
                started = time.perf_counter()
                await client.append(body["input"])
            else:
                frame = _client_frame(body | {"type": "response.create"})
                started = time.perf_counter()
                await client.create(**body)
            first: float | None = None
            calls: list[tuple[str, str, str]] = []
            answer: str | None = None
            while True:
                event = await client.next_event(timeout=TURN_TIMEOUT)
                if first is None and isinstance(
                    event, OutputItemAdded | OutputTextDelta | FunctionCallArgumentsDelta
                ):
                    first = time.perf_counter()
                if isinstance(event, OutputItemDone):
                    if isinstance(event.item, FunctionCall):
                        item = event.item
                        calls.append((item.call_id, item.name, item.arguments))
                    elif isinstance(event.item, MessageItem):
                        answer = item_text(event.item.content)
                elif isinstance(event, ErrorEvent):
                    raise RuntimeError(f"{transport.name} turn {index}: {event.error.message}")
                elif isinstance(event, ResponseIncomplete | ResponseFailed):
                    raise RuntimeError(f"{transport.name} turn {index}: {event.response.status}")
                elif isinstance(event, ResponseDone | ResponseCompleted):
                    break
            ended = time.perf_counter()
            response = event.response
            timing = await client.next_event(timeout=TURN_TIMEOUT)
            if not isinstance(timing, TimingEvent):
                raise RuntimeError(f"{transport.name}: expected a timing event, got {timing!r}")
            usage = response.usage
            turns.append(
                _Turn(
                    index=index,
                    sent_bytes=websocket_frame_bytes(len(frame)),
                    observed_ms=(ended - started) * 1000,
                    client_ttft_ms=((first or ended) - started) * 1000,
                    output_tokens=_output_tokens(calls, answer),
                    input_tokens=usage.input_tokens if usage else 0,
                    cached_tokens=usage.input_tokens_details.cached_tokens if usage else 0,
                    server=dict(timing.timing_metrics),
                    tool_latency_ms=latency,
                    frame=frame,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response.id
            latency = await _run_tools(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


async def _http_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[_Turn], str]:
    state = _RolloutState(transport, workload, via_url=via_url)
    turns: list[_Turn] = []
    async with httpx.AsyncClient(base_url=endpoint.http_url, timeout=120.0) as http:
        body = state.first_body()
        latency = 0.0
        for index in range(workload.tool_calls + 1):
            # Encoding the body and decoding the reply count, as the WebSocket
            # client's encoding and decoding of events do.
            started = time.perf_counter()
            payload = msgspec.json.encode(body)
            request = http.build_request(
                "POST",
                "/v1/responses",
                content=payload,
                headers={"content-type": "application/json"},
            )
            reply = await http.send(request)
            if reply.status_code != 200:
                raise RuntimeError(
                    f"{transport.name} turn {index}: HTTP {reply.status_code}: "
                    f"{reply.content[:300]!r}"
                )
            sent = http_request_bytes(request)
            headers = reply.headers
            response = msgspec.json.decode(reply.content)
            ended = time.perf_counter()
            calls = [
                (item["call_id"], item["name"], item["arguments"])
                for item in response["output"]
                if item["type"] == "function_call"
            ]
            texts = [
                "".join(part.get("text", "") for part in item["content"])
                for item in response["output"]
                if item["type"] == "message"
            ]
            answer = texts[-1] if texts else None
            usage = response.get("usage") or {}
            turns.append(
                _Turn(
                    index=index,
                    sent_bytes=sent,
                    observed_ms=(ended - started) * 1000,
                    # Not streamed: the first output arrives with the whole response.
                    client_ttft_ms=(ended - started) * 1000,
                    output_tokens=_output_tokens(calls, answer),
                    input_tokens=usage.get("input_tokens", 0),
                    cached_tokens=usage.get("input_tokens_details", {}).get("cached_tokens", 0),
                    server=_server_timing(headers.get("server-timing", "")),
                    tool_latency_ms=latency,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response["id"]
            latency = await _run_tools(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


# --- the official SDK (sync, in a worker thread) ----------------------------------------


def _sdk_client(endpoint: Endpoint) -> Any:
    import openai

    return openai.OpenAI(
        base_url=endpoint.http_url + "/v1",
        api_key=SDK_API_KEY,
        max_retries=0,
        timeout=TURN_TIMEOUT,
    )


def _sdk_frame(body: dict[str, Any]) -> bytes:
    """What the SDK sends for ``conn.response.create(**body)`` (``json.dumps`` of the event)."""
    return json.dumps({"type": "response.create", **body}).encode()


def _request_bytes(request: Any) -> int:
    """Wire bytes of an HTTP/1.1 request the SDK sent (request line, headers, body)."""
    line = len(request.method) + len(request.url.raw_path) + len(" HTTP/1.1\r\n") + 1
    headers = sum(len(name) + len(value) + 4 for name, value in request.headers.raw)
    return line + headers + 2 + len(request.content)


def _ws_sdk_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[_Turn], str]:
    """The shipped WebSocket shape through ``client.responses.connect()`` (blocking)."""
    state = _RolloutState(transport, workload, via_url=via_url)
    turns: list[_Turn] = []
    client = _sdk_client(endpoint)
    with client, client.responses.connect(extra_headers=dict([TIMING_HEADER])) as conn:
        body = state.first_body()
        latency = 0.0
        for index in range(workload.tool_calls + 1):
            frame = _sdk_frame(body)
            started = time.perf_counter()
            conn.response.create(**body)
            first: float | None = None
            calls: list[tuple[str, str, str]] = []
            answer: str | None = None
            while True:
                # Every frame as bytes: recv() would not parse the timing event.
                event = json.loads(conn.recv_bytes())
                kind = event.get("type")
                if first is None and kind in FIRST_OUTPUT_EVENTS:
                    first = time.perf_counter()
                if kind == "response.output_item.done":
                    item = event["item"]
                    if item["type"] == "function_call":
                        calls.append((item["call_id"], item["name"], item["arguments"]))
                    elif item["type"] == "message":
                        answer = "".join(part.get("text", "") for part in item["content"])
                elif kind == "error":
                    raise RuntimeError(f"{transport.name} turn {index}: {event['error']}")
                elif kind in ("response.incomplete", "response.failed"):
                    raise RuntimeError(f"{transport.name} turn {index}: {kind}")
                elif kind == "response.completed":
                    break
            ended = time.perf_counter()
            response = event["response"]
            timing = json.loads(conn.recv_bytes())
            if timing.get("type") != "responsesapi.websocket_timing":
                raise RuntimeError(f"{transport.name}: expected a timing event, got {timing!r}")
            usage = response.get("usage") or {}
            turns.append(
                _Turn(
                    index=index,
                    sent_bytes=websocket_frame_bytes(len(frame)),
                    observed_ms=(ended - started) * 1000,
                    client_ttft_ms=((first or ended) - started) * 1000,
                    output_tokens=_output_tokens(calls, answer),
                    input_tokens=usage.get("input_tokens", 0),
                    cached_tokens=usage.get("input_tokens_details", {}).get("cached_tokens", 0),
                    server={k: float(v) for k, v in timing["timing_metrics"].items()},
                    tool_latency_ms=latency,
                    frame=frame,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response["id"]
            latency = _run_tools_blocking(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


def _http_sdk_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[_Turn], str]:
    """``http`` through ``client.responses.with_raw_response.create()`` (blocking)."""
    state = _RolloutState(transport, workload, via_url=via_url)
    turns: list[_Turn] = []
    with _sdk_client(endpoint) as client:
        body = state.first_body()
        latency = 0.0
        for index in range(workload.tool_calls + 1):
            # Encoding the body and parsing the reply count, as in ``http``.
            started = time.perf_counter()
            raw = client.responses.with_raw_response.create(**body)
            response = raw.parse()
            ended = time.perf_counter()
            calls = [
                (item.call_id, item.name, item.arguments)
                for item in response.output
                if item.type == "function_call"
            ]
            texts = [
                "".join(getattr(part, "text", "") for part in item.content)
                for item in response.output
                if item.type == "message"
            ]
            answer = texts[-1] if texts else None
            usage = response.usage
            turns.append(
                _Turn(
                    index=index,
                    sent_bytes=_request_bytes(raw.http_request),
                    observed_ms=(ended - started) * 1000,
                    client_ttft_ms=(ended - started) * 1000,  # not streamed
                    output_tokens=_output_tokens(calls, answer),
                    input_tokens=usage.input_tokens if usage else 0,
                    cached_tokens=usage.input_tokens_details.cached_tokens if usage else 0,
                    server=_server_timing(raw.headers.get("server-timing", "")),
                    tool_latency_ms=latency,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response.id
            latency = _run_tools_blocking(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


_sdk_threads: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("sdk_threads")


async def _sdk_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[_Turn], str]:
    """An SDK rollout, whole, in a worker thread (trio's default limit is 40 threads)."""
    try:
        limiter = _sdk_threads.get()
    except LookupError:
        limiter = trio.CapacityLimiter(SDK_THREADS)
        _sdk_threads.set(limiter)
    drive = _ws_sdk_rollout if transport.shape == "ws-sdk" else _http_sdk_rollout
    return await trio.to_thread.run_sync(
        functools.partial(drive, endpoint, transport, workload, via_url=via_url),
        limiter=limiter,
    )


def _run_tools_blocking(workload: Workload) -> float:
    """:func:`_run_tools` for the SDK's worker threads."""
    if workload.tool_latency_ms <= 0:
        return 0.0
    started = time.perf_counter()
    time.sleep(workload.tool_latency_ms / 1000)
    return (time.perf_counter() - started) * 1000


async def _run_tools(workload: Workload) -> float:
    """The client "runs" the tools: sleeps ``tool_latency_ms``; returns the time it took."""
    if workload.tool_latency_ms <= 0:
        return 0.0
    started = time.perf_counter()
    await trio.sleep(workload.tool_latency_ms / 1000)
    return (time.perf_counter() - started) * 1000


def _turn_row(
    turn: _Turn, previous: _Turn | None, workload: Workload, shape: str
) -> dict[str, Any]:
    """One row of ``turns.json``; derived figures use the documented formulas."""
    input_tokens, cached = turn.input_tokens, turn.cached_tokens
    if shape == "append" and previous is not None:
        # append mode reports the rollout's usage so far: this turn is the difference.
        input_tokens -= previous.input_tokens
        cached -= previous.cached_tokens
    uncached = max(0, input_tokens - cached)
    model_ms = workload.model_ms(turn.output_tokens, uncached)
    server = turn.server
    server_overhead = (
        server["resume_ms"] + server.get("post_inference_ms", 0.0)
        if "resume_ms" in server
        else None
    )
    return {
        "turn": turn.index,
        "kind": "create" if turn.index == 0 else "continuation",
        "sent_bytes": turn.sent_bytes,
        "observed_ms": turn.observed_ms,
        "client_ttft_ms": turn.client_ttft_ms,
        "output_tokens": turn.output_tokens,
        "input_tokens": input_tokens,
        "cached_tokens": cached,
        "uncached_tokens": uncached,
        "model_ms": model_ms,
        "overhead_ms": turn.observed_ms - model_ms,
        "server_overhead_ms": server_overhead,
        "server": server,
        "tool_latency_ms": turn.tool_latency_ms,
        "echo_rtt_ms": None,
        "overhead_minus_echo_ms": None,
    }


async def run_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool = False
) -> dict[str, Any]:
    """Drive one rollout; return its ``turns.json`` record (``error`` set if it failed)."""
    drive = _sdk_rollout if transport.sdk else _ws_rollout if transport.websocket else _http_rollout
    started = time.perf_counter()
    try:
        turns, answer = await drive(endpoint, transport, workload, via_url=via_url)
    except Exception as exc:  # recorded; the run goes on with the other transports
        return {"error": f"{type(exc).__name__}: {exc}", "turns": [], "final_answer": None}
    e2e_ms = (time.perf_counter() - started) * 1000
    rows = [
        _turn_row(turn, turns[i - 1] if i else None, workload, transport.shape)
        for i, turn in enumerate(turns)
    ]
    return {
        "error": None,
        "e2e_ms": e2e_ms,
        "final_answer": answer,
        "turns": rows,
        "frames": [turn.frame for turn in turns],
    }


# --- the run ----------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Block:
    """The transports run side by side against one set of servers (one per transport).

    ``scenarios``: (name, workload, transports) run in this order; the
    growth scenario's transports are a subset of the main one's, so it
    reuses their servers.
    """

    speed: float
    transports: list[Transport]
    scenarios: list[tuple[str, Workload, list[Transport]]]


def _plan(options: BenchOptions) -> tuple[list[_Block], list[str]]:
    """The blocks to run, and notes on what was left out and why."""
    notes: list[str] = []
    chosen = [Transport.parse(name) for name in options.transports]
    base = [t for t in chosen if t.switch_off is None]
    ablations = [t for t in chosen if t.switch_off is not None]
    if options.ablations:
        for shape in ABLATED:
            if any(t.shape == shape for t in base):
                ablations.extend(
                    Transport.parse(f"{shape}/no-{switch}")
                    for switch in ABLATION_SWITCHES
                    if f"{shape}/no-{switch}" not in options.transports
                )
    if options.url:
        kept = [t for t in base if t.name in URL_TRANSPORTS]
        dropped = [t.name for t in [*base, *ablations] if t not in kept]
        if dropped:
            notes.append(
                f"--url: left out {', '.join(dropped)} (they need server flags of their own)"
            )
        base, ablations = kept, []
    speeds = list(options.speeds)
    ablation_speed = options.ablation_speed if options.ablation_speed in speeds else speeds[-1]
    if ablations and len(speeds) > 1:
        notes.append(
            f"ablations run at {ablation_speed:g} tokens/s only (the pre-inference work they "
            "measure does not depend on the decode speed)"
        )
    growth = [t for t in base if t.name in GROWTH_TRANSPORTS]
    growth_speed = max(speeds) if options.growth_tool_calls > 0 and growth else None
    blocks = []
    for speed in speeds:
        transports = base + (ablations if speed == ablation_speed else [])
        scenarios = [("main", options.workload(speed), transports)]
        if speed == growth_speed:
            scenarios.append(("growth", options.workload(speed, growth=True), growth))
            growth_speed = None  # once, even if the speed is listed twice
        blocks.append(_Block(speed, transports, scenarios))
    return blocks, notes


def _server_flags(options: BenchOptions, speed: float, store_dir: str) -> tuple[str, ...]:
    store = options.store
    if store == "sqlite":
        store = f"sqlite:///{store_dir}/responses-{time.monotonic_ns()}.db"
    return (
        "--store", store,
        "--sim-tokens-per-second", f"{speed:g}",
        "--sim-ttft-ms", f"{options.ttft_ms:g}",
        "--sim-prefill-tokens-per-second", f"{options.prefill_tokens_per_second:g}",
    )  # fmt: skip


@contextlib.contextmanager
def _endpoints(
    options: BenchOptions, block: _Block, store_dir: str
) -> Iterator[dict[str, Endpoint]]:
    """One server process per transport of ``block`` (or ``--url`` for all)."""
    if options.url:
        endpoint = Endpoint.from_url(options.url)
        yield {t.name: endpoint for t in block.transports}
        return
    servers = {
        transport.name: ServerProcess(
            *_server_flags(options, block.speed, store_dir), *transport.server_flags
        )
        for transport in block.transports
    }
    # A worker per CPU: more processes importing at once only thrash.
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        try:
            for started in [pool.submit(server.start) for server in servers.values()]:
                started.result()
            yield {
                name: Endpoint.from_url(server.url, server.flags)
                for name, server in servers.items()
            }
        finally:  # stopped side by side too (each waits for its process to drain)
            for stopped in [pool.submit(server.stop) for server in servers.values()]:
                stopped.result()


async def _run_block(
    options: BenchOptions,
    block: _Block,
    endpoints: dict[str, Endpoint],
    bar: Any,
) -> list[dict[str, Any]]:
    via_url = options.url is not None
    for transport in block.transports:  # not recorded: imports, tokenizer, first connection
        workload = dataclasses.replace(
            block.scenarios[0][1], tool_calls=1, output_tokens=64, tool_latency_ms=0
        )
        await run_rollout(endpoints[transport.name], transport, workload, via_url=via_url)
    records: list[dict[str, Any]] = []
    for scenario, workload, transports in block.scenarios:
        for round_index in range(options.rollouts):
            for transport in transports:
                bar.set_description(f"{scenario} {block.speed:g} tok/s {transport.name}")
                endpoint = endpoints[transport.name]
                batch = await _run_batch(options, endpoint, transport, workload, via_url)
                bar.update(len(batch))
                records += [
                    {
                        "scenario": scenario,
                        "transport": transport.name,
                        "shape": transport.shape,
                        "switch_off": transport.switch_off,
                        "tokens_per_second": block.speed,
                        "tool_calls": workload.tool_calls,
                        "output_tokens": workload.output_tokens,
                        "round": round_index,
                        "server_flags": list(endpoint.flags),
                        **record,
                    }
                    for record in batch
                ]
    return records


async def _run_batch(
    options: BenchOptions,
    endpoint: Endpoint,
    transport: Transport,
    workload: Workload,
    via_url: bool,
) -> list[dict[str, Any]]:
    """``--concurrency`` rollouts at once; the server CPU they took, shared out."""
    batch: list[dict[str, Any]] = []

    async def one(slot: int) -> None:
        record = await run_rollout(endpoint, transport, workload, via_url=via_url)
        batch.append({"slot": slot, **record})

    cpu_before = await server_cpu_seconds(endpoint)
    async with trio.open_nursery() as nursery:
        for slot in range(options.concurrency):
            nursery.start_soon(one, slot)
    cpu = (await server_cpu_seconds(endpoint)) - cpu_before
    for record in batch:
        # Per server process; the concurrent rollouts of a batch share it.
        record["batch_cpu_s"] = cpu
        record["cpu_s"] = cpu / options.concurrency
    return sorted(batch, key=lambda record: record["slot"])


def _machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
    }


def _echo_floor(
    options: BenchOptions, rollouts: list[dict[str, Any]], notes: list[str]
) -> dict[str, Any] | None:
    """Round trips of the same continuation frames to the bare echo endpoint."""
    frames: dict[str, list[bytes]] = {}
    for record in rollouts:
        name = record["transport"]
        key = f"{record['scenario']}:{name}"
        if record["switch_off"] is None and record["frames"] and key not in frames:
            if record["shape"] in ECHO_SHAPES:
                frames[key] = record["frames"]
    if not frames:
        return None
    try:
        from longresponse.bench.echo import EchoProcess, echo_round_trip
    except ImportError as exc:
        notes.append(f"no echo floor: longresponse.bench.echo is not available ({exc})")
        return None

    async def measure(url: str) -> dict[str, list[float]]:
        await echo_round_trip(url, "{}", ECHO_REPEATS)  # warm-up
        rtts: dict[str, list[float]] = {}
        for key, payloads in frames.items():
            rtts[key] = [
                1000 * statistics.median(await echo_round_trip(url, p.decode(), ECHO_REPEATS))
                for p in payloads
            ]
        return rtts

    with EchoProcess() as echo:
        rtts = trio.run(measure, echo.url)
    for record in rollouts:
        key = f"{record['scenario']}:{record['shape']}"
        if key not in rtts or record["error"]:
            continue
        for row, rtt in zip(record["turns"], rtts[key], strict=False):
            row["echo_rtt_ms"] = rtt
            row["overhead_minus_echo_ms"] = row["overhead_ms"] - rtt
    return {"repeats": ECHO_REPEATS, "rtt_ms": rtts}


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every block; return the ``turns.json`` document (also written to ``--out``).

    Server processes are stopped when their block ends, also when it raises.
    """
    from tqdm import tqdm  # type: ignore[import-untyped]

    from ..bench import report

    blocks, notes = _plan(options)
    total = (
        options.concurrency
        * options.rollouts
        * sum(len(transports) for block in blocks for _, _, transports in block.scenarios)
    )
    started = time.perf_counter()
    rollouts: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="longresponse-bench-") as store_dir,
        tqdm(total=total, unit="rollout", file=sys.stderr, disable=not options.progress) as bar,
    ):
        for block in blocks:
            bar.set_description(f"starting servers for {block.speed:g} tok/s")
            with _endpoints(options, block, store_dir) as endpoints:
                rollouts += trio.run(_run_block, options, block, endpoints, bar)
        bar.set_description("echo floor")
        echo = _echo_floor(options, rollouts, notes) if options.echo else None
    for record in rollouts:
        del record["frames"]
    document = {
        "meta": {
            "command": "longresponse bench " + " ".join(sys.argv[2:])
            if sys.argv[1:2] == ["bench"]
            else None,
            "knobs": _knobs(options),
            "machine": _machine(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "duration_s": time.perf_counter() - started,
            "model_time_formula": MODEL_TIME_FORMULA,
            "server_overhead_formula": SERVER_OVERHEAD_FORMULA,
            "definitions": {
                "turn": "one model call: turn 0 answers the create, turn k the k-th tool output",
                "observed_ms": "client clock, from writing the turn's request to its terminal "
                "event (WebSocket) or the end of the HTTP response",
                "client_ttft_ms": "from writing the request to the first output item or delta "
                "(HTTP is not streamed: the whole response)",
                "overhead_ms": "observed_ms - model_ms",
                "sent_bytes": "client-to-server wire bytes of the turn: the masked WebSocket "
                "frame, or the HTTP request (head and body)",
                "cpu_s": "server process CPU seconds (process_cpu_seconds_total on /metrics) "
                "over a batch of concurrent rollouts, divided by the batch size; one server "
                "process per transport and speed",
                "e2e_ms": "from opening the connection to the final answer, tool latency included",
            },
            "notes": notes,
        },
        "echo": echo,
        "rollouts": rollouts,
    }
    report.write(document, options.out)
    return document


def _knobs(options: BenchOptions) -> dict[str, Any]:
    knobs = dataclasses.asdict(options)
    knobs["out"] = str(options.out)
    knobs["speeds"] = list(options.speeds)
    knobs["transports"] = list(options.transports)
    return knobs


# --- the command line -----------------------------------------------------------------


def _speeds(text: str) -> tuple[float, ...]:
    try:
        speeds = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, not {text!r}"
        ) from None
    if not speeds or any(s < 0 for s in speeds):
        raise argparse.ArgumentTypeError("expected one or more speeds >= 0 (0 = unthrottled)")
    return speeds


def _transports(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        try:
            Transport.parse(name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return names


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``longresponse bench`` flags on ``parser``."""
    parser.description = (
        "Compare every transport (http, http-full, http-cached, ws-full, ws, append; http-sdk "
        "and ws-sdk through the official openai SDK) and each "
        "reuse switch on simulated agent rollouts, side by side, in one run: end-to-end time, "
        "time to first token, server phase times, client-observed overhead, server CPU, bytes "
        "per turn. Writes turns.json, summary.md and PNG plots to --out."
    )
    parser.epilog = (
        "Overhead = observed turn time - the simulated model's own time, where "
        f"{MODEL_TIME_FORMULA}. Each transport at each speed gets its own server process; "
        "--url runs only the transports that need no server flags."
    )
    defaults = BenchOptions()
    add = parser.add_argument
    add(
        "--tool-calls",
        type=_bounded_int(1, 200),
        default=defaults.tool_calls,
        help="tool calls per rollout (5 to 200 are the reference range)",
    )
    add(
        "--output-tokens",
        type=_bounded_int(1, 200_000),
        default=defaults.output_tokens,
        help="size of each tool output, in tokens",
    )
    add(
        "--tool-latency-ms",
        type=_non_negative,
        default=defaults.tool_latency_ms,
        help="time the client spends running each tool (a sleep)",
    )
    add(
        "--concurrency",
        type=_bounded_int(1, 1000),
        default=defaults.concurrency,
        help="concurrent rollouts per transport",
    )
    add(
        "--tokens-per-second",
        type=_speeds,
        default=",".join(f"{speed:g}" for speed in defaults.speeds),
        dest="speeds",
        help="simulated decode speeds, comma-separated (0 = unthrottled)",
    )
    add(
        "--ttft-ms",
        type=_non_negative,
        default=defaults.ttft_ms,
        help="simulated time to first token",
    )
    add(
        "--prefill-tps",
        type=_non_negative,
        default=defaults.prefill_tokens_per_second,
        help="simulated prefill rate over uncached input tokens (0 = instant)",
    )
    add(
        "--rollouts",
        type=_bounded_int(1, 1000),
        default=defaults.rollouts,
        help="rounds of rollouts per transport and speed (each round: --concurrency rollouts)",
    )
    add(
        "--transports",
        type=_transports,
        default=",".join(defaults.transports),
        help="comma-separated subset of: "
        + ", ".join(BASE_TRANSPORTS)
        + "; ablations by name too, e.g. append/no-token-cache",
    )
    add(
        "--ablations",
        action=argparse.BooleanOptionalAction,
        default=defaults.ablations,
        help="also run append and ws with each reuse switch off",
    )
    add(
        "--ablation-tokens-per-second",
        type=_non_negative,
        default=defaults.ablation_speed,
        dest="ablation_speed",
        help="the speed the ablations run at (if not among --tokens-per-second: the last one)",
    )
    add(
        "--growth-tool-calls",
        type=_bounded_int(0, 200),
        default=defaults.growth_tool_calls,
        help="tool calls of the growth scenario (append, ws, http at the fastest speed; "
        "targets 1 and 2); 0 = skip it",
    )
    add(
        "--growth-output-tokens",
        type=_bounded_int(1, 200_000),
        default=defaults.growth_output_tokens,
        help="tool-output size of the growth scenario",
    )
    add(
        "--url",
        default=None,
        help="benchmark a running server (ws://host:port/v1/responses) instead of starting "
        "servers; only the transports that need no server flags run",
    )
    add(
        "--store",
        default=defaults.store,
        help="the servers' --store; 'sqlite' = a fresh SQLite file per server in a temporary "
        "directory",
    )
    add("--out", type=Path, default=defaults.out, help="directory for the results")
    add(
        "--echo",
        action=argparse.BooleanOptionalAction,
        default=defaults.echo,
        help="measure the floor: the same frames against a bare WebSocket echo endpoint",
    )
    add("--progress", action=argparse.BooleanOptionalAction, default=defaults.progress,
        help="show a progress bar on stderr")  # fmt: skip


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        tool_calls=args.tool_calls,
        output_tokens=args.output_tokens,
        tool_latency_ms=args.tool_latency_ms,
        concurrency=args.concurrency,
        speeds=tuple(args.speeds),
        ttft_ms=args.ttft_ms,
        prefill_tokens_per_second=args.prefill_tps,
        rollouts=args.rollouts,
        transports=tuple(args.transports),
        ablations=args.ablations,
        ablation_speed=args.ablation_speed,
        growth_tool_calls=args.growth_tool_calls,
        growth_output_tokens=args.growth_output_tokens,
        url=args.url,
        store=args.store,
        out=args.out,
        echo=args.echo,
        progress=args.progress,
    )


def main(args: argparse.Namespace) -> int:
    """Run the bench from parsed flags; 0 if every rollout finished with the same
    answer as the other transports, else 1."""
    from ..bench import report

    document = run_bench(options_from_args(args))
    print(report.console_summary(document, args.out))
    failed = any(r["error"] for r in document["rollouts"])
    return 1 if failed or report.inconsistencies(document) else 0
