"""The deployment users would run: nginx in front of two processes on one Redis.

Real parts only: Debian's nginx (``tests/support/nginx_server.py``, docs/RELIABILITY.md's
proxy settings: WebSocket upgrade headers, long timeouts, no buffering),
two ``longresponse serve`` child processes with the same ``--api-key`` on
the session's real ``redis-server``, round robin between them, and the
official ``openai`` SDK as the only client, pointed at nginx:

- a ``store=true`` chain over HTTP (JSON, then SSE) is served by both
  processes in turn and keeps its whole context;
- the shipped WebSocket shape passes through nginx, and a new socket
  continues the first one's stored chain;
- the process holding a socket is killed (SIGKILL) mid-turn: the client
  reconnects through nginx, reaches the survivor and continues from the last
  stored response; the turn cut off was never acknowledged and is not stored.

nginx missing fails these tests (``make test`` installs it); it never skips.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import websockets
from openai import OpenAI

from longresponse.server_process import ServerProcess
from tests.conftest import OPEN_CLIENTS
from tests.support.nginx_server import NginxProxy

#: Debian's nginx in front of two processes on one redis.
pytestmark = pytest.mark.services

KEY = "nginx-test-key"
#: The operator's key: the one that reads ``/metrics``.
OPERATOR_KEY = "nginx-operator-key"
TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}


class Deployment:
    """nginx, and the two processes behind it."""

    def __init__(self, proxy: NginxProxy, processes: list[ServerProcess]) -> None:
        self.proxy = proxy
        self.processes = processes

    def client(self) -> OpenAI:
        """The official SDK, pointed at nginx (closed after the test)."""
        client = OpenAI(base_url=f"{self.proxy.http_url}/v1", api_key=KEY, max_retries=0)
        OPEN_CLIENTS.append(client)
        return client

    def upstream(self, process: ServerProcess) -> str:
        return f"127.0.0.1:{process.port}"


@pytest.fixture
def deployment(redis_url: str) -> Iterator[Deployment]:
    flags = ("--store", redis_url, "--api-key", KEY, "--operator-key", OPERATOR_KEY)
    with (
        ServerProcess(*flags) as first,
        ServerProcess(*flags) as second,
        NginxProxy([first.port, second.port]) as proxy,
    ):
        yield Deployment(proxy, [first, second])


def outputs_for(response: Any) -> list[dict[str, str]]:
    return [
        {"type": "function_call_output", "call_id": item.call_id, "output": f"read {item.call_id}"}
        for item in response.output
        if item.type == "function_call"
    ]


def test_a_stored_chain_continues_across_processes(deployment: Deployment) -> None:
    client = deployment.client()
    served_by: list[str] = []
    previous: Any = None
    for turn in range(4):
        chained = {"previous_response_id": previous.id} if previous is not None else {}
        raw = client.responses.with_raw_response.create(
            model="sim",
            input=[*(outputs_for(previous) if previous else []), _user(f"turn {turn}")],
            tools=[TOOL],
            metadata={"sim_tool_calls": "1"},
            **chained,
        )
        served_by.append(raw.headers["x-upstream"])
        previous = raw.parse()
        assert previous.status == "completed"
        assert [item.type for item in previous.output] == ["function_call"]
    # Round robin: the chain went back and forth between the two processes.
    assert set(served_by) == {deployment.upstream(p) for p in deployment.processes}
    # The last turn streams (SSE through nginx, unbuffered) and answers from
    # the whole chain, whichever process it lands on.
    with client.responses.stream(
        model="sim",
        previous_response_id=previous.id,
        input=[*outputs_for(previous), _user("the answer, please")],
        tools=[TOOL],
        metadata={"sim_tool_calls": "0"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    for turn in range(4):
        assert f"«turn {turn}»" in final.output_text
    assert "I read 4 tool outputs" in final.output_text
    # Every process reads every stored response of the chain.
    for process in deployment.processes:
        direct = OpenAI(base_url=f"{process.http_url}/v1", api_key=KEY, max_retries=0)
        OPEN_CLIENTS.append(direct)
        assert direct.responses.retrieve(final.id).output_text == final.output_text


def test_shipped_websocket_through_nginx(deployment: Deployment) -> None:
    client = deployment.client()
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim", input="over the proxy", tools=[TOOL], metadata={"sim_tool_calls": "1"}
        )
        first = _completed(conn)
        (call,) = outputs_for(first)
        conn.response.create(model="sim", previous_response_id=first.id, input=[call], tools=[TOOL])
        second = _completed(conn)
        assert "«over the proxy»" in second.output_text
        assert f"[{call['call_id']}]" in second.output_text
    # A new socket (on whichever process nginx picks) continues from the store.
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim", previous_response_id=second.id, input="and then?", tools=[TOOL],
            metadata={"sim_tool_calls": "0"},
        )  # fmt: skip
        third = _completed(conn)
    assert "«over the proxy» | «and then?»" in third.output_text


def test_a_killed_process_is_left_behind(deployment: Deployment) -> None:
    client = deployment.client()
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim", input="before the crash", tools=[TOOL], metadata={"sim_tool_calls": "1"}
        )
        stored = _completed(conn)
        holder = _holder_of_the_socket(deployment)
        # A long, slow turn; kill -9 its process once it is streaming.
        conn.response.create(
            model="sim",
            previous_response_id=stored.id,
            input=outputs_for(stored),
            tools=[TOOL],
            metadata={"sim_output_tokens": "400", "sim_tokens_per_second": "40"},
        )
        cut_off = None
        for event in conn:
            if event.type == "response.created":
                cut_off = event.response.id
            if event.type == "response.output_text.delta":
                break
        assert cut_off is not None
        assert holder.process is not None
        holder.process.kill()
        holder.process.wait()
        with pytest.raises(websockets.exceptions.ConnectionClosedError):
            _drain_until_cut(conn)
    # nginx is still up and reaches the survivor only.
    survivor = next(p for p in deployment.processes if p is not holder)
    health = httpx.get(
        f"{deployment.proxy.http_url}/healthz",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert health.status_code == 200
    assert health.headers["x-upstream"].endswith(deployment.upstream(survivor))
    # The client reconnects through nginx and continues from the last stored response.
    with client.responses.connect() as conn:
        conn.response.create(
            model="sim",
            previous_response_id=stored.id,
            input=outputs_for(stored),
            tools=[TOOL],
            metadata={"sim_tool_calls": "0"},
        )
        resumed = _completed(conn)
    assert "«before the crash»" in resumed.output_text
    assert "I read 1 tool outputs" in resumed.output_text
    # The turn cut off was never acknowledged, and never stored.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(cut_off)


def _user(text: str) -> dict[str, str]:
    return {"type": "message", "role": "user", "content": text}


def _completed(conn: Any) -> Any:
    for event in conn:
        assert event.type not in ("error", "response.failed", "response.incomplete"), event
        if event.type == "response.completed":
            return event.response
    raise AssertionError("the socket ended before response.completed")


def _drain_until_cut(conn: Any) -> None:
    """Read what is left; the socket must break before the turn completes."""
    for event in conn:
        assert event.type != "response.completed", "a turn outlived its process"


def _holder_of_the_socket(deployment: Deployment) -> ServerProcess:
    """The process that finished a WebSocket response: the only one that served one."""
    holders = [p for p in deployment.processes if _ws_responses(p) > 0]
    assert len(holders) == 1, holders
    return holders[0]


def _ws_responses(process: ServerProcess) -> float:
    metrics = httpx.get(
        f"{process.http_url}/metrics",
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
        timeout=10,
    ).text
    counts = re.findall(r'^longresponse_responses_total\{[^}]*transport="ws"[^}]*\} (\S+)$',
                        metrics, flags=re.MULTILINE)  # fmt: skip
    return sum(float(count) for count in counts)
