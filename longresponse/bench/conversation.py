"""What every transport of ``longresponse bench`` shares: the conversation and the turn.

Theory of operation
-------------------
Each transport drives the same rollout (:mod:`.options`): the task
(:data:`TASK`) with one tool (:data:`TOOL`), then one tool output per call the
model makes (:func:`tool_output`: deterministic, different per turn, about
``--output-tokens`` tokens), until the model answers. :class:`RolloutState`
is the client's view of that conversation and builds each request body the
way the transport's shape says: the whole history again (``*-full``), only
the new items with ``previous_response_id`` (``ws``, ``http``...), or only
the new items as a ``response.append`` (``append``). The sim's knobs travel
in the request's metadata when there are no server flags to set them
(``--url``).

A transport records each turn as a :class:`Turn`: the wire bytes it sent
(:func:`websocket_frame_bytes`, :func:`http_request_bytes`), its timings on
the client's clock (``time.perf_counter``), the usage and the server's phase
times (the timing event on WebSockets, asked for with :data:`TIMING_HEADER`;
the ``Server-Timing`` header on HTTP, read by :func:`server_timing`).
:func:`paced_tokens` counts what the sim paced out for the model-time
formula. Between turns the client "runs" the tools (:func:`run_tools`, or
:func:`run_tools_blocking` in the SDK's worker threads).

The transports (:mod:`.trio_transports`, :mod:`.sdk_transports`,
:mod:`.agents_transports`) build on this module; it imports only
:mod:`.options` of the bench.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import httpx
import trio

if TYPE_CHECKING:
    import httpx2  # the openai SDK's own client (the SDK transports' requests)

import protocol

from .options import Transport, Workload

__all__ = [
    "ARGUMENT_CHUNK_CHARS",
    "TASK",
    "TIMING_HEADER",
    "TOOL",
    "TURN_TIMEOUT",
    "Endpoint",
    "RolloutState",
    "Turn",
    "http_request_bytes",
    "json_message_text",
    "json_usage",
    "paced_tokens",
    "run_tools",
    "run_tools_blocking",
    "server_timing",
    "tool_output",
    "websocket_frame_bytes",
]

#: The request header that asks the server for its phase times on a WebSocket.
TIMING_HEADER: Final = (protocol.TIMING_HEADER, "true")
TASK: Final = "Run the test suite until it passes."
TOOL: Final[dict[str, Any]] = {
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


def tool_output(turn: int, tokens: int) -> str:
    """A tool output of about ``tokens`` tokens; deterministic, and different per turn.

    It depends on ``turn`` modulo the word list's length only, so it is made
    once per (phase, size) and reused: the tools cost the client nothing, as
    ``--tool-latency-ms 0`` says (making it took 0.16 ms a turn, in the e2e time).
    """
    return _tool_output(turn % len(_WORDS), tokens)


@functools.lru_cache(maxsize=64)
def _tool_output(phase: int, tokens: int) -> str:
    return " ".join(
        f"{_WORDS[(phase + i) % len(_WORDS)]}{i % 97}" for i in range(max(1, tokens // 2))
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
        """``ws://host:port[/v1/responses]`` (or ``http://``); ``ValueError`` otherwise."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "http") or not parts.hostname:
            raise ValueError(f"expected ws://host:port[/v1/responses], not {url!r}")
        port = parts.port or 80
        return cls(f"ws://{parts.hostname}:{port}/v1/responses", parts.hostname, port, flags)

    @property
    def http_url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"


def http_request_bytes(request: httpx.Request | httpx2.Request) -> int:
    """Bytes on the wire of an HTTP/1.1 request: request line, headers, body."""
    line = len(request.method) + 1 + len(request.url.raw_path) + len(b" HTTP/1.1\r\n")
    head = sum(len(name) + 2 + len(value) + 2 for name, value in request.headers.raw)
    return line + head + 2 + len(request.content)


def websocket_frame_bytes(payload_bytes: int) -> int:
    """Bytes on the wire of one masked client text frame (RFC 6455 §5.2)."""
    header = 2 if payload_bytes < 126 else 4 if payload_bytes < 65536 else 10
    return header + 4 + payload_bytes


# --- one turn -------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Turn:
    """What the client saw of one turn; a ``turns.json`` row by :func:`.measure.turn_row`."""

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
    response_id: str | None = None  # the response that answered the turn


def paced_tokens(calls: Sequence[tuple[str, str, str]], answer: str | None) -> int:
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


def json_usage(response: dict[str, Any]) -> tuple[int, int]:
    """``(input_tokens, cached_tokens)`` of a response decoded as JSON (zeros without usage)."""
    usage = response.get("usage") or {}
    details = usage.get("input_tokens_details", {})
    return usage.get("input_tokens", 0), details.get("cached_tokens", 0)


def json_message_text(item: dict[str, Any]) -> str:
    """The text of a ``message`` output item decoded as JSON."""
    return "".join(part.get("text", "") for part in item["content"])


def server_timing(header: str) -> dict[str, float]:
    """The phase times of a ``Server-Timing`` header, as ``<name>_ms``."""
    metrics = {}
    for part in header.split(","):
        name, _, duration = part.strip().partition(";dur=")
        if duration:
            metrics[f"{name}_ms"] = float(duration)
    return metrics


class RolloutState:
    """The client's view of the conversation, for the next request body."""

    def __init__(self, transport: Transport, workload: Workload, *, via_url: bool) -> None:
        self.transport = transport
        self.workload = workload
        self.metadata = _metadata(workload, via_url=via_url)
        self.history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": TASK}]
        self.previous_id: str | None = None

    def first_body(self) -> dict[str, Any]:
        """The body of the create: the task."""
        return self._body(list(self.history))

    def next_body(self, calls: Sequence[tuple[str, str, str]], turn: int) -> dict[str, Any]:
        """The body answering ``calls`` (``(call_id, name, arguments)``) of turn ``turn``."""
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
        if self.transport.append_mode:
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


async def run_tools(workload: Workload) -> float:
    """The client "runs" the tools: sleeps ``tool_latency_ms``; returns the time it took."""
    if workload.tool_latency_ms <= 0:
        return 0.0
    started = time.perf_counter()
    await trio.sleep(workload.tool_latency_ms / 1000)
    return (time.perf_counter() - started) * 1000


def run_tools_blocking(workload: Workload) -> float:
    """:func:`run_tools` for the SDK's worker threads."""
    if workload.tool_latency_ms <= 0:
        return 0.0
    started = time.perf_counter()
    time.sleep(workload.tool_latency_ms / 1000)
    return (time.perf_counter() - started) * 1000
