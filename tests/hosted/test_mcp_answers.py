"""Hostile MCP answers: a listing or a call answered with a body too large to
keep (64 MiB with its length, streamed without one and never ended, or a gzip
bomb of 64 KiB that inflates to 64 MiB) is cut off while it is read, at its
limit, and fails with that limit's error; the server's memory never holds it."""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from longresponse.config import ServerConfig
from tests.conftest import RunningServer, openai_client
from tests.hosted.conftest import LIMITS, mcp_tool
from tests.support.mcp_server import HOSTILE_BYTES, LoopbackMcp

#: The limits of this module's server: 100 kB for a listing and an output, and
#: time enough that a refusal is never the timeout's.
SMALL = dataclasses.replace(LIMITS, max_listing_bytes=100_000, call_timeout=20.0)
#: What reading one hostile answer may add to the process's peak of Python
#: memory (the body may be twice the limit and 64 KiB; the rest is slack for
#: the request, its events and the hostile server's own 1 MiB piece).
PEAK_BOUND = 8 << 20


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("answers") / "responses.db"
    config = dataclasses.replace(ServerConfig(port=0), store=f"sqlite:///{store}", mcp=SMALL)
    running = RunningServer(config).start()
    yield running
    running.stop()


def peak_while(create: Any) -> tuple[Any, int]:
    """``create()``'s result and how far the process's traced memory peaked above
    where it stood before."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = create()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


@pytest.mark.parametrize("kind", ["huge", "endless", "bomb"])
def test_a_hostile_listing_is_cut_off_at_its_limit(
    small_server: RunningServer, mcp_server: LoopbackMcp, kind: str
) -> None:
    client = openai_client(small_server)
    tool = mcp_tool(mcp_server.hostile_url(kind, "list"))
    response, peak = peak_while(
        lambda: client.responses.create(model="sim", input="list", tools=[tool])
    )
    listing = response.output[0]
    assert listing.type == "mcp_list_tools"
    assert listing.tools == []
    assert listing.error == (
        "MCP server 'loop' lists more than 100000 bytes of tools (--mcp-max-listing-bytes)."
    )
    assert response.status == "completed"
    assert peak < PEAK_BOUND < HOSTILE_BYTES, f"peak +{peak >> 20} MiB"


@pytest.mark.parametrize("kind", ["huge", "endless", "bomb"])
def test_a_hostile_output_is_cut_off_at_its_limit(
    small_server: RunningServer, mcp_server: LoopbackMcp, kind: str
) -> None:
    client = openai_client(small_server)
    tool = mcp_tool(
        mcp_server.hostile_url(kind, "call"), allowed_tools=["dump"], require_approval="never"
    )
    response, peak = peak_while(
        lambda: client.responses.create(model="sim", input="go", tools=[tool])
    )
    (call,) = [item for item in response.output if item.type == "mcp_call"]
    assert call.status == "failed"
    assert call.error.type == "mcp_protocol_error"
    assert call.error.code == -32001
    assert call.error.message == (
        "The output of 'dump' is larger than 100000 bytes (--mcp-max-output-bytes)."
    )
    assert response.output[-1].type == "message"  # the model went on
    assert peak < PEAK_BOUND < HOSTILE_BYTES, f"peak +{peak >> 20} MiB"


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        (
            "minimum",
            "lists a tool this server cannot offer: "
            "Invalid schema for function 'odd': 'zero' is not of type 'number'.",
        ),
        (
            "minitems",
            "lists a tool this server cannot offer: Invalid schema for function 'odd': "
            "at '#/properties/xs': 'minItems' above 10000 (20000).",
        ),
        # the SDK refuses this one itself, as not MCP (its listing is typed)
        (
            "properties",
            "sent an answer that is not MCP while listing its tools "
            "(at 'tools/0/inputSchema/properties').",
        ),
    ],
)
def test_a_listed_schema_no_client_could_give_fails_only_its_listing(
    small_server: RunningServer, mcp_server: LoopbackMcp, kind: str, why: str
) -> None:
    """A listed tool's ``inputSchema`` is held to what a function's ``parameters``
    must be (the metaschema, the schema limits): one that is not fails its
    server's listing, precisely; the other server's tools are offered and
    called."""
    client = openai_client(small_server)
    odd = {**mcp_tool(mcp_server.hostile_url(kind, "list")), "server_label": "odd"}
    good = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    response = client.responses.create(model="sim", input="go", tools=[odd, good])
    assert response.status == "completed"
    listings = {
        item.server_label: item for item in response.output if item.type == "mcp_list_tools"
    }
    assert listings["odd"].tools == []
    assert listings["odd"].error == f"MCP server 'odd' {why}"
    assert listings["loop"].error is None
    assert [tool.name for tool in listings["loop"].tools] == ["add"]
    (call,) = [item for item in response.output if item.type == "mcp_call"]
    assert (call.server_label, call.name, call.error) == ("loop", "add", None)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("brotli", "in an encoding this server did not ask for"),
        ("corrupt", "whose gzip does not inflate"),
    ],
)
def test_an_answer_that_cannot_be_decoded_fails_its_call_at_once(
    small_server: RunningServer, mcp_server: LoopbackMcp, kind: str, why: str
) -> None:
    """The server asks for gzip or deflate only (what it inflates within its
    limits); an answer in another, or one that does not inflate, fails its call
    at once, precisely (not at the timeout; it used to cancel the turn)."""
    client = openai_client(small_server)
    tool = mcp_tool(
        mcp_server.hostile_url(kind, "call"), allowed_tools=["dump"], require_approval="never"
    )
    response = client.responses.create(model="sim", input="go", tools=[tool])
    (call,) = [item for item in response.output if item.type == "mcp_call"]
    assert call.status == "failed"
    assert call.error.type == "mcp_protocol_error"
    assert call.error.message == f"MCP server 'loop' sent an answer {why} while calling a tool."
    assert "--mcp-call-timeout" not in call.error.message
    assert response.output[-1].type == "message"
