"""``serve.deadline.DeadlineStream``: a write that waits past its deadline
drops the connection, closes the iterator at once and ends quietly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from longresponse.serve.deadline import DeadlineStream
from longresponse.serve.seam import ABORT_KEY


def test_a_write_past_its_deadline_drops_the_reader() -> None:
    events: list[str] = []

    async def records() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            events.append("iterator closed")

    async def main() -> None:
        sent: list[Any] = []
        stuck = asyncio.Event()  # never set: a reader that never reads

        async def send(message: Any) -> None:
            sent.append(message)
            if len(sent) > 2:
                await stuck.wait()

        async def receive() -> Any:
            await asyncio.Event().wait()  # no disconnect ever comes

        scope = {
            "type": "http",
            "asgi": {"spec_version": "2.4"},
            ABORT_KEY: lambda: events.append("aborted"),
        }
        stream = DeadlineStream(
            records(), timeout=0.01, why="test", on_close=lambda: events.append("closed")
        )
        await asyncio.wait_for(stream(scope, receive, send), 5)
        assert stream.abandoned
        assert len(sent) == 3  # the start, one record, the one that waited

    asyncio.run(main())
    assert events == ["aborted", "iterator closed", "closed"]
