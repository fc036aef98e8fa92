"""The transports driven by the official ``openai`` SDK: ``ws-sdk`` and ``http-sdk``.

Theory of operation
-------------------
The SDK is used unchanged, as an agent would use it, against the same
server flags as its trio/httpx twin (``ws``, ``http``):

``ws-sdk``    ``client.responses.connect()``, then ``conn.response.create(...)``
              per turn; every frame is read with ``conn.recv_bytes()`` and
              ``json`` (the SDK's ``recv()`` does not know the timing event).
              Its sent bytes are the frame of ``json.dumps`` of the event, as
              the SDK sends it.
``http-sdk``  ``client.responses.with_raw_response.create(...)``, then
              ``.parse()``; the raw response carries ``Server-Timing``, and
              its ``http_request`` the bytes sent.

The SDK is synchronous: each SDK rollout runs whole in a worker thread
(``trio.to_thread.run_sync``, under a limiter of :data:`SDK_THREADS` rather
than trio's default 40), with its own ``openai.OpenAI`` client
(``max_retries=0``), so the rest of the bench is unchanged. The SDK
transports' end-to-end time includes making the client and the thread
hand-off; their per-turn figures are taken the same way as the others'
(:mod:`.trio_transports`).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import trio

from .conversation import (
    TIMING_HEADER,
    TURN_TIMEOUT,
    Endpoint,
    RolloutState,
    Turn,
    http_request_bytes,
    json_message_text,
    json_usage,
    paced_tokens,
    run_tools_blocking,
    server_timing,
    websocket_frame_bytes,
)
from .options import Transport, Workload

__all__ = [
    "FIRST_OUTPUT_EVENTS",
    "SDK_API_KEY",
    "SDK_THREADS",
    "in_sdk_thread",
    "sdk_echo_floor",
    "sdk_rollout",
]

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

T = TypeVar("T")


def _sdk_client(endpoint: Endpoint) -> Any:
    """A synchronous ``openai.OpenAI`` client for the server behind ``endpoint``."""
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


def _ws_sdk_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """The shipped WebSocket shape through ``client.responses.connect()`` (blocking)."""
    state = RolloutState(transport, workload, via_url=via_url)
    turns: list[Turn] = []
    client = _sdk_client(endpoint)
    # At its defaults the SDK offers no compression; ws-sdk+deflate asks for it
    # (the websockets library's default) and checks that the server agreed.
    options = {"compression": "deflate"} if transport.ws_compression else {}
    with (
        client,
        client.responses.connect(
            extra_headers=dict([TIMING_HEADER]), websocket_connection_options=options
        ) as conn,
    ):
        extensions = conn._connection.response.headers.get("Sec-WebSocket-Extensions") or ""
        if ("permessage-deflate" in extensions) is not transport.ws_compression:
            raise RuntimeError(f"{transport.name}: Sec-WebSocket-Extensions: {extensions!r}")
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
                        answer = json_message_text(item)
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
            input_tokens, cached_tokens = json_usage(response)
            turns.append(
                Turn(
                    index=index,
                    sent_bytes=websocket_frame_bytes(len(frame)),
                    observed_ms=(ended - started) * 1000,
                    client_ttft_ms=((first or ended) - started) * 1000,
                    output_tokens=paced_tokens(calls, answer),
                    input_tokens=input_tokens,
                    cached_tokens=cached_tokens,
                    server={k: float(v) for k, v in timing["timing_metrics"].items()},
                    tool_latency_ms=latency,
                    frame=frame,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response["id"]
            latency = run_tools_blocking(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


def _http_sdk_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """``http`` through ``client.responses.with_raw_response.create()`` (blocking)."""
    state = RolloutState(transport, workload, via_url=via_url)
    turns: list[Turn] = []
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
                Turn(
                    index=index,
                    sent_bytes=http_request_bytes(raw.http_request),
                    observed_ms=(ended - started) * 1000,
                    client_ttft_ms=(ended - started) * 1000,  # not streamed
                    output_tokens=paced_tokens(calls, answer),
                    input_tokens=usage.input_tokens if usage else 0,
                    cached_tokens=usage.input_tokens_details.cached_tokens if usage else 0,
                    server=server_timing(raw.headers.get("server-timing", "")),
                    tool_latency_ms=latency,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response.id
            latency = run_tools_blocking(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


_sdk_threads: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("sdk_threads")


async def in_sdk_thread(blocking: Callable[[], T]) -> T:
    """``blocking()`` in a worker thread, at most :data:`SDK_THREADS` at once
    (trio's default limit is 40 threads)."""
    try:
        limiter = _sdk_threads.get()
    except LookupError:
        limiter = trio.CapacityLimiter(SDK_THREADS)
        _sdk_threads.set(limiter)
    return await trio.to_thread.run_sync(blocking, limiter=limiter)


async def sdk_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """An SDK rollout, whole, in a worker thread."""
    drive = _ws_sdk_rollout if transport.shape == "ws-sdk" else _http_sdk_rollout
    return await in_sdk_thread(
        functools.partial(drive, endpoint, transport, workload, via_url=via_url)
    )


def sdk_echo_floor(echo_url: str, frames: list[bytes], repeats: int) -> list[float]:
    """The SDK's own floor: for each ``ws-sdk`` frame, the median milliseconds from
    ``conn.response.create(...)`` of its event to the echo of what the SDK sent,
    read with ``conn.recv_bytes()``, against the bare echo endpoint at ``echo_url``
    (``ws://host:port/v1/responses``). The SDK's encoding of the event (it walks
    the body against its parameter types) and its socket threads are in it, as
    they are in the transport's own turns."""
    import openai

    http_url = echo_url.replace("ws://", "http://", 1).removesuffix("/responses")
    client = openai.OpenAI(base_url=http_url, api_key=SDK_API_KEY, max_retries=0)
    medians = []
    with client, client.responses.connect() as conn:
        for frame in frames:
            body = json.loads(frame)
            body.pop("type")
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                conn.response.create(**body)
                conn.recv_bytes()
                times.append(time.perf_counter() - started)
            medians.append(1000 * statistics.median(times))
    return medians
