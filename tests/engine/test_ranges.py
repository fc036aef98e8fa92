"""Every knob has a range: the sim_* metadata keys, the server's numeric flags,
and the per-Response caps on events and output tokens."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import openai
import pytest

from longresponse import config
from longresponse.backends.sim.sampler import MAX_SIM_OUTPUT_TOKENS, MAX_SIM_PARALLEL_CALLS
from longresponse.cli import build_parser
from longresponse.client import connect
from protocol import ErrorCode, LocalProtocolError
from protocol.events import ErrorEvent, ResponseCreated, ResponseDone
from tests.conftest import openai_client

OUT_OF_RANGE = [
    pytest.param("sim_output_tokens", str(MAX_SIM_OUTPUT_TOKENS + 1), id="output-past-cap"),
    pytest.param("sim_output_tokens", "1000000000000", id="output-1e12"),
    pytest.param("sim_output_tokens", "-1", id="output-negative"),
    pytest.param("sim_parallel_calls", str(MAX_SIM_PARALLEL_CALLS + 1), id="parallel-past-cap"),
    pytest.param("sim_parallel_calls", "1000000", id="parallel-1e6"),
    pytest.param("sim_tool_calls", "2000", id="tool-calls-past-cap"),
    pytest.param("sim_tool_calls", "-5", id="tool-calls-negative"),
    pytest.param("sim_tokens_per_second", "nan", id="tps-nan"),
    pytest.param("sim_tokens_per_second", "-1", id="tps-negative"),
    pytest.param("sim_tokens_per_second", "inf", id="tps-inf"),
    pytest.param("sim_tokens_per_second", "0.000001", id="tps-below-one"),
    pytest.param("sim_tokens_per_second", "10000001", id="tps-past-cap"),
    pytest.param("sim_ttft_ms", "1e12", id="ttft-1e12"),
    pytest.param("sim_ttft_ms", "-1", id="ttft-negative"),
    pytest.param("sim_ttft_ms", "nan", id="ttft-nan"),
]


@pytest.mark.parametrize(("key", "value"), OUT_OF_RANGE)
async def test_an_out_of_range_sim_value_is_refused_on_a_websocket(
    server: Any, key: str, value: str
) -> None:
    frame = {"type": "response.create", "input": "x", "metadata": {key: value}}
    async with connect(server.url) as client:
        await client.send_raw(json.dumps(frame))
        event = await client.next_event()
        assert isinstance(event, ErrorEvent), event
        assert event.error.code == "invalid_value"
        assert event.error.param == f"metadata.{key}"
        assert value in event.error.message
        # The connection stays usable.
        await client.create(model="sim", input="still here", store=False)
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"


@pytest.mark.parametrize(("key", "value"), OUT_OF_RANGE[::3])
def test_an_out_of_range_sim_value_is_refused_over_http(server: Any, key: str, value: str) -> None:
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="sim", input="x", metadata={key: value})
    assert raised.value.code == "invalid_value"
    assert raised.value.param == f"metadata.{key}"


@pytest.mark.parametrize(
    "metadata",
    [
        {"sim_output_tokens": str(MAX_SIM_OUTPUT_TOKENS), "sim_tokens_per_second": "1000000"},
        {"sim_parallel_calls": "0", "sim_tool_calls": "0", "sim_ttft_ms": "0"},
        {"sim_tokens_per_second": "0", "sim_ttft_ms": "600000"},
        {"sim_tokens_per_second": "1"},
    ],
)
async def test_the_ends_of_every_range_are_accepted(server: Any, metadata: dict[str, str]) -> None:
    async with connect(server.url) as client:
        await client.create(model="sim", input="x", store=False, metadata=metadata)
        event = await client.next_event()
        assert isinstance(event, ResponseCreated), event
        refused: LocalProtocolError | None = None
        try:
            await client.cancel()
        except LocalProtocolError as exc:  # an instant answer may have ended already,
            refused = exc  # and the client already read that it had
        assert refused is None or refused.code == ErrorCode.RESPONSE_ALREADY_COMPLETED
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status in {"cancelled", "completed"}


def serve_actions() -> list[argparse.Action]:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return list(serve._actions)


def test_every_numeric_flag_has_a_range() -> None:
    typed = {action.dest for action in serve_actions() if action.type is not None}
    # --sim-call is the one typed flag that is not a number (NAME=JSON).
    assert typed - {"sim_calls"} == set(config.RANGES)


@pytest.mark.parametrize(
    "flags",
    [
        ["--sim-ttft-ms", "1e12"],
        ["--sim-ttft-ms", "nan"],
        ["--sim-tokens-per-second", "-1"],
        ["--sim-tokens-per-second", "inf"],
        ["--sim-tokens-per-second", "0.5"],
        ["--sim-prefill-tokens-per-second", "nan"],
        ["--sim-context-window", "0"],
        ["--port", "70000"],
        ["--send-queue-depth", "0"],
        ["--slow-reader-timeout", "inf"],
        ["--pause-timeout", "0"],
        ["--max-response-events", "0"],
        ["--max-response-output-tokens", "-3"],
        ["--max-message-bytes", "99999999999"],
        ["--store-ttl", "nan"],
    ],
)
def test_an_out_of_range_flag_is_refused(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", *flags])
    assert exited.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_in_range_flags_are_taken() -> None:
    args = build_parser().parse_args(
        ["serve", "--sim-tokens-per-second", "0", "--sim-ttft-ms", "600000",
         "--max-response-events", "10", "--max-response-output-tokens", "20", "--port", "0"]
    )  # fmt: skip
    assert (args.sim_tokens_per_second, args.sim_ttft_ms) == (0.0, 600000.0)
    assert (args.max_response_events, args.max_response_output_tokens, args.port) == (10, 20, 0)


# --- the per-Response caps --------------------------------------------------


async def test_a_response_past_its_event_cap_ends_incomplete(make_server: Any) -> None:
    running = make_server(max_response_events=40)
    async with connect(running.url) as client:
        await client.create(model="sim", input="talk", metadata={"sim_output_tokens": "500"})
        events = await client.until_done()
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "incomplete"
    assert done.response.incomplete_details is not None
    assert done.response.incomplete_details.reason == "max_events"
    # The cap is checked before each word: the open message's closing events
    # and the terminal event come after it.
    assert 40 <= len(events) <= 40 + 4
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    (message,) = done.response.output
    # Cut off by the cap, not ended by the model: incomplete, as shipped.
    assert message.status == "incomplete"  # type: ignore[union-attr]


async def test_a_response_past_the_servers_output_cap_ends_incomplete(make_server: Any) -> None:
    running = make_server(max_response_output_tokens=30)
    async with connect(running.url) as client:
        await client.create(model="sim", input="talk", metadata={"sim_output_tokens": "500"})
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "incomplete"
    assert done.response.incomplete_details is not None
    assert done.response.incomplete_details.reason == "max_output_tokens"
    assert done.response.usage is not None
    assert 20 < done.response.usage.output_tokens <= 30
    # The request's own max_output_tokens is echoed as sent (absent here).
    assert done.response.max_output_tokens is None
    # A smaller max_output_tokens of the request's own still applies.
    client_http = openai_client(running)
    made = client_http.responses.create(
        model="sim", input="talk", max_output_tokens=10, metadata={"sim_output_tokens": "500"}
    )
    assert made.status == "incomplete"
    assert made.usage is not None
    assert made.usage.output_tokens <= 10


def test_the_caps_apply_over_http_too(make_server: Any) -> None:
    running = make_server(max_response_events=30)
    body = {"input": "talk", "stream": True, "metadata": {"sim_output_tokens": "400"}}
    with httpx.stream("POST", f"{running.http_url}/v1/responses", json=body, timeout=30) as reply:
        data = [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    records = [json.loads(line) for line in data[:-1]]
    assert records[-1]["type"] == "response.incomplete"
    assert records[-1]["response"]["incomplete_details"] == {"reason": "max_events"}
    assert len(records) <= 30 + 4


@pytest.mark.slow  # streams 30,000 tokens
async def test_a_long_answer_counts_its_tokens_exactly(server: Any) -> None:
    """The padding streams word by word; its usage is the whole text's tokens."""
    from longresponse.engine.render import encode

    async with connect(server.url) as client:
        await client.create(
            model="sim", input="pad", store=False, metadata={"sim_output_tokens": "30000"}
        )
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    (message,) = done.response.output
    text = message.content[0].text  # type: ignore[union-attr]
    assert len(text.split(" ")) == 30000
    assert done.response.usage is not None
    assert done.response.usage.output_tokens == len(encode(text))
