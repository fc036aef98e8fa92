"""What the shipped shape's connection cache holds, against its own estimate.

One connection (the official SDK) runs 50 chains of 5 segments each, with a
tool whose long description makes a prefix of about 1,000 tokens. The server
runs in this process, so ``tracemalloc`` sees what the run left allocated
(the client's few objects included) beside the cache's ``nbytes``, the
estimate its byte budget is enforced against.

    python examples/measure_connection_cache.py
"""

from __future__ import annotations

import gc
import json
import threading
import time
import tracemalloc
from typing import Any

import uvicorn
from openai import OpenAI

from longresponse.config import ServerConfig
from longresponse.serve.app import create_app

TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file. " * 100,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
CHAINS = 50
CALLS = {"sim_tool_calls": "4"}


def main() -> None:
    app = create_app(ServerConfig(port=0, store="memory://"))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, ws="wsproto", log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    try:
        with client.responses.connect() as conn:

            def turn(**fields: Any) -> Any:
                conn.response.create(model="sim", store=False, tools=[TOOL], **fields)
                for event in conn:
                    if event.type == "response.completed":
                        return event.response
                raise RuntimeError("the connection ended mid-turn")

            tracemalloc.start()
            gc.collect()
            before = tracemalloc.take_snapshot()
            for chain in range(CHAINS):
                response = turn(input=f"chain {chain}", metadata=CALLS)
                while calls := [i for i in response.output if i.type == "function_call"]:
                    outputs = [
                        {"type": "function_call_output", "call_id": c.call_id, "output": "ok"}
                        for c in calls
                    ]
                    response = turn(
                        input=outputs, previous_response_id=response.id, metadata=CALLS
                    )
            time.sleep(0.3)
            gc.collect()
            after = tracemalloc.take_snapshot()
            held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
            cache = app.parts.endpoint.last_session.shipped.cache
            print(
                json.dumps(
                    {"held_bytes": held, "estimate_bytes": cache.nbytes, "segments": len(cache)}
                )
            )
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=10)


if __name__ == "__main__":
    main()
