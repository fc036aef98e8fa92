"""What prefix reuse keeps for many conversations: ``.venv/bin/python scripts/prefix_reuse_memory.py [N] [TOKENS]``.

N (1,000) conversations of about TOKENS (20,000) tokens each, from one key,
over HTTP with the whole history resent: each a first turn (a user message
of TOKENS tokens, a tool call) and a second (the same input, the call, its
output). Against a server of its own (``--store memory://`` and a budget
above what they need), it prints what ``/metrics`` says prefix reuse holds
(bytes, marks), the server's resident memory before and after, and the
second turns' reported reuse. The figures are in docs/BENCHMARKS.md.
"""

import sys
import time

import httpx

from longresponse.server_process import ServerProcess

TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}


def figures(client: httpx.Client) -> dict[str, float]:
    wanted = ("longresponse_prefix_reuse_", "process_resident_memory_bytes")
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith(wanted)
    }


def main(conversations: int = 1000, tokens: int = 20_000) -> None:
    budget = 1 << 30
    with ServerProcess(
        "--store", "memory://", "--prefix-reuse-bytes", str(budget)
    ) as server, httpx.Client(base_url=server.http_url, timeout=120) as client:
        before = figures(client)
        started = time.perf_counter()
        reused = []
        for number in range(conversations):
            # About five tokens a word; the words differ per conversation.
            text = " ".join(f"w{number}x{word}" for word in range(tokens // 5))
            body = {
                "model": "sim",
                "input": [{"role": "user", "content": text}],
                "tools": [TOOL],
                "metadata": {"sim_tool_calls": "1"},
                "store": False,
            }
            first = client.post("/v1/responses", json=body).json()
            call = next(item for item in first["output"] if item["type"] == "function_call")
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
            body["input"] = [*body["input"], *first["output"], output]
            second = client.post("/v1/responses", json=body).json()
            usage = second["usage"]
            reused.append(usage["input_tokens_details"]["cached_tokens"] / usage["input_tokens"])
        seconds = time.perf_counter() - started
        after = figures(client)
    held = after["longresponse_prefix_reuse_bytes"]
    rss = after["process_resident_memory_bytes"] - before["process_resident_memory_bytes"]
    print(f"{conversations} conversations of {first['usage']['input_tokens']} tokens "
          f"(first turn) in {seconds:.1f} s")  # fmt: skip
    print(f"prefix reuse holds {held / 1e6:.1f} MB in "
          f"{after['longresponse_prefix_reuse_marks']:.0f} marks "
          f"({held / conversations / 1e3:.1f} kB a conversation); "
          f"evictions {after['longresponse_prefix_reuse_evictions_total']:.0f}")  # fmt: skip
    print(f"server RSS {before['process_resident_memory_bytes'] / 1e6:.0f} MB -> "
          f"{after['process_resident_memory_bytes'] / 1e6:.0f} MB (+{rss / 1e6:.0f} MB)")  # fmt: skip
    print(f"second turns' cached share: min {min(reused):.4f}, "
          f"median {sorted(reused)[len(reused) // 2]:.4f}")  # fmt: skip


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
