"""The transports driven by the project's own clients: the trio WebSocket client and httpx.

Theory of operation
-------------------
:func:`ws_rollout` drives ``append``, ``ws`` and ``ws-full`` through the trio
client (:func:`longresponse.client.connect`, with the ``append`` subprotocol
for ``append``). A turn is timed from just before the request frame is
written to the arrival of its terminal event; the first output item or delta
marks the client-side time to first token. The terminal event is followed by
the server's timing event (asked for with the timing header), whose phase
times go into the turn. The frame's payload is built with the client's own
decoder and encoder, so its size, and the frame replayed against the echo
endpoint, is what the client sent.

:func:`http_rollout` drives ``http``, ``http-full`` and ``http-cached`` with a
small httpx client: one ``POST /v1/responses`` per turn, timed from encoding
the body to decoding the reply (as the WebSocket client's encoding and
decoding count), its phase times from the ``Server-Timing`` header. HTTP is
not streamed, so its time to first token is the whole response.

Both return every :class:`~.conversation.Turn` and the final answer; both raise
on an error event, a failed response, or a model still calling tools after
the last turn.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgspec

from longresponse.client import connect
from protocol import APPEND_SUBPROTOCOL, decode_client_event, encode_event
from protocol.events import (
    ErrorEvent,
    FunctionCallArgumentsDelta,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    ResponseCompleted,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    TimingEvent,
)
from protocol.items import FunctionCall, item_text
from protocol.items import Message as MessageItem

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
    run_tools,
    server_timing,
    websocket_frame_bytes,
)
from .options import Transport, Workload

__all__ = ["http_rollout", "ws_rollout"]


def _client_frame(fields: dict[str, Any]) -> bytes:
    """The payload the trio client sends for ``fields`` (same decoder and encoder)."""
    return encode_event(decode_client_event(msgspec.json.encode(fields)))


async def ws_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """One rollout over the trio WebSocket client; its turns and the final answer."""
    state = RolloutState(transport, workload, via_url=via_url)
    subprotocols = (APPEND_SUBPROTOCOL,) if transport.append_mode else ()
    turns: list[Turn] = []
    async with connect(
        endpoint.ws_url, subprotocols=subprotocols, headers=[TIMING_HEADER]
    ) as client:
        body = state.first_body()
        latency = 0.0
        for index in range(workload.tool_calls + 1):
            if transport.append_mode and index > 0:
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
                Turn(
                    index=index,
                    sent_bytes=websocket_frame_bytes(len(frame)),
                    observed_ms=(ended - started) * 1000,
                    client_ttft_ms=((first or ended) - started) * 1000,
                    output_tokens=paced_tokens(calls, answer),
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
            latency = await run_tools(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")


async def http_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """One rollout over HTTP (httpx); its turns and the final answer."""
    state = RolloutState(transport, workload, via_url=via_url)
    turns: list[Turn] = []
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
                json_message_text(item) for item in response["output"] if item["type"] == "message"
            ]
            answer = texts[-1] if texts else None
            input_tokens, cached_tokens = json_usage(response)
            turns.append(
                Turn(
                    index=index,
                    sent_bytes=sent,
                    observed_ms=(ended - started) * 1000,
                    # Not streamed: the first output arrives with the whole response.
                    client_ttft_ms=(ended - started) * 1000,
                    output_tokens=paced_tokens(calls, answer),
                    input_tokens=input_tokens,
                    cached_tokens=cached_tokens,
                    server=server_timing(headers.get("server-timing", "")),
                    tool_latency_ms=latency,
                )
            )
            if not calls:
                return turns, answer or ""
            state.previous_id = response["id"]
            latency = await run_tools(workload)
            body = state.next_body(calls, index)
    raise RuntimeError(f"{transport.name}: the model was still calling tools after the last turn")
