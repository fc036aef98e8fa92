"""One append Response streaming the simulated model's answer of N tokens into
a protocol ``Connection`` (no socket, no serve layer): the engine's own cost
of a streamed event, for an instruction counter that the machine's load does
not move. Run it at two sizes and divide the difference (docs/BENCHMARKS.md,
"The third structural step")::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python scripts/stream_cost.py 2000
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python scripts/stream_cost.py 12000
    # (I refs at 12000 - I refs at 2000) / 10000 = instructions a streamed event
"""

from __future__ import annotations

import asyncio
import sys

from longresponse.backends.registry import ModelRegistry
from longresponse.engine.limits import EngineLimits
from longresponse.engine.rollout import Rollout
from protocol import Framing, Mode, ResponseTrack, Role
from protocol.connection import Connection
from protocol.events import ResponseCreate, ServerEvent


class CountingSink:
    """Every event checked by the protocol core, then counted and dropped."""

    def __init__(self) -> None:
        self.connection = Connection(Role.SERVER, Mode.APPEND, framing=Framing.NONE)
        self.events = 0

    async def room(self) -> None:
        return None

    def push(self, event: ServerEvent) -> None:
        self.connection.send(event)
        self.events += 1

    def track(self, response_id: str) -> ResponseTrack:
        track = self.connection.response(response_id)
        assert track is not None
        return track


async def stream(tokens: int) -> int:
    request = ResponseCreate(
        model="sim", input="hello", metadata={"sim_output_tokens": str(tokens)}
    )
    rollout = Rollout(
        request=request,
        model=ModelRegistry().resolve("sim"),
        limits=EngineLimits(pause_timeout=60),
    )
    sink = CountingSink()
    rollout.open_reply("resp_cost", sink, mode=Mode.APPEND).announce_created()
    await rollout.run()
    return sink.events


if __name__ == "__main__":
    print(asyncio.run(stream(int(sys.argv[1]))), "events")
