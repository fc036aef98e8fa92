"""Issue 28's memory attacks, rerun: ``.venv/bin/python scripts/issue28_attacks.py [name...]``.

Against a fresh ``longresponse serve`` (memory store; but for ``append``, the
simulated model's window cut to 2,000 tokens so that a long input is
refused), each attack
runs ``ROUNDS`` times and prints the server's RSS (``/metrics``) before, after
and its growth per round:

- ``refused``: an 8 MB HTTP create, refused ``context_length_exceeded``;
- ``ws-failed``: a WebSocket whose 12 MB ``response.create`` fails, closed;
- ``idle``: 2,000 WebSockets opened, left idle for a second and closed (a round);
- ``append``: an append-mode connection that appends a 3 MB tool output
  into a paused rollout, cancels it mid-turn and closes.

Then the live-input attacks (item 6), once each against a fresh server with
the default flags, printing the RSS before, while the input is held (the
connections open) and after they close, and how many messages were refused:

- ``live-appends``: 40 appends of 8 MiB into one rollout waiting for its
  first token;
- ``live-injects``: 20 multi-agent injects of 8 MiB beside a pending call;
- ``live-steers``: 8 connections, each steering one response waiting for its
  first token with 8 steers of 8 MiB.

Names filter the attacks by substring. The figures are in docs/RELIABILITY.md.
"""

import json
import re
import socket
import sys
import time

import httpx
from websockets.sync.client import connect as ws_connect

from longresponse.server_process import ServerProcess
from protocol import APPEND_SUBPROTOCOL

ROUNDS = 10
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}


def rss(url):
    page = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(r"^process_resident_memory_bytes (\S+)$", page, re.M).group(1)) / 2**20


def text(megabytes):
    return "word " * (megabytes * 1024 * 1024 // 5)


def refused(server):
    body = json.dumps({"model": "sim", "input": text(8)}).encode()
    with httpx.Client(base_url=server.http_url, timeout=120) as http:
        reply = http.post(
            "/v1/responses", content=body, headers={"content-type": "application/json"}
        )
    assert reply.status_code == 400, reply.text[:200]


def ws_failed(server):
    with ws_connect(server.url, max_size=None) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "sim", "input": text(12)}))
        while json.loads(socket.recv(timeout=120))["type"] not in ("response.failed", "error"):
            pass


def append(server):
    with ws_connect(server.url, subprotocols=[APPEND_SUBPROTOCOL], max_size=None) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "go",
                                "tools": [TOOL], "metadata": {"sim_output_tokens": "100000"}}))
        while (event := json.loads(socket.recv(timeout=120)))["type"] != "response.done":
            pass
        (call,) = event["response"]["output"]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": text(3)}
        socket.send(json.dumps({"type": "response.append", "input": [output]}))
        while json.loads(socket.recv(timeout=120))["type"] != "response.output_item.added":
            pass
        socket.send(json.dumps({"type": "response.cancel"}))
        while json.loads(socket.recv(timeout=120))["type"] != "response.done":
            pass


def idle(server):
    """2,000 WebSockets opened, left idle for a second, then closed."""
    import wsproto
    import wsproto.events as ws

    sockets = []
    for _ in range(2000):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        sock.sendall(conn.send(ws.Request(host="127.0.0.1", target="/v1/responses")))
        conn.receive_data(sock.recv(4096))
        assert isinstance(next(conn.events()), ws.AcceptConnection)
        sockets.append((sock, conn))
    time.sleep(1)
    for sock, conn in sockets:
        sock.sendall(conn.send(ws.CloseConnection(code=1000)))
        sock.close()


ATTACKS = {"refused": refused, "ws-failed": ws_failed, "append": append, "idle": idle}
WAITING = {"sim_tool_calls": "0", "sim_ttft_ms": "600000"}


def user(megabytes):
    return [{"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": text(megabytes)}]}]  # fmt: skip


def until(socket, *types):
    while (event := json.loads(socket.recv(timeout=300)))["type"] not in types:
        pass
    return event


def live_appends(server, sockets):
    socket = ws_connect(server.url, subprotocols=[APPEND_SUBPROTOCOL], max_size=None)
    sockets.append(socket)
    socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "go",
                            "metadata": WAITING}))  # fmt: skip
    rid = until(socket, "response.created")["response"]["id"]
    body = json.dumps({"type": "response.append", "response_id": rid, "input": user(8)})
    for _ in range(40):
        socket.send(body)
    socket.send(json.dumps({"type": "response.cancel", "response_id": "resp_none"}))
    refused = 0
    while until(socket, "error")["error"]["code"] != "response_not_found":
        refused += 1
    return refused, 40


def live_injects(server, sockets):
    socket = ws_connect(server.url, max_size=None,
                        additional_headers={"OpenAI-Beta": "responses_multi_agent=v1"})  # fmt: skip
    sockets.append(socket)
    socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "go",
                            "tools": [TOOL], "multi_agent": {"enabled": True}}))  # fmt: skip
    rid = until(socket, "response.created")["response"]["id"]
    until(socket, "response.output_item.done")
    body = json.dumps({"type": "response.inject", "response_id": rid, "input": user(8)})
    refused = 0
    for _ in range(20):
        socket.send(body)
        refused += until(socket, "response.inject.created", "error")["type"] == "error"
    return refused, 20


def live_steers(server, sockets):
    refused = 0
    for _ in range(8):
        socket = ws_connect(server.url, max_size=None)
        sockets.append(socket)
        socket.send(json.dumps({"type": "response.create", "model": "sim", "input": "go",
                                "metadata": WAITING}))  # fmt: skip
        rid = until(socket, "response.created")["response"]["id"]
        body = json.dumps({"type": "response.steer", "previous_response_id": rid,
                           "input": text(8)})  # fmt: skip
        for _ in range(8):
            socket.send(body)
            event = until(socket, "response.steer.accepted", "response.steer.failed")
            refused += event["type"] == "response.steer.failed"
    return refused, 64


LIVE = {"live-appends": live_appends, "live-injects": live_injects, "live-steers": live_steers}


def live(names):
    for name, attack in LIVE.items():
        if names and not any(n in name for n in names):
            continue
        with ServerProcess("--store", "memory://") as server:
            time.sleep(1)
            before = rss(server.http_url)
            sockets = []
            refused, sent = attack(server, sockets)
            held = rss(server.http_url)
            for socket in sockets:
                socket.close()
            time.sleep(2)
            after = rss(server.http_url)
        print(f"{name}: {sent - refused} of {sent} messages of 8 MiB kept, {refused} refused; "
              f"RSS {before:.0f} -> {held:.0f} MiB while held ({held - before:+.0f}), "
              f"{after:.0f} after the connections closed", flush=True)  # fmt: skip


def main(names):
    live(names)
    for name, attack in ATTACKS.items():
        if names and not any(n in name for n in names):
            continue
        flags = ["--store", "memory://", "--max-message-bytes", str(32 * 1024 * 1024)]
        if name != "append":  # refused: past the window
            flags += ["--sim-context-window", "2000"]
        rounds = 3 if name == "idle" else ROUNDS
        with ServerProcess(*flags) as server:
            attack(server)  # the first round's one-off costs (imports, caches)
            time.sleep(1)
            before = rss(server.http_url)
            for _ in range(rounds):
                attack(server)
            time.sleep(2)
            after = rss(server.http_url)
        print(f"{name}: RSS {before:.0f} -> {after:.0f} MiB after {rounds} rounds, "
              f"{(after - before) / rounds:+.1f} MiB a round", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
