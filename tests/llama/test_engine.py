"""The engine itself, talked to directly: the template and ``tool_choice``
that make SmolLM2-135M call a tool, and the usage figures the gateway bills."""

from __future__ import annotations

import json

import httpx
import pytest

from longresponse.llama_server import LlamaServer
from tests.llama.conftest import LOOP_TIMEOUT

#: Real turns on two cores shared with other work: seconds on a quiet machine,
#: minutes on a loaded one (the engine measured 13-28 times slower).
pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_required_tool_choice_makes_the_model_call_a_tool(llama: LlamaServer) -> None:
    """With the functionary template and ``tool_choice: "required"``, the
    engine's grammar forces a call whose arguments parse as the schema's object."""
    answer = httpx.post(
        f"{llama.base_url}/chat/completions",
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER],
            "tool_choice": "required",
            "max_tokens": 64,
        },
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    (choice,) = body["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert call["id"]
    assert body["usage"]["prompt_tokens"] > 0
    assert body["usage"]["completion_tokens"] > 0
