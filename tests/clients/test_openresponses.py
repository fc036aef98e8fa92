"""openresponses-py, the typed Open Responses client, in its default strict
mode (``response_compatibility="strict"``: every Response and event validated
against the Open Responses schema, an SSE stream ended by ``data: [DONE]``),
over JSON, SSE and its WebSocket.

The client runs no tools itself: the application reads the ``function_call``
items, runs the tool and sends ``function_call_output`` items, continuing
either by sending the whole conversation again or, with the server keeping
the Response (``store`` defaults to true), by ``previous_response_id`` and
only the new items, as the client's README shows. Both are tried on each
transport, with a second user turn; the usage each Response reports must say
the prefix was reused (issue 29).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from openresponses import OpenResponses, ResponseResource, ResponseStream

from tests.clients.conversation import (
    FIRST_QUESTION,
    INSTRUCTIONS,
    SECOND_QUESTION,
    TOOL_DESCRIPTION,
    assert_answers,
    weather_report,
)
from tests.support.prefix_reuse import Usage, assert_prefix_reused

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]

Create = Callable[[dict[str, Any]], ResponseResource]


@contextmanager
def creator(client: OpenResponses, transport: str) -> Iterator[Create]:
    """``create(body)`` over ``transport``: the finished Response, its events read
    (and checked by the client) to the end."""
    if transport == "json":

        def posted(body: dict[str, Any]) -> ResponseResource:
            response = client.responses.create(body)
            assert isinstance(response, ResponseResource)  # strict: the Open Responses schema
            return response

        yield posted
        return
    if transport == "sse":

        def streamed(body: dict[str, Any]) -> ResponseResource:
            stream = client.responses.create({**body, "stream": True})
            assert isinstance(stream, ResponseStream)
            with stream:
                kinds = [event.type for event in stream]
            assert kinds[0] == "response.created", kinds
            assert isinstance(stream.final_response, ResponseResource)
            return stream.final_response

        yield streamed
        return
    with client.websocket() as socket:

        def turn(body: dict[str, Any]) -> ResponseResource:
            events = socket.create(body)
            kinds = [event.type for event in events]
            assert events.error is None, events.error
            assert kinds[-1] == "response.completed", kinds
            assert isinstance(events.final_response, ResponseResource)
            return events.final_response

        yield turn


@pytest.mark.parametrize("continued", ["history", "previous_response_id"])
@pytest.mark.parametrize("transport", ["json", "sse", "websocket"])
def test_openresponses_runs_two_turns_in_strict_mode(
    server: Any, transport: str, continued: str
) -> None:
    key = f"openresponses-{transport}-{continued}"
    cities: list[str] = []
    answers: list[str] = []
    usages: list[Usage] = []
    history: list[dict[str, Any]] = []
    previous: list[str] = []

    def answer(create: Create, question: str) -> None:
        """One user turn: create until the model answers without calling a tool."""
        new: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": question}]
        while True:
            body: dict[str, Any] = {"model": "sim", "instructions": INSTRUCTIONS, "tools": TOOLS}
            if continued == "history":
                history.extend(new)
                body["input"] = history
            else:
                body["input"] = new
                if previous:
                    body["previous_response_id"] = previous[-1]
            response = create(body)
            assert response.status == "completed"
            assert response.usage is not None
            usages.append(
                Usage(
                    response.usage.input_tokens, response.usage.input_tokens_details.cached_tokens
                )
            )
            previous.append(response.id)
            output = [item.root.model_dump(mode="json", by_alias=True) for item in response.output]
            history.extend(output)
            new = []
            for item in output:
                if item["type"] == "function_call":
                    assert item["name"] == "get_weather"
                    city = json.loads(item["arguments"])["city"]
                    cities.append(city)
                    new.append(
                        {
                            "type": "function_call_output",
                            "call_id": item["call_id"],
                            "output": weather_report(city),
                        }
                    )
            if not new:
                answers.append(output[-1]["content"][0]["text"])
                return

    before = server.last_session
    with OpenResponses(base_url=f"{server.http_url}/v1", api_key=key) as client:
        assert client.config.response_compatibility == "strict"
        with creator(client, transport) as create:
            answer(create, FIRST_QUESTION)
            answer(create, SECOND_QUESTION)

    assert len(answers) == 2
    if transport == "websocket":  # the four requests on one socket of the shipped shape
        assert server.last_session is not before
        assert server.last_session.shipped is not None
        assert server.last_session.shipped.segments_run == 4
    else:
        assert server.last_session is before
    assert_answers(answers[0], answers[1], cities)
    assert len(usages) == 4  # the call and the answer, twice
    assert all(usage.input_tokens > 0 for usage in usages), usages
    assert_prefix_reused(usages, f"openresponses-py (strict) over {transport}, {continued}")
