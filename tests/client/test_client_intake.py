"""The trio client's intake against the real server: its event queue pushes back
without losing an event, and its message limit counts UTF-8 bytes."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from longresponse.client import ConnectionClosedError, connect
from protocol.events import OutputTextDelta, ResponseDone


async def test_a_full_event_queue_pushes_back_and_loses_nothing(server: Any) -> None:
    async with connect(server.url, max_queued_events=4) as client:
        await client.create(model="sim", input="stream", metadata={"sim_output_tokens": "600"})
        await trio.sleep(0.5)  # not reading: the queue fills, the receive loop waits
        events = await client.until_done()
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))  # every event, in order
    assert sum(isinstance(e, OutputTextDelta) for e in events) >= 500
    assert isinstance(events[-1], ResponseDone)
    assert events[-1].response.status == "completed"


@pytest.mark.parametrize("letter", ["a", "é"])
async def test_a_message_over_the_clients_limit_in_bytes_closes_with_1009(
    server: Any, letter: str
) -> None:
    # response.created echoes the metadata: 2,000 characters of it, 2,000 bytes
    # of "a" but 4,000 of "é"; with the rest of the event, the limit of 4,000
    # bytes lies between the two.
    metadata = {f"note{i}": letter * 500 for i in range(4)}
    async with connect(server.url, max_message_bytes=4000) as client:
        await client.create(model="sim", input="hello", metadata=metadata, store=False)
        if letter.isascii():
            done = (await client.until_done())[-1]
            assert isinstance(done, ResponseDone)
            assert done.response.status == "completed"
            return
        with pytest.raises(ConnectionClosedError) as closed:
            await client.until_done()
        assert closed.value.code == 1009
