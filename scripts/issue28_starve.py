"""Issue 28's item 7, rerun: ``.venv/bin/python scripts/issue28_starve.py [megabytes]``.

Against a fresh ``longresponse serve`` (memory store, keys ``keyA`` and
``keyB``): keyB's two short requests alone (a create with a tool the server
has not seen, and a create of a 300 Ki-character text), then the same while
keyA's three creates of ``megabytes`` MB (15 unless given) of ``--password ``
repeated are being read by the secrets classifier. Prints each of keyB's
times and keyA's. The figures are in docs/RELIABILITY.md.
"""

import json
import sys
import threading
import time

import httpx

from longresponse.server_process import ServerProcess

MEGABYTES = int(sys.argv[1]) if len(sys.argv) > 1 else 15
LONG = "--password " * (MEGABYTES * 2**20 // 11)
TEXT = "plain words " * (300 * 1024 // 12)
seen = iter(range(10**6))


def post(url, key, body):
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, timeout=600) as http:
        t = time.perf_counter()
        reply = http.post("/v1/responses", content=raw, headers=headers)
        return reply.status_code, time.perf_counter() - t


def with_tool(url):
    tool = {"type": "function", "name": f"read_{next(seen)}", "parameters": {"type": "object"}}
    return post(url, "keyB", {"model": "sim", "input": "hi", "store": False, "tools": [tool]})


def long_text(url):
    return post(url, "keyB", {"model": "sim", "input": TEXT, "store": False})


def show(label, result):
    print(f"{label}: {result[0]} {result[1] * 1000:.0f} ms", flush=True)


flags = ("--store", "memory://", "--api-key", "keyA", "--api-key", "keyB")
with ServerProcess(*flags) as server:
    url = server.http_url
    for _ in range(3):
        show("keyB tool, alone", with_tool(url))
        show("keyB 300 Ki text, alone", long_text(url))
    attacks: list[tuple[int, float]] = []
    body = {"model": "sim", "input": LONG, "store": False}
    threads = [
        threading.Thread(target=lambda: attacks.append(post(url, "keyA", body)))
        for _ in range(3)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # keyA's bodies are in and being read
    show("keyB tool, during", with_tool(url))
    show("keyB 300 Ki text, during", long_text(url))
    show("keyB tool, during (again)", with_tool(url))
    show("keyB 300 Ki text, during (again)", long_text(url))
    for thread in threads:
        thread.join()
    for result in attacks:
        show(f"keyA {MEGABYTES} MB --password", result)
    print(f"keyA done after {time.perf_counter() - started:.1f} s", flush=True)
