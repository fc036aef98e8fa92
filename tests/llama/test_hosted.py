"""Hosted MCP tools in front of the real engine: the listed tools are offered to
llama-server as functions, the model's call of one is run by the server (an
``mcp_call`` item, no pause), and its output reaches the model as the call's
result, in the same Response."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from longresponse.config import McpLimits
from longresponse.llama_server import LlamaServer
from tests.conftest import openai_client
from tests.llama.conftest import LOOP_TIMEOUT, MODEL, gateway_backends
from tests.support.mcp_server import LoopbackMcp, loopback_mcp

pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[LoopbackMcp]:
    with loopback_mcp() as running:
        yield running


def test_a_listed_mcp_tool_is_called_by_the_engines_model_and_run_by_the_server(
    make_server: Any, llama: LlamaServer, tmp_path: Any, mcp_server: LoopbackMcp
) -> None:
    """``tool_choice`` ``auto`` goes to this engine as ``required``: the model
    calls the only tool offered, the listed ``shout``; the server runs it; at
    ``--mcp-max-calls`` the next turn may not call and the model answers."""
    gateway = make_server(
        store="memory://",
        backends=gateway_backends(llama, tmp_path),
        mcp=McpLimits(allowed_hosts=frozenset({"127.0.0.1"}), max_calls=1, call_timeout=30.0),
    )
    tool = {
        "type": "mcp",
        "server_label": "loop",
        "server_url": mcp_server.http_url,
        "allowed_tools": ["shout"],
        "require_approval": "never",
    }
    response = openai_client(gateway).responses.create(
        model=MODEL,
        input="Shout the word hello.",
        tools=[tool],  # type: ignore[list-item]
        temperature=0,
        max_output_tokens=120,
    )
    kinds = [item.type for item in response.output]
    assert kinds[:2] == ["mcp_list_tools", "mcp_call"], kinds
    listing, call = response.output[0], response.output[1]
    assert [t.name for t in listing.tools] == ["shout"]  # type: ignore[union-attr]
    assert call.server_label == "loop"  # type: ignore[union-attr]
    assert call.name == "shout"  # type: ignore[union-attr]
    # The engine's arguments went to the MCP server, which answered (or refused
    # arguments it could not take): either way the call ran there.
    assert call.output is not None or call.error is not None  # type: ignore[union-attr]
    if call.output is not None:  # type: ignore[union-attr]
        assert call.output == call.output.upper()  # type: ignore[union-attr]
    assert kinds[-1] == "message", kinds  # the answer, once no more calls were allowed
    assert "mcp_call" not in kinds[2:]
    assert response.status == "completed"
    assert response.usage is not None
    assert response.usage.input_tokens > 0
