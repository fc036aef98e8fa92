"""Issue 20's attacks, rerun: ``.venv/bin/python scripts/issue20_attacks.py [name...]``.

For each attack, against a fresh ``longresponse serve`` (memory store): its
status and another client's worst ``GET /healthz`` wait while it runs (two
runs each); then the RSS that ten closed WebSocket connections with a 15 MB
field leave (``memory``). Names filter the attacks by substring. The figures
are in docs/RELIABILITY.md.
"""

import json
import re
import sys
import threading
import time

import httpx
from websockets.sync.client import connect as ws_connect

from longresponse.server_process import ServerProcess


def probe(url, stop, waits):
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            t = time.perf_counter()
            c.get("/healthz")
            waits.append(time.perf_counter() - t)
            time.sleep(0.002)


def stall(url, path, body, reps=3):
    raw = None if callable(body) else json.dumps(body).encode()
    out = []
    with httpx.Client(base_url=url, timeout=300) as c:
        for i in range(reps):
            if callable(body):
                raw = json.dumps(body(i)).encode()
            stop, waits = threading.Event(), []
            th = threading.Thread(target=probe, args=(url, stop, waits))
            th.start()
            time.sleep(0.1)
            t = time.perf_counter()
            r = c.post(path, content=raw, headers={"content-type": "application/json"})
            took = time.perf_counter() - t
            time.sleep(0.05)
            stop.set()
            th.join()
            out.append((r.status_code, round(took, 3), round(max(waits), 4)))
    return out


def rss(url):
    page = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(r"^process_resident_memory_bytes (\S+)$", page, re.M).group(1)) / 2**20


def alone(url):
    stop, waits = threading.Event(), []
    th = threading.Thread(target=probe, args=(url, stop, waits))
    th.start()
    time.sleep(1.5)
    stop.set()
    th.join()
    return max(waits)


def fmt(rows):
    return ", ".join(f"{s} {w * 1000:.0f} ms" for s, _, w in rows)


def pattern(n):
    schema = {
        "type": "object",
        "properties": {"x": {"type": "string", "pattern": "(x+)+y"}},
        "required": ["x"],
    }
    return {
        "model": "sim",
        "input": "x" * n,
        "store": False,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}},
    }


def tools(n):
    return [
        {
            "type": "function",
            "name": f"t{i}",
            "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
        }
        for i in range(n)
    ]


def wide(n):
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


with ServerProcess("--store", "memory://") as s:
    u = s.http_url
    httpx.post(u + "/v1/responses", json={"model": "sim", "input": "hi", "store": False})
    only = sys.argv[1:]
    print(f"/healthz alone: {alone(u) * 1000:.0f} ms", flush=True)
    cases = {
        "pattern (x+)+y, 26 x": ("/v1/responses", pattern(26)),
        "40,000 tools /v1/responses": (
            "/v1/responses",
            {"model": "sim", "input": "x", "tools": tools(40_000)},
        ),
        "40,000 tools /input_tokens": (
            "/v1/responses/input_tokens",
            {"model": "sim", "input": "x", "tools": tools(40_000)},
        ),
        "40,000 tools chat": (
            "/v1/chat/completions",
            {
                "model": "sim",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": t["name"], "parameters": t["parameters"]},
                    }
                    for t in tools(40_000)
                ],
            },
        ),
        "120,000-property response_format": (
            "/v1/chat/completions",
            {
                "model": "sim",
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": wide(120_000)},
                },
            },
        ),
        "120,000-property tool parameters": (
            "/v1/responses",
            {
                "model": "sim",
                "input": "x",
                "tools": [{"type": "function", "name": "a", "parameters": wide(120_000)}],
            },
        ),
        "120,000-property text.format": (
            "/v1/responses",
            {
                "model": "sim",
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "a", "schema": wide(120_000)}},
            },
        ),
        "create 100,000 items": (
            "/v1/responses",
            {"model": "sim", "input": [{"role": "user", "content": "x"}] * 100_000},
        ),
        "15 MB sk-sk create": (
            "/v1/responses",
            {"model": "sim", "input": "sk-" * 5_000_000, "store": False, "max_output_tokens": 16},
        ),
        "15 MB sk-sk compact": (
            "/v1/responses/compact",
            {"model": "sim", "input": "sk-" * 5_000_000},
        ),
        "compact 100,000 items": (
            "/v1/responses/compact",
            {"model": "sim", "input": [{"role": "user", "content": "x"}] * 100_000},
        ),
        "15 MB input /input_tokens": (
            "/v1/responses/input_tokens",
            {"model": "sim", "input": "word " * 3_000_000},
        ),
        "15 MB input /v1/responses": (
            "/v1/responses",
            {"model": "sim", "input": "word " * 3_000_000, "store": False, "max_output_tokens": 16},
        ),
    }
    for name, (path, body) in cases.items():
        if only and not any(o in name for o in only):
            continue
        print(f"{name}: {fmt(stall(u, path, body, reps=2))}", flush=True)
    if not only or any(o in "40,000 tools websocket" for o in only):
        frame = json.dumps(
            {"type": "response.create", "model": "sim", "input": "x", "tools": tools(40_000)}
        )
        rows = []
        for _ in range(2):
            stop, waits = threading.Event(), []
            th = threading.Thread(target=probe, args=(u, stop, waits))
            th.start()
            time.sleep(0.1)
            with ws_connect(s.url, max_size=None) as c:
                c.send(frame)
                answer = json.loads(c.recv(timeout=120))
            time.sleep(0.05)
            stop.set()
            th.join()
            rows.append((answer.get("error", {}).get("code", answer["type"]), 0, max(waits)))
        print(f"40,000 tools websocket: {fmt(rows)}", flush=True)
    if not only or "memory" in only:
        big = "k" * 15_000_000

        def ws_create(fields, append):
            protocols = ["longresponse.append.v1"] if append else None
            with ws_connect(s.url, max_size=None, subprotocols=protocols) as c:
                c.send(
                    json.dumps(
                        {
                            "type": "response.create",
                            "model": "sim",
                            "input": "hi",
                            "store": False,
                            "max_output_tokens": 8,
                            **fields,
                        }
                    )
                )
                while json.loads(c.recv(timeout=120))["type"] not in (
                    "response.completed",
                    "response.done",
                    "error",
                    "response.failed",
                ):
                    pass

        for _ in range(3):
            ws_create({}, True)
            ws_create({}, False)
        time.sleep(2)
        idle = rss(u)
        for label, fields, append in (
            ("prompt_cache_key, shipped", {"prompt_cache_key": big}, False),
            ("prompt_cache_key, append", {"prompt_cache_key": big}, True),
            ("previous_response_id, append", {"previous_response_id": big}, True),
            (
                "refused previous_response_id 8 MB, shipped",
                {"previous_response_id": big[:8_000_000]},
                False,
            ),
        ):
            for _ in range(10):
                ws_create(fields, append)
            time.sleep(3)
            after = rss(u)
            print(
                f"10 closed connections, 15 MB {label}: RSS {idle:.0f} -> {after:.0f} MiB ({after - idle:+.0f})",
                flush=True,
            )
