"""What the shipped shape's connection cache holds, against its own estimate.

One connection (the official SDK) runs 50 chains of 5 segments each, with a
tool whose long description makes a prefix of about 1,000 tokens; the
server runs in this process, so ``tracemalloc`` sees what the run left
allocated (the client's few objects included) beside the cache's
``nbytes``, the estimate its byte budget is enforced against.

    python examples/measure_connection_cache.py
"""

import gc
import json
import time
import tracemalloc

from openai import OpenAI

from longresponse.config import ServerConfig
from tests.conftest import RunningServer

TOOL = {"type": "function", "name": "read_file", "description": "Read a file. " * 100,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
server = RunningServer(ServerConfig(port=0, store="memory://")).start()
client = OpenAI(base_url=f"{server.http_url}/v1", api_key="k", max_retries=0)
with client.responses.connect() as conn:
    def turn(**fields):
        conn.response.create(model="sim", store=False, tools=[TOOL], **fields)
        for e in conn:
            if e.type == "response.completed":
                return e.response
    tracemalloc.start()
    gc.collect(); before = tracemalloc.take_snapshot()
    for chain in range(50):
        r = turn(input=f"chain {chain}", metadata={"sim_tool_calls": "4"})
        while any(i.type == "function_call" for i in r.output):
            outs = [{"type": "function_call_output", "call_id": i.call_id, "output": "ok " * 50}
                    for i in r.output if i.type == "function_call"]
            r = turn(input=outs, previous_response_id=r.id, metadata={"sim_tool_calls": "4"})
    time.sleep(0.3); gc.collect(); after = tracemalloc.take_snapshot()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    cache = server.app.state.endpoint.last_session.shipped.cache
    print(json.dumps({"held_bytes": held, "estimate_bytes": cache.nbytes, "segments": len(cache)}))
server.stop()
