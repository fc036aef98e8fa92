"""The engine driven directly: a Rollout on the simulated model, writing into a
:class:`~tests.support.memory_sink.MemorySink` (no socket, no serve layer).

These cover timings a socket can hardly produce on demand: a cancel that
arrives while the rollout's post-inference is under way.
"""

from __future__ import annotations

import asyncio

from longresponse.backends.registry import ModelRegistry
from longresponse.engine.limits import EngineLimits
from longresponse.engine.rollout import Rollout
from protocol import Mode, ResponseState
from protocol.events import ResponseCreate, ResponseDone
from protocol.response import Response
from tests.support.memory_sink import MemorySink


def done_events(sink: MemorySink) -> list[ResponseDone]:
    """The ``response.done`` events the rollout sent."""
    return [event for event in sink.events if isinstance(event, ResponseDone)]


def test_a_cancel_during_post_inference_comes_too_late() -> None:
    async def scenario() -> tuple[list[Response], list[ResponseDone]]:
        sink = MemorySink(Mode.APPEND)
        model = ModelRegistry().resolve("sim")
        rollout = Rollout(
            request=ResponseCreate(model="sim", input="hello"),
            model=model,
            limits=EngineLimits(pause_timeout=60),
        )
        reply = rollout.open_reply("resp_engine", sink, mode=Mode.APPEND)
        billing_started = asyncio.Event()
        release = asyncio.Event()
        billed: list[Response] = []

        async def post_inference(response: Response) -> None:
            billed.append(response)
            billing_started.set()
            await release.wait()  # a slow store write

        rollout.on_terminal = post_inference
        reply.announce_created()
        rollout.task = asyncio.get_running_loop().create_task(rollout.run())
        await billing_started.wait()
        assert rollout.terminal  # ending: no longer live for the rollout limit
        rollout.request_cancel()  # too late: the answer is complete
        release.set()
        await rollout.task
        return billed, done_events(sink)

    billed, done = asyncio.run(scenario())
    assert [r.status for r in billed] == ["completed"]
    assert [d.response.status for d in done] == ["completed"]


def test_a_rollout_cut_off_ends_cancelled_for_its_bill() -> None:
    async def scenario() -> ResponseState:
        sink = MemorySink(Mode.APPEND)
        model = ModelRegistry().resolve("sim")
        request = ResponseCreate(
            model="sim", input="hello", metadata={"sim_output_tokens": "100000"}
        )
        rollout = Rollout(request=request, model=model, limits=EngineLimits(pause_timeout=60))
        reply = rollout.open_reply("resp_cut", sink, mode=Mode.APPEND)
        reply.announce_created()
        rollout.task = asyncio.get_running_loop().create_task(rollout.run())
        for _ in range(1000):  # let it stream some events (it yields per chunk)
            if len(sink.events) >= 10:
                break
            await asyncio.sleep(0)
        assert len(sink.events) >= 10
        rollout.task.cancel()  # the connection is gone
        try:
            await rollout.task
        except asyncio.CancelledError:
            pass
        return rollout.snapshot().status  # type: ignore[return-value]

    assert asyncio.run(scenario()) == "cancelled"
