"""The Vercel AI SDK (``ai`` 7, ``@ai-sdk/openai`` 4) at its defaults against
the server (``ai_sdk_loops.mjs`` on Node 22): a ToolLoopAgent's tool loop and
a second user turn that passes the first turn's messages back, over HTTP and
through the SDK's WebSocket fetch wrapper
(``@vercel/ai-sdk-openai-websocket-fetch``, the shipped WebSocket shape).

With ``store`` at its default the SDK sends its earlier answer back as an
``item_reference``; the server puts the stored message in its place. The SDK
resends the whole conversation in every request and never chains, so the
reuse it gets is the server's prefix reuse alone (issue 29).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from longresponse.server_process import ServerProcess
from tests.clients.whole_history import (
    RequestUsage,
    assert_prefix_reused,
    responses_by_transport,
    run_node,
    sim_answer,
    stored_usage,
)

#: the AI SDK from npm, on Node 22 from npm (tests/clients/node_modules).
pytestmark = pytest.mark.npm

#: What each request of a turn carries, after the instructions and the turn's
#: first question: the model calls the tool twice, then answers.
FIRST_TURN = ["message", "message", "function_call", "function_call_output"]
#: The second turn's first request: the first turn whole, its answer as a
#: reference to the stored message, and the new question.
SECOND_TURN = [
    *FIRST_TURN,
    "function_call",
    "function_call_output",
    "item_reference",
    "message",
]


@pytest.fixture(params=["http", "websocket"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _requests(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [request for turn in run["turns"] for request in turn["requests"]]


@pytest.mark.slow  # a server process, and Node 22 loading the AI SDK: about 4 s
def test_the_ai_sdk_runs_a_tool_loop_and_a_second_turn(transport: str) -> None:
    with ServerProcess("--store", "memory://", "--sim-tool-calls", "2") as server:
        run = run_node("ai_sdk_loops.mjs", f"{server.http_url}/v1", transport)
        requests = _requests(run)
        stored = [stored_usage(server.http_url, r["response_id"]) for r in requests]
        counted = responses_by_transport(server.http_url)
        resumed = run["turns"][1]["requests"][0]["response_id"]
        items = httpx.get(
            f"{server.http_url}/v1/responses/{resumed}/input_items",
            params={"order": "asc"},
            timeout=10,
        ).json()["data"]

    # Two turns of three requests: a call, a call, the answer.
    assert [[len(r["calls"]) for r in turn["requests"]] for turn in run["turns"]] == [
        [1, 1, 0],
        [1, 1, 0],
    ]
    outputs = [(output["call_id"], output["output"]) for output in run["outputs"]]
    assert [call for r in requests for call in r["calls"]] == [call for call, _ in outputs]
    # Each answer quotes every question and tool output of the conversation so far.
    asked = run["asked"]
    assert run["turns"][0]["text"] == sim_answer(asked[:1], outputs[:2])
    assert run["turns"][1]["text"] == sim_answer(asked, outputs)

    # What the SDK sent: the whole conversation every time, the first answer
    # by reference, store left to its default, over the transport asked for.
    sent = run["sent"]
    assert [body["input"] for body in sent[:3]] == [
        FIRST_TURN[:2],
        FIRST_TURN,
        [*FIRST_TURN, "function_call", "function_call_output"],
    ]
    assert sent[3]["input"] == SECOND_TURN
    assert all(body["store"] is None for body in sent)
    assert all(body["stream"] is (transport == "websocket") for body in sent)
    assert counted == {"http" if transport == "http" else "ws": 6}
    # The server put the stored answer where the reference stood.
    assistant = [item for item in items if item.get("role") == "assistant"]
    assert [part["text"] for item in assistant for part in item["content"]] == [
        run["turns"][0]["text"]
    ]

    # The usage the SDK reports is the server's, request by request.
    seen = [RequestUsage(r["input_tokens"], r["cached_tokens"]) for r in requests]
    assert seen == stored
    grown = [usage.input_tokens for usage in seen]
    assert grown == sorted(set(grown))  # the whole conversation, longer each time
    assert_prefix_reused(seen)
