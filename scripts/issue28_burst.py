"""A burst of creates from one key: ``.venv/bin/python scripts/issue28_burst.py [N] [TOOL]``.

N (300) creates of keyA's at once, sent by a process of their own, each
offering the loopback MCP server's ``TOOL`` (``slow``: a call that hangs,
cut at ``--mcp-call-timeout 10``; ``add``: a quick one; ``fn``: a plain
function tool instead); meanwhile keyB's ``GET /healthz`` every 20 ms from
this process. Prints keyB's worst wait alone and during, and when it came.
The figures are in docs/RELIABILITY.md.
"""

import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path

import httpx

from longresponse.server_process import ServerProcess


def tool(url, name):
    if name == "fn":
        return {"type": "function", "name": "f", "parameters": {"type": "object"}}
    return {"type": "mcp", "server_label": "loop", "server_url": url,
            "allowed_tools": [name], "require_approval": "never"}  # fmt: skip


def attack(base, url, n, name, results):
    async def burst():
        limits = httpx.Limits(max_connections=n)
        headers = {"Authorization": "Bearer key-a"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60,
                                     limits=limits) as client:  # fmt: skip
            body = {"model": "sim", "input": "go", "tools": [tool(url, name)]}
            answers = await asyncio.gather(*(client.post("/v1/responses", json=body)
                                             for _ in range(n)))  # fmt: skip
            return sorted({answer.status_code for answer in answers})

    results.put(asyncio.run(burst()))


def mcp_server(urls):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' MCP server
    from tests.support.mcp_server import loopback_mcp

    with loopback_mcp() as running:
        urls.put(running.http_url)
        time.sleep(600)


def probe(client, seconds):
    waits = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sent = time.perf_counter()
        client.get("/healthz")
        waits.append((time.perf_counter() - sent, sent))
        time.sleep(0.02)
    return waits


def main(n, name):
    spawn = multiprocessing.get_context("spawn")
    urls, results = spawn.Queue(), spawn.Queue()
    mcp = spawn.Process(target=mcp_server, args=(urls,), daemon=True)
    mcp.start()
    url = urls.get(timeout=60)
    flags = ("--store", "memory://", "--api-key", "key-a", "--api-key", "key-b",
             "--mcp-allow-host", "127.0.0.1", "--mcp-call-timeout", "10")  # fmt: skip
    try:
        with ServerProcess(*flags) as server, httpx.Client(
            base_url=server.http_url, headers={"Authorization": "Bearer key-b"}, timeout=60
        ) as client:
            alone = max(wait for wait, _ in probe(client, 1.5))
            start = time.perf_counter()
            burst = spawn.Process(target=attack, args=(server.http_url, url, n, name, results))
            burst.start()
            worst, at = max(probe(client, 12))
            burst.join(60)
            print(json.dumps({"n": n, "tool": name, "alone_ms": round(alone * 1000, 1),
                              "during_ms": round(worst * 1000, 1), "at_s": round(at - start, 2),
                              "statuses": results.get(timeout=10)}))  # fmt: skip
    finally:
        mcp.kill()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 300, args[1] if len(args) > 1 else "slow")
