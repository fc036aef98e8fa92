"""``langchain-openai`` at its defaults with the Responses API
(``ChatOpenAI(use_responses_api=True)``, over HTTP JSON): the tool loop LangChain
documents (``bind_tools``, invoke, run each ``tool_call``, hand back a
``ToolMessage``), then a second user turn appended to the same message list.

LangChain resends the whole message list on every request and never
``previous_response_id`` (``use_previous_response_id`` defaults to off); the
``usage_metadata`` it reads must still report the prefix reused (issue 29).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.clients.conversation import (
    FIRST_QUESTION,
    INSTRUCTIONS,
    SECOND_QUESTION,
    TOOL_DESCRIPTION,
    assert_answers,
    weather_report,
)
from tests.support.prefix_reuse import Usage, assert_prefix_reused


def test_langchain_runs_two_turns_with_the_responses_api(server: Any) -> None:
    cities: list[str] = []

    @tool(description=TOOL_DESCRIPTION)
    def get_weather(city: str) -> str:
        cities.append(city)
        return weather_report(city)

    chat = ChatOpenAI(
        model="sim",
        base_url=f"{server.http_url}/v1",
        api_key=SecretStr("langchain"),
        use_responses_api=True,
    )
    model = chat.bind_tools([get_weather])
    messages: list[BaseMessage] = [SystemMessage(INSTRUCTIONS), HumanMessage(FIRST_QUESTION)]
    replies: list[AIMessage] = []

    def answer() -> str:
        """One user turn: invoke until the model answers without calling a tool."""
        while True:
            reply = model.invoke(messages)
            assert isinstance(reply, AIMessage)
            replies.append(reply)
            messages.append(reply)
            if not reply.tool_calls:
                return reply.text
            messages.extend(get_weather.invoke(call) for call in reply.tool_calls)

    try:
        first = answer()
        messages.append(HumanMessage(SECOND_QUESTION))
        second = answer()
    finally:
        chat.root_client.close()

    assert_answers(first, second, cities)
    assert [bool(reply.tool_calls) for reply in replies] == [True, False, True, False]
    assert all(reply.response_metadata["id"].startswith("resp_") for reply in replies)

    usages = []
    for reply in replies:
        assert reply.usage_metadata is not None
        details = reply.usage_metadata.get("input_token_details", {})
        usages.append(Usage(reply.usage_metadata["input_tokens"], details.get("cache_read", 0)))
    assert all(usage.input_tokens > 0 for usage in usages), usages
    assert_prefix_reused(usages, "langchain-openai (use_responses_api=True)")
