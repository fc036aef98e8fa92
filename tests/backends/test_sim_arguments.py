"""The simulated model's call arguments are bounded by a budget of work (issue 28).

A function tool's ``parameters`` within every per-keyword cap can still ask
for a product of them: two arrays nested with ``minItems: 10000`` each are
10^8 elements. The model builds at most the Response's output budget of
values (and of string characters, 64 to a token); a call whose arguments
would take more is not started, and the Response ends ``incomplete``
(``max_output_tokens``), as any long answer does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from longresponse.server_process import ServerProcess
from tests.conftest import openai_client


def _grid_tool(side: int) -> dict[str, Any]:
    """About 300 bytes of ``parameters`` asking for ``side * side`` integers."""
    row = {"type": "array", "minItems": side, "items": {"type": "integer"}}
    return {
        "type": "function",
        "name": "fill_grid",
        "parameters": {
            "type": "object",
            "properties": {"grid": {"type": "array", "minItems": side, "items": row}},
            "required": ["grid"],
        },
    }


def _chat_function(side: int) -> dict[str, Any]:
    tool = _grid_tool(side)
    return {"name": tool["name"], "parameters": tool["parameters"]}


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


@pytest.fixture
def sim_server(tmp_path: Path) -> Any:
    with ServerProcess("--store", f"sqlite:///{tmp_path}/responses.db") as running:
        yield running


@pytest.mark.slow  # starts a server process of its own, to read its peak memory
@pytest.mark.parametrize("side", [3_000, 10_000])
def test_a_tool_asking_for_a_huge_product_is_answered_at_once(sim_server: Any, side: int) -> None:
    assert sim_server.process is not None
    pid = sim_server.process.pid
    client = openai_client(sim_server, "k").with_options(timeout=30)
    client.responses.create(model="sim", input="warm up")
    before = _peak_rss(pid)

    started = time.monotonic()
    response = client.responses.create(model="sim", input="go", tools=[_grid_tool(side)])
    took = time.monotonic() - started
    chat = client.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "go"}],
        tools=[{"type": "function", "function": _chat_function(side)}],
    )

    assert took < 2, f"the create took {took:.1f} s"
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert not [item for item in response.output if item.type == "function_call"]
    assert chat.choices[0].finish_reason == "length"
    assert not chat.choices[0].message.tool_calls
    grown = _peak_rss(pid) - before
    assert grown < 64 * 2**20, f"peak RSS grew {grown / 2**20:.0f} MiB"


NORMAL = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "mode": {"enum": ["r", "w"]},
        "lines": {"type": "array", "minItems": 3, "items": {"type": "integer", "minimum": 5}},
        "opts": {
            "type": "object",
            "properties": {"deep": {"type": "boolean"}, "tag": {"type": "string", "minLength": 12}},
        },
        "ratio": {"anyOf": [{"type": "number", "maximum": 2}, {"type": "null"}]},
    },
}


def test_a_normal_schemas_arguments_are_unchanged(server: Any) -> None:
    client = openai_client(server, "k")
    tool = {"type": "function", "name": "read", "parameters": NORMAL}
    response = client.responses.create(model="sim", input="go", tools=[tool])
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {
        "path": "README.md",
        "mode": "r",
        "lines": [5, 5, 5],
        "opts": {"deep": True, "tag": "tag-0xxxxxxx"},
        "ratio": 0,
    }


def test_arguments_that_just_fit_the_output_budget_are_sent(server: Any) -> None:
    client = openai_client(server, "k")
    tool = _grid_tool(20)  # 400 integers and 21 arrays: about 800 tokens
    response = client.responses.create(
        model="sim", input="go", tools=[tool], max_output_tokens=2_000
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"grid": [[0] * 20] * 20}
    refused = client.responses.create(model="sim", input="go", tools=[tool], max_output_tokens=300)
    assert refused.status == "incomplete"
    assert not [item for item in refused.output if item.type == "function_call"]
