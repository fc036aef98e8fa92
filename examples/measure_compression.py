"""WebSocket compression on or off: memory per paused rollout and stream rate, side by side.

The `websockets` library offers permessage-deflate by default (the official
`openai` SDK's ``responses.connect()`` only when asked); a server that
accepts it keeps a compressor (and a decompressor) per connection. This
script starts one server with ``--ws-compression on`` and one with ``off``,
then with the `websockets` client at its defaults:

- opens ``--connections`` append-mode connections, each with one rollout
  paused on a tool call, and reports the server's resident memory per paused
  rollout (``process_resident_memory_bytes`` on ``/metrics``, before and after);
- streams one long answer (``--stream-tokens`` words, unthrottled) over one
  connection and reports delta events per second.

    python examples/measure_compression.py --connections 300 --stream-tokens 50000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx
import websockets

from longresponse.bench.scrape import unlabelled_samples
from longresponse.server_process import ServerProcess
from protocol import APPEND_SUBPROTOCOL

TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}


async def rss(http_url: str) -> float:
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(f"{http_url}/metrics")).text
    return unlabelled_samples(text)["process_resident_memory_bytes"]


async def paused_rollout(url: str) -> websockets.ClientConnection:
    ws = await websockets.connect(url, subprotocols=[APPEND_SUBPROTOCOL], max_size=None)
    await ws.send(json.dumps({"type": "response.create", "input": "go", "tools": [TOOL]}))
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "response.done":
            assert event["response"]["status"] == "requires_action", event
            return ws


async def stream_rate(url: str, tokens: int) -> tuple[float, bool]:
    async with websockets.connect(url, subprotocols=[APPEND_SUBPROTOCOL], max_size=None) as ws:
        compressed = "permessage-deflate" in (
            ws.response.headers.get("Sec-WebSocket-Extensions") or ""
        )
        create = {"type": "response.create", "input": "talk", "metadata": {
            "sim_output_tokens": str(tokens)}}
        await ws.send(json.dumps(create))
        deltas, started = 0, time.perf_counter()
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "response.output_text.delta":
                deltas += 1
            elif event["type"] == "response.done":
                return deltas / (time.perf_counter() - started), compressed


async def measure(flag: str, connections: int, tokens: int, rounds: int) -> dict[str, float]:
    with ServerProcess("--store", "memory://", "--ws-compression", flag) as server:
        rates = []
        for _ in range(rounds):
            rate, compressed = await stream_rate(server.url, tokens)
            rates.append(rate)
        before = await rss(server.http_url)
        sockets = [await paused_rollout(server.url) for _ in range(connections)]
        await asyncio.sleep(0.5)
        after = await rss(server.http_url)
        for ws in sockets:
            await ws.close()
    return {
        "negotiated": float(compressed),
        "kib_per_paused_rollout": (after - before) / connections / 1024,
        "delta_events_per_second": statistics.median(rates),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--stream-tokens", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| --ws-compression | negotiated | KiB per paused rollout | delta events/s |")
    print("|---|---|---:|---:|")
    for flag in ("on", "off"):
        row = await measure(flag, args.connections, args.stream_tokens, args.rounds)
        print(
            f"| {flag} | {'yes' if row['negotiated'] else 'no'} | "
            f"{row['kib_per_paused_rollout']:.1f} | {row['delta_events_per_second']:,.0f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
