"""The OpenAI Agents SDK for JavaScript (``@openai/agents``) at its defaults
against the server (``agents_js_loops.mjs`` on Node 22): an agent's tool loop,
then a second run on the first run's history and a new user message, over
HTTP and over the Responses WebSocket (``OpenAIResponsesWSModel``).

Within a run and across the two the SDK resends the whole conversation and
never chains, so the reuse it gets is the server's prefix reuse alone
(issue 29).
"""

from __future__ import annotations

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

#: the Agents SDK from npm, on Node 22 from npm (tests/clients/node_modules).
pytestmark = pytest.mark.npm


@pytest.fixture(params=["http", "websocket"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.slow  # a server process, and Node 22 loading the Agents SDK: about 4 s
def test_the_agents_sdk_runs_a_tool_loop_and_a_second_turn(transport: str) -> None:
    with ServerProcess("--store", "memory://", "--sim-tool-calls", "2") as server:
        run = run_node("agents_js_loops.mjs", f"{server.http_url}/v1", transport)
        requests = [request for turn in run["turns"] for request in turn["requests"]]
        stored = [stored_usage(server.http_url, r["response_id"]) for r in requests]
        counted = responses_by_transport(server.http_url)

    # Two runs of three model requests each: a call, a call, the answer.
    assert [[len(r["calls"]) for r in turn["requests"]] for turn in run["turns"]] == [
        [1, 1, 0],
        [1, 1, 0],
    ]
    assert all(r["requests"] == 1 for r in requests)
    outputs = [(output["call_id"], output["output"]) for output in run["outputs"]]
    assert [call for r in requests for call in r["calls"]] == [call for call, _ in outputs]
    # Each answer quotes every question and tool output of the conversation so far.
    asked = run["asked"]
    assert run["turns"][0]["text"] == sim_answer(asked[:1], outputs[:2])
    assert run["turns"][1]["text"] == sim_answer(asked, outputs)
    assert counted == {"http" if transport == "http" else "ws": 6}

    # The usage the SDK reports (result.rawResponses[i].usage) is the server's.
    seen = [RequestUsage(r["input_tokens"], r["cached_tokens"]) for r in requests]
    assert seen == stored
    grown = [usage.input_tokens for usage in seen]
    assert grown == sorted(set(grown))  # the whole conversation, longer each time
    assert_prefix_reused(seen)
