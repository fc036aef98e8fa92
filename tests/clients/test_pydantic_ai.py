"""pydantic-ai at its defaults with its OpenAI Responses model, over HTTP and
over its Responses WebSocket transport (``openai_transport="websocket"``): an
agent with one tool, then a second user turn with the first run's messages as
its history (``message_history=result.all_messages()``).

Over HTTP pydantic-ai resends the whole history on every request; over the
WebSocket it chains each request to the one before with
``previous_response_id`` (its ``"auto"`` default there), each ``agent.run``
on a socket of its own. Either way the usage it reads must report the prefix
reused (issue 29).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai import Agent, AgentRunResult
from pydantic_ai.messages import ModelResponse
from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
from pydantic_ai.providers.openai import OpenAIProvider

from tests.clients.conversation import (
    FIRST_QUESTION,
    INSTRUCTIONS,
    SECOND_QUESTION,
    TOOL_DESCRIPTION,
    assert_answers,
    weather_report,
)
from tests.support.http_clients import openai_client
from tests.support.prefix_reuse import Usage, assert_prefix_reused


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_pydantic_ai_runs_two_turns(server: Any, transport: str) -> None:
    cities: list[str] = []
    key = f"pydantic-ai-{transport}"
    provider = OpenAIProvider(base_url=f"{server.http_url}/v1", api_key=key)
    settings = OpenAIResponsesModelSettings(openai_transport="websocket")
    model = OpenAIResponsesModel(
        "sim", provider=provider, settings=settings if transport == "websocket" else None
    )
    agent = Agent(model, instructions=INSTRUCTIONS)

    @agent.tool_plain(description=TOOL_DESCRIPTION)
    def get_weather(city: str) -> str:
        cities.append(city)
        return weather_report(city)

    before = server.last_session

    async def converse() -> tuple[AgentRunResult[str], AgentRunResult[str]]:
        async with provider:  # closes its HTTP client after (the sockets close per run)
            first = await agent.run(FIRST_QUESTION)
            second = await agent.run(SECOND_QUESTION, message_history=first.all_messages())
        return first, second

    first, second = asyncio.run(asyncio.wait_for(converse(), timeout=30))

    assert_answers(first.output, second.output, cities)
    responses = [m for m in second.all_messages() if isinstance(m, ModelResponse)]
    assert len(responses) == 4  # the call and the answer, twice
    ids = [r.provider_response_id for r in responses if r.provider_response_id]
    assert len(ids) == 4
    sockets = {r.provider_details.get("transport") for r in responses if r.provider_details}
    # What each request continued, as the server stored it.
    stored = openai_client(server, key)
    chained = [stored.responses.retrieve(id_).previous_response_id for id_ in ids]
    if transport == "websocket":
        assert sockets == {"websocket"}
        assert chained == [None, *ids[:-1]]
        socket = server.last_session
        assert socket is not before
        assert socket.shipped is not None
        assert socket.shipped.segments_run == 2  # the second run's socket
    else:
        assert sockets <= {None}
        assert chained == [None] * 4  # the whole history every time
        assert server.last_session is before  # no socket opened

    usages = [Usage(r.usage.input_tokens, r.usage.cache_read_tokens) for r in responses]
    assert all(usage.input_tokens > 0 for usage in usages), usages
    assert_prefix_reused(usages, f"pydantic-ai over {transport}")
