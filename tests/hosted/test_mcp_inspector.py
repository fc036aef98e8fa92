"""The inspector shows a hosted call as its own phase inside a turn: the rollout
does not pause for it."""

from __future__ import annotations

from typing import Any

import httpx

from longresponse.client import connect
from longresponse.engine.timing import TurnTiming
from tests.conftest import RunningServer
from tests.hosted.conftest import mcp_tool
from tests.support.mcp_server import LoopbackMcp


async def test_a_hosted_call_is_a_phase_of_its_turn(
    hosted_server: RunningServer, mcp_server: LoopbackMcp
) -> None:
    tool = mcp_tool(mcp_server.http_url, allowed_tools=["add"], require_approval="never")
    async with connect(hosted_server.url) as client:
        await client.create(
            model="sim", input="add", tools=[tool], metadata={"sim_tool_calls": "2"}
        )
        events = await client.until_done()
    response_id = events[0].response.id  # type: ignore[union-attr]
    async with httpx.AsyncClient(base_url=hosted_server.http_url) as http:
        detail: Any = (await http.get(f"/inspect/api/rollouts/{response_id}")).json()
    assert detail["status"] == "completed"
    (turn,) = detail["timeline"]  # listing, two calls, the answer: one turn, no pause
    server = turn["server"]
    assert set(server) == set(TurnTiming(turn=0).as_metrics())
    assert server["hosted_ms"] > 0
    assert server["inference_ms"] > 0
    kinds = [entry["type"] for entry in detail["events"]]
    assert kinds.count("response.mcp_call.completed") == 2
    assert kinds.count("response.mcp_list_tools.completed") == 1
    assert "response.done" in kinds
