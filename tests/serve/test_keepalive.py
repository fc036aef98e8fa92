"""Liveness through long silences: while the model is silent, ``keepalive``
events (numbered in the response's stream, changing nothing) on every
transport, accepted by the official SDK; WebSocket pings from uvicorn."""

from __future__ import annotations

from typing import Any

import pytest

from longresponse.cli import build_parser, config_from_args, uvicorn_config
from longresponse.client import connect
from protocol import ResponseState
from protocol.events import Keepalive, ResponseCreated, ResponseDone
from tests.conftest import openai_client

SLOW = {"sim_ttft_ms": "400", "sim_tool_calls": "0"}


def test_an_sse_stream_carries_keepalives_while_the_model_is_silent(make_server: Any) -> None:
    client = openai_client(make_server(keepalive_interval=0.05), "k")
    with client.responses.stream(model="sim", input="slow", metadata=SLOW) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert "keepalive" in kinds
    # Only while silent: between the opening events and the first output.
    first_output = kinds.index("response.output_item.added")
    assert set(kinds[2:first_output]) == {"keepalive"}
    assert "keepalive" not in kinds[first_output:]
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))  # numbered in the response's stream
    assert final.status == "completed"
    assert "«slow»" in final.output_text


def test_the_sdk_websocket_reads_keepalives_as_events_of_the_turn(make_server: Any) -> None:
    client = openai_client(make_server(keepalive_interval=0.05), "k")
    with client.responses.connect() as connection:
        connection.response.create(model="sim", input="slow", metadata=SLOW)
        kinds = []
        for event in connection:
            kinds.append(event.type)
            if event.type == "response.completed":
                break
    assert kinds.count("keepalive") >= 3  # about 400 ms / 50 ms of silence
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"


def test_no_keepalive_when_it_is_off_or_the_model_is_not_silent(make_server: Any) -> None:
    off = openai_client(make_server(keepalive_interval=0.0), "k")
    with off.responses.stream(model="sim", input="slow", metadata=SLOW) as stream:
        assert "keepalive" not in [event.type for event in stream]
    quick = openai_client(make_server(keepalive_interval=0.05), "k")
    with quick.responses.stream(model="sim", input="quick", metadata={"sim_tool_calls": "0"}) as s:
        assert "keepalive" not in [event.type for event in s]


async def test_append_mode_names_the_response_on_its_keepalives(make_server: Any) -> None:
    server = make_server(keepalive_interval=0.05)
    async with connect(server.url) as client:
        await client.create(model="sim", input="slow", metadata=SLOW)
        events = await client.until_done()
    created = events[0]
    assert isinstance(created, ResponseCreated)
    keepalives = [event for event in events if isinstance(event, Keepalive)]
    assert keepalives
    assert {event.response_id for event in keepalives} == {created.response.id}
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == ResponseState.COMPLETED


def test_the_flags_set_the_keepalive_and_uvicorns_pings() -> None:
    args = build_parser().parse_args(
        ["serve", "--keepalive-interval", "5", "--ws-ping-interval", "7"]
    )
    config = config_from_args(args)
    assert config.keepalive_interval == 5
    served: Any = uvicorn_config(config)
    assert (served.ws_ping_interval, served.ws_ping_timeout) == (7, 7)
    defaults = config_from_args(build_parser().parse_args(["serve"]))
    assert 0 < defaults.keepalive_interval < 60  # below nginx's idle timeout
    served = uvicorn_config(defaults)
    assert 0 < served.ws_ping_interval < 60
    off: Any = uvicorn_config(
        config_from_args(build_parser().parse_args(["serve", "--ws-ping-interval", "0"]))
    )
    assert off.ws_ping_interval is None


@pytest.mark.parametrize("flag", ["--keepalive-interval", "--ws-ping-interval"])
def test_a_negative_interval_is_refused(flag: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, "-1"])


