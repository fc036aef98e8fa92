"""The openai-agents SDK runs a tool-calling agent over our WebSocket transport.

A real ``Runner.run`` of an ``Agent`` with two ``@function_tool`` tools talks to
the live test server through ``OpenAIProvider(use_responses_websocket=True)``
(the SDK's ``OpenAIResponsesWSModel``), so this checks that the SDK accepts the
events we send and that what it sends back (tool outputs) is accepted by us.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIProvider,
    RunConfig,
    Runner,
    ToolCallItem,
    function_tool,
    set_tracing_disabled,
)
from agents.models.openai_responses import OpenAIResponsesWSModel
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall

# Tracing would try to upload spans to api.openai.com (unreachable here).
set_tracing_disabled(True)

USER_INPUT = "Please look up the weather and the time in Oslo today."
WEATHER_OUTPUT = "WEATHER-REPORT: snow, -3C, wind 12 km/h from the north"
CLOCK_OUTPUT = "CLOCK-READING: 14:05 Central European Time, Tuesday"


def test_agents_sdk_runs_two_tools_over_websocket(server: Any) -> None:
    calls: list[tuple[str, str]] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Return the current weather for a city."""
        calls.append(("get_weather", city))
        return WEATHER_OUTPUT

    @function_tool
    def get_time(city: str) -> str:
        """Return the local time in a city."""
        calls.append(("get_time", city))
        return CLOCK_OUTPUT

    agent = Agent(
        name="assistant",
        instructions="Use the tools, then answer.",
        model="sim",
        tools=[get_weather, get_time],
        # The sim calls one tool per turn, round-robin, this many times.
        model_settings=ModelSettings(metadata={"sim_tool_calls": "2"}),
    )

    before = server.last_session
    live_before = server.live_sessions

    async def run() -> tuple[str, Any]:
        client = AsyncOpenAI(base_url=server.http_url + "/v1", api_key="test", max_retries=0)
        provider = OpenAIProvider(openai_client=client, use_responses_websocket=True)
        try:
            model = provider.get_model("sim")
            assert isinstance(model, OpenAIResponsesWSModel)
            result = await asyncio.wait_for(
                Runner.run(agent, USER_INPUT, run_config=RunConfig(model_provider=provider)),
                timeout=20,
            )
            return str(result.final_output), result
        finally:
            await provider.aclose()
            await client.close()

    final_output, result = asyncio.run(run())

    # The SDK really ran both Python tools, each once, with schema-valid arguments.
    assert sorted(name for name, _ in calls) == ["get_time", "get_weather"]
    assert all(isinstance(city, str) and city for _, city in calls)
    # The final answer quotes the user's input and both tool outputs (40 chars each).
    assert f"«{USER_INPUT[:40]}»" in final_output
    assert f"«{WEATHER_OUTPUT[:40]}»" in final_output
    assert f"«{CLOCK_OUTPUT[:40]}»" in final_output
    assert "2 tool outputs" in final_output
    # Three model turns: call, call, answer; the answer names both calls by id.
    assert len(result.raw_responses) == 3
    call_ids = [
        item.raw_item.call_id
        for item in result.new_items
        if isinstance(item, ToolCallItem) and isinstance(item.raw_item, ResponseFunctionToolCall)
    ]
    assert len(call_ids) == 2
    for call_id in call_ids:
        assert f"[{call_id}]" in final_output

    # And the transport was our WebSocket endpoint: one new session ran 3 segments.
    session = server.last_session
    assert session is not None
    assert session is not before
    assert session.shipped is not None
    assert session.shipped.segments_run >= 3
    # provider.aclose() closed the SDK's socket: the server's session ends.
    deadline = time.monotonic() + 5
    while server.live_sessions > live_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.live_sessions <= live_before
