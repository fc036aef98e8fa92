"""The simulated model's server flags: a client that cannot set ``metadata``
(Codex) still gets the calls a test wants (``--sim-tool-calls``, ``--sim-call``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from longresponse.cli import build_parser, config_from_args
from longresponse.config import SimConfig
from tests.conftest import openai_client


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["cmd"],
        },
    }


TOOLS = [_tool("read_file"), _tool("exec_command"), _tool("view_image")]


def _calls(response: Any) -> list[tuple[str, dict[str, Any]]]:
    return [
        (item.name, json.loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    ]


def _answer(client: Any, response: Any) -> Any:
    outputs = [
        {"type": "function_call_output", "call_id": item.call_id, "output": "done"}
        for item in response.output
        if item.type == "function_call"
    ]
    return client.responses.create(
        model="sim", previous_response_id=response.id, input=outputs, tools=TOOLS
    )


def test_the_script_names_the_tools_and_arguments_in_order_cycling(make_server: Any) -> None:
    script = (("exec_command", '{"cmd":"git status"}'), ("view_image", '{"cmd":"x.png"}'))
    client = openai_client(make_server(sim=SimConfig(tool_calls=3, calls=script)), "k")
    response = client.responses.create(model="sim", input="go", tools=TOOLS)
    seen = []
    while _calls(response):
        seen += _calls(response)
        response = _answer(client, response)
    assert seen == [
        ("exec_command", {"cmd": "git status"}),
        ("view_image", {"cmd": "x.png"}),
        ("exec_command", {"cmd": "git status"}),
    ]
    assert "«go»" in response.output_text


def test_a_script_whose_tools_are_not_offered_leaves_the_calls_as_without_it(
    make_server: Any,
) -> None:
    client = openai_client(make_server(sim=SimConfig(calls=(("absent", "{}"),))), "k")
    response = client.responses.create(model="sim", input="go", tools=TOOLS)
    ((name, arguments),) = _calls(response)
    assert name == "read_file"  # the first offered tool, arguments from its schema
    assert set(arguments) == {"cmd", "limit"}


def test_the_flag_sets_the_default_and_metadata_still_overrides_it(make_server: Any) -> None:
    client = openai_client(make_server(sim=SimConfig(tool_calls=0)), "k")
    response = client.responses.create(model="sim", input="go", tools=TOOLS)
    assert not _calls(response)
    response = client.responses.create(
        model="sim", input="go", tools=TOOLS, metadata={"sim_tool_calls": "1"}
    )
    assert len(_calls(response)) == 1


def test_the_command_line_reads_the_flags() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--sim-tool-calls",
            "4",
            "--sim-call",
            'exec_command={"cmd": "ls"}',
            "--sim-call",
            "view_image={}",
        ]
    )
    sim = config_from_args(args).sim
    assert sim.tool_calls == 4
    assert sim.calls == (("exec_command", '{"cmd":"ls"}'), ("view_image", "{}"))


@pytest.mark.parametrize(
    "flags",
    [
        ["--sim-call", "exec_command"],
        ["--sim-call", "exec_command=[1]"],
        ["--sim-call", "exec_command={no json"],
        ["--sim-call", '={"cmd": "ls"}'],
        ["--sim-tool-calls", "1025"],
        ["--sim-tool-calls", "-1"],
    ],
)
def test_bad_flags_are_refused(flags: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *flags])
    assert "argument --sim-" in capsys.readouterr().err


