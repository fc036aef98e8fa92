"""A burst of creates from one key: ``.venv/bin/python scripts/issue28_burst.py [N] [TOOL]``.

N (300) creates of keyA's at once, sent by a process of their own, each
offering the loopback MCP server's ``TOOL`` (``slow``: a call that hangs,
cut at ``--mcp-call-timeout 10``; ``add``: a quick one; ``fn``: a plain
function tool instead); meanwhile keyB's ``GET /healthz`` every 20 ms from
this process. Prints keyB's worst wait alone and during, and when it came.
The figures are in docs/RELIABILITY.md.
"""
import json
import subprocess
import sys
import time

import httpx

from longresponse.server_process import ServerProcess

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
ATTACK = r'''
import asyncio, sys, httpx
base, url, n, tool_name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
async def main():
    a = httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer key-a"}, timeout=60, limits=httpx.Limits(max_connections=1000))
    tool = {"type": "mcp", "server_label": "loop", "server_url": url, "allowed_tools": [tool_name], "require_approval": "never"} if tool_name != "fn" else {"type": "function", "name": "f", "parameters": {"type": "object"}}
    async def one():
        r = await a.post("/v1/responses", json={"model": "sim", "input": "go", "tools": [tool]})
        return r.status_code
    print(sorted(set(await asyncio.gather(*[one() for _ in range(n)]))), flush=True)
asyncio.run(main())
'''

def main():
    mcp = subprocess.Popen([sys.executable, "-c", "import time,sys; from tests.support.mcp_server import loopback_mcp\nwith loopback_mcp() as m:\n print(m.http_url, flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    url = mcp.stdout.readline().decode().strip()
    try:
        with ServerProcess("--store", "memory://", "--api-key", "key-a", "--api-key", "key-b",
                           "--mcp-allow-host", "127.0.0.1", "--mcp-call-timeout", "10") as server:
            b = httpx.Client(base_url=server.http_url, headers={"Authorization": "Bearer key-b"}, timeout=60)
            def probe(seconds):
                waits = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    t = time.perf_counter(); b.get("/healthz"); waits.append((time.perf_counter() - t, t))
                    time.sleep(0.02)
                return waits
            alone = max(w for w, _ in probe(1.5))
            tool_name = sys.argv[2] if len(sys.argv) > 2 else "slow"
            start = time.perf_counter()
            attacker = subprocess.Popen([sys.executable, "-c", ATTACK, server.http_url, url, str(N), tool_name], stdout=subprocess.PIPE)
            waits = probe(12)
            attacker.wait(60)
            worst = max(waits)
            print(json.dumps({"n": N, "alone_ms": round(alone * 1000, 1), "during_ms": round(worst[0] * 1000, 1),
                              "at_s": round(worst[1] - start, 2), "codes": attacker.stdout.read().decode().strip()}))
    finally:
        mcp.kill()

main()
