"""One rollout whose tools are hosted (MCP, run by the server: no pause) against
the same tools executed by the client (a pause per call), side by side.

    python examples/measure_hosted.py --calls 8 --rounds 10

A real MCP server (the ``mcp`` SDK's own, streamable HTTP) runs on loopback in
this process, with one tool, ``add``. A longresponse server process is started
with ``--mcp-allow-host 127.0.0.1``. Each round runs, in alternating order,
two append-mode rollouts of ``--calls`` tool calls with the trio client and the
simulated model (``sim_tool_calls``):

- **hosted**: the request carries the ``mcp`` tool (``require_approval:
  never``); the server lists the tools, calls ``add`` on the MCP server each
  time the model calls it and samples on: one ``response.done`` in all;
- **client-executed**: the request carries ``add`` as a function tool with
  the same schema; at each pause (``response.done`` with ``requires_action``)
  the client calls the same MCP tool itself, with the same SDK and one MCP
  session for the whole rollout (the server keeps one per turn: here the
  whole rollout too), and appends the output.

It reports per mode the median over rounds of the whole rollout (create sent
to the last ``response.done`` read), the time per call, the number of
``response.done`` events (pauses + 1) and the rollout's wire bytes read.
``--rtt-ms`` adds a client round trip before each create and append (a
client across a network, the MCP server next to the server): the hosted
rollout pays it once, the client-executed one once per call more.
``--markdown FILE`` appends the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time
from typing import Any

import msgspec
import trio
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer

from longresponse.client import connect
from longresponse.server_process import ServerProcess
from protocol.events import OutputItemDone, ResponseDone
from protocol.items import FunctionCall, McpCall

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def start_mcp() -> tuple[str, uvicorn.Server]:
    """The MCP server, on a loopback port, in a thread."""
    server = MCPServer("bench")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning"
    )
    running = uvicorn.Server(config)
    threading.Thread(target=running.run, daemon=True).start()
    while not running.started:
        time.sleep(0.01)
    port = running.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp", running


async def hosted(url: str, mcp_url: str, calls: int, rtt: float) -> dict[str, float]:
    tool = {
        "type": "mcp",
        "server_label": "bench",
        "server_url": mcp_url,
        "allowed_tools": ["add"],
        "require_approval": "never",
    }
    async with connect(url) as client:
        started = time.perf_counter()
        await trio.sleep(rtt)  # the client's round trip to the server
        await client.create(
            model="sim", input="add", tools=[tool], metadata={"sim_tool_calls": str(calls)}
        )
        events = await client.until_done(timeout=120)
        elapsed = time.perf_counter() - started
    dones = [e for e in events if isinstance(e, ResponseDone)]
    made = [e for e in events if isinstance(e, OutputItemDone) and isinstance(e.item, McpCall)]
    assert len(made) == calls, made
    assert dones[-1].response.status == "completed", dones[-1]
    return {"ms": elapsed * 1000, "dones": len(dones), "bytes": _size(events)}


async def client_executed(url: str, mcp_url: str, calls: int, rtt: float) -> dict[str, float]:
    tool = {"type": "function", "name": "add", "parameters": SCHEMA}
    dones = 0
    size = 0
    async with connect(url) as client:
        started = time.perf_counter()  # the client's MCP session is opened in the time
        async with Client(streamable_http_client(mcp_url), cache=None) as mcp:
            await trio.sleep(rtt)
            await client.create(
                model="sim", input="add", tools=[tool], metadata={"sim_tool_calls": str(calls)}
            )
            while True:
                events = await client.until_done(timeout=120)
                size += _size(events)
                done = [e for e in events if isinstance(e, ResponseDone)][-1]
                dones += 1
                if done.response.status != "requires_action":
                    break
                outputs = []
                for event in events:
                    if isinstance(event, OutputItemDone) and isinstance(event.item, FunctionCall):
                        result = await mcp.call_tool("add", json.loads(event.item.arguments))
                        text = "".join(getattr(part, "text", "") for part in result.content)
                        call_id = event.item.call_id
                        outputs.append(
                            {"type": "function_call_output", "call_id": call_id, "output": text}
                        )
                await trio.sleep(rtt)  # one round trip per pause
                await client.append(outputs)
        elapsed = time.perf_counter() - started
    assert done.response.status == "completed"
    assert dones == calls + 1
    return {"ms": elapsed * 1000, "dones": dones, "bytes": size}


def _size(events: list[Any]) -> int:
    return sum(len(msgspec.json.encode(event)) for event in events)


Results = dict[str, list[dict[str, float]]]


async def measure(url: str, mcp_url: str, calls: int, rounds: int, rtt: float) -> Results:
    results: Results = {"hosted": [], "client-executed": []}
    await hosted(url, mcp_url, calls, 0)  # warm both paths (imports, connections)
    await client_executed(url, mcp_url, calls, 0)
    for index in range(rounds):
        order = [("hosted", hosted), ("client-executed", client_executed)]
        for name, run in order if index % 2 == 0 else reversed(order):
            results[name].append(await run(url, mcp_url, calls, rtt))
    return results


def report(results: Results, args: argparse.Namespace) -> str:
    lines = [
        f"{args.calls} calls per rollout, client round trip {args.rtt_ms:g} ms, "
        f"{args.rounds} rounds, median (lowest-highest); "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}",
        "",
        "| mode | rollout (ms) | per call (ms) | response.done events | bytes read |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        ms = [run["ms"] for run in runs]
        lines.append(
            f"| {name} | {statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) "
            f"| {statistics.median(ms) / args.calls:.1f} "
            f"| {int(runs[0]['dones'])} | {int(statistics.median(r['bytes'] for r in runs))} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="a round trip between the client and the server, added before each create "
        "and append (the MCP server stays on loopback, next to the server)",
    )
    parser.add_argument("--markdown", help="append the table to this file")
    args = parser.parse_args()
    mcp_url, mcp_server = start_mcp()
    with ServerProcess("--mcp-allow-host", "127.0.0.1") as server:
        results = trio.run(
            measure, server.url, mcp_url, args.calls, args.rounds, args.rtt_ms / 1000
        )
    mcp_server.should_exit = True
    table = report(results, args)
    print(table)
    if args.markdown:
        with open(args.markdown, "a") as out:
            out.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
