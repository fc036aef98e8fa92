"""The OpenAI Agents SDK for Python at its defaults over its Responses
WebSocket transport (``responses_websocket_session()``): a tool loop, then a
second user turn as the SDK's documentation continues a run
(``result.to_input_list()`` plus the new message), all on one socket.

Within a run and across the two runs the SDK resends the whole conversation
on every request and never ``previous_response_id``; the usage it reads from
each Response must still report the prefix reused (issue 29).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import (
    Agent,
    RunResult,
    TResponseInputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.models.openai_responses import OpenAIResponsesWSModel
from agents.responses_websocket_session import responses_websocket_session

from tests.clients.conversation import (
    FIRST_QUESTION,
    INSTRUCTIONS,
    SECOND_QUESTION,
    TOOL_DESCRIPTION,
    assert_answers,
    weather_report,
)
from tests.support.prefix_reuse import Usage, assert_prefix_reused

# Tracing would upload spans to api.openai.com (unreachable here).
set_tracing_disabled(True)

KEY = "agents-py-ws"


def test_agents_sdk_runs_two_turns_over_its_websocket_session(server: Any) -> None:
    cities: list[str] = []

    @function_tool(description_override=TOOL_DESCRIPTION)
    def get_weather(city: str) -> str:
        cities.append(city)
        return weather_report(city)

    agent = Agent(name="weather", instructions=INSTRUCTIONS, model="sim", tools=[get_weather])
    before = server.last_session

    async def converse() -> tuple[RunResult, RunResult]:
        async with responses_websocket_session(
            api_key=KEY, base_url=f"{server.http_url}/v1"
        ) as session:
            assert isinstance(session.provider.get_model("sim"), OpenAIResponsesWSModel)
            first = await session.run(agent, FIRST_QUESTION)
            again: list[TResponseInputItem] = [
                *first.to_input_list(),
                {"role": "user", "content": SECOND_QUESTION},
            ]
            second = await session.run(agent, again)
        return first, second

    first, second = asyncio.run(asyncio.wait_for(converse(), timeout=30))

    assert_answers(str(first.final_output), str(second.final_output), cities)
    # Two model requests a turn (the call, the answer), all four on one new socket.
    assert [len(first.raw_responses), len(second.raw_responses)] == [2, 2]
    socket = server.last_session
    assert socket is not before
    assert socket.shipped is not None
    assert socket.shipped.segments_run == 4

    usages = [
        Usage(raw.usage.input_tokens, raw.usage.input_tokens_details.cached_tokens)
        for result in (first, second)
        for raw in result.raw_responses
    ]
    assert all(usage.input_tokens > 0 for usage in usages), usages
    assert_prefix_reused(usages, "Agents SDK (Python) over its WebSocket session")
