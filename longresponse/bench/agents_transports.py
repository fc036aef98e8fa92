"""The transports driven by the OpenAI Agents SDK: ``agents-http`` and ``agents-ws``.

Theory of operation
-------------------
The agent is written as the Agents SDK's documentation writes one: an
``Agent`` with the bench's one tool (:data:`~.conversation.TOOL` as a
``FunctionTool`` of the same name, description and JSON schema, not strict,
so the simulated model makes the same arguments), run with ``Runner.run``
on the task (:data:`~.conversation.TASK`). The Runner calls the model, runs
the tool the model asked for and calls the model again with the whole
conversation (it never chains with ``previous_response_id`` nor sets
``store``), until the model answers: one model request per turn of the
bench's conversation. The tool returns the :func:`~.conversation.tool_output`
of its turn, so the conversation, its token counts and the final answer are
those of every other transport.

Where the agent departs from the SDK's defaults, and why: ``max_turns`` is
the tool calls plus one (the default, 10, ends a longer rollout with
``MaxTurnsExceeded``); the simulated model's knobs travel in
``ModelSettings.metadata``, as every transport sends them; tracing is off
(``set_tracing_disabled``), since it would export spans to api.openai.com.

``agents-http``  ``Runner.run`` with ``RunConfig(model_provider=OpenAIProvider(
                 openai_client=...))``: the default model, ``OpenAIResponsesModel``,
                 over an ``AsyncOpenAI`` client (``max_retries=0``) whose HTTP
                 client, the SDK's own ``DefaultAsyncHttpxClient`` (httpx2),
                 notes each request's wire bytes and each reply's
                 ``Server-Timing`` in its event hooks.
``agents-ws``    ``responses_websocket_session()``, the SDK's helper, and its
                 ``run()``: ``OpenAIResponsesWSModel`` on one socket per rollout.
                 The SDK reads every frame itself, so no timing event is asked
                 for (the SDK would read it at the start of its next request);
                 each turn's server phase times and its frame's size come from
                 the server's inspector once the rollout is over, with the clock
                 stopped (:func:`inspector_timing`).

A turn is timed by the Runner's own hooks, from ``RunHooks.on_llm_start``
(the input is ready; the SDK has yet to build the request) to
``on_llm_end`` (the response parsed), as the other transports count their
encoding and decoding. ``Runner.run`` hands the agent nothing before a
response is whole, so its time to first output is the whole turn, as for
HTTP. The SDK is asyncio: each rollout runs whole in a worker thread with
an event loop of its own (``asyncio.run``), under the limiter of the
official SDK's transports (:func:`.sdk_transports.in_sdk_thread`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Final

import httpx
import httpx2
import openai
from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    ModelSettings,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    set_tracing_disabled,
)
from agents.models.openai_provider import OpenAIProvider
from agents.responses_websocket_session import responses_websocket_session

from .conversation import (
    TASK,
    TOOL,
    TURN_TIMEOUT,
    Endpoint,
    RolloutState,
    Turn,
    http_request_bytes,
    paced_tokens,
    server_timing,
    tool_output,
    websocket_frame_bytes,
)
from .options import Transport, Workload
from .sdk_transports import SDK_API_KEY, in_sdk_thread

__all__ = ["INSPECTOR_ROLLOUT", "agents_rollout", "inspector_timing"]

#: The inspector's record of one rollout; a request that does not chain
#: starts a record named by its response id (``serve.inspector``).
INSPECTOR_ROLLOUT: Final = "/inspect/api/rollouts/{response_id}"


class _Recorder(RunHooks[Any]):
    """The Runner's hooks and the tool's calls, turned into the rollout's turns."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.turns: list[Turn] = []
        self._started = 0.0
        self._tool_ms = 0.0  # the tools run since the last turn
        #: HTTP only, from the SDK's httpx2 client's event hooks, one per request.
        self.requests: list[httpx2.Request] = []
        self.replies: list[httpx2.Response] = []

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[Any],
    ) -> None:
        self._started = time.perf_counter()

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        ended = time.perf_counter()
        calls = [
            (item.call_id, item.name, item.arguments)
            for item in response.output
            if item.type == "function_call"
        ]
        texts = [
            "".join(getattr(part, "text", "") for part in item.content)
            for item in response.output
            if item.type == "message"
        ]
        index = len(self.turns)
        sent, server = 0, {}  # agents-ws: from the inspector, after the rollout
        if self.replies:
            if len(self.requests) != index + 1 or len(self.replies) != index + 1:
                raise RuntimeError(
                    f"turn {index}: {len(self.requests)} HTTP requests for {index + 1} turns"
                )
            sent = http_request_bytes(self.requests[index])
            server = server_timing(self.replies[index].headers.get("server-timing", ""))
        usage = response.usage
        self.turns.append(
            Turn(
                index=index,
                sent_bytes=sent,
                observed_ms=(ended - self._started) * 1000,
                client_ttft_ms=(ended - self._started) * 1000,  # handed over whole
                output_tokens=paced_tokens(calls, texts[-1] if texts else None),
                input_tokens=usage.input_tokens,
                cached_tokens=usage.input_tokens_details.cached_tokens,
                server=server,
                tool_latency_ms=self._tool_ms,
                response_id=response.response_id,
            )
        )
        self._tool_ms = 0.0

    async def run_tests(self, context: Any, arguments: str) -> str:
        """The bench's tool: the output of the turn whose call it answers."""
        if self.workload.tool_latency_ms > 0:
            started = time.perf_counter()
            await asyncio.sleep(self.workload.tool_latency_ms / 1000)
            self._tool_ms += (time.perf_counter() - started) * 1000
        return tool_output(len(self.turns) - 1, self.workload.output_tokens)


def _agent(recorder: _Recorder, metadata: dict[str, str]) -> Agent[Any]:
    tool = FunctionTool(
        name=TOOL["name"],
        description=TOOL["description"],
        params_json_schema=TOOL["parameters"],
        on_invoke_tool=recorder.run_tests,
        strict_json_schema=False,
    )
    return Agent(
        name="bench",
        model="sim",
        tools=[tool],
        model_settings=ModelSettings(metadata=metadata),
    )


async def _run(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """One rollout through the Runner, on this thread's event loop."""
    set_tracing_disabled(True)  # else it exports spans to api.openai.com
    recorder = _Recorder(workload)
    agent = _agent(recorder, RolloutState(transport, workload, via_url=via_url).metadata)
    max_turns = workload.tool_calls + 1
    base_url = endpoint.http_url + "/v1"
    if transport.shape == "agents-ws":
        async with responses_websocket_session(api_key=SDK_API_KEY, base_url=base_url) as session:
            result = await session.run(agent, TASK, hooks=recorder, max_turns=max_turns)
    else:

        async def sent(request: httpx2.Request) -> None:
            recorder.requests.append(request)

        async def answered(reply: httpx2.Response) -> None:
            recorder.replies.append(reply)

        # The SDK's own client class, with its defaults, and the two hooks.
        async with (
            openai.DefaultAsyncHttpxClient(
                timeout=TURN_TIMEOUT, event_hooks={"request": [sent], "response": [answered]}
            ) as http,
            openai.AsyncOpenAI(
                base_url=base_url, api_key=SDK_API_KEY, max_retries=0, http_client=http
            ) as client,
        ):
            provider = OpenAIProvider(openai_client=client)
            result = await Runner.run(
                agent,
                TASK,
                hooks=recorder,
                max_turns=max_turns,
                run_config=RunConfig(model_provider=provider),
            )
    return recorder.turns, str(result.final_output)


async def agents_rollout(
    endpoint: Endpoint, transport: Transport, workload: Workload, *, via_url: bool
) -> tuple[list[Turn], str]:
    """An Agents SDK rollout, whole, in a worker thread with its own event loop.
    ``agents-ws`` turns have no server times nor sizes yet: :func:`inspector_timing`."""
    run = functools.partial(_run, endpoint, transport, workload, via_url=via_url)
    return await in_sdk_thread(lambda: asyncio.run(run()))


async def inspector_timing(endpoint: Endpoint, turns: list[Turn]) -> None:
    """Fill in each turn's server phase times and sent bytes from the inspector's
    record of its response (``agents-ws``, whose SDK reads every frame itself).

    Raises ``RuntimeError`` if a record is missing (the inspector off, or more
    than its 128 kept rollouts since the turn) or is not that one turn's; the
    turns filled in before stay as they are.
    """
    async with httpx.AsyncClient(base_url=endpoint.http_url, timeout=30.0) as http:
        for turn in turns:
            path = INSPECTOR_ROLLOUT.format(response_id=turn.response_id)
            reply = await http.get(path)
            if reply.status_code != 200:
                raise RuntimeError(
                    f"turn {turn.index}: GET {path}: HTTP {reply.status_code} (the server's "
                    "inspector gives agents-ws its server times: is it on?)"
                )
            timeline = reply.json()["timeline"]
            if [row["response_id"] for row in timeline] != [turn.response_id]:
                raise RuntimeError(f"turn {turn.index}: {path} is not that turn's alone")
            (row,) = timeline
            turn.server = {key: float(value) for key, value in row["server"].items()}
            turn.sent_bytes = websocket_frame_bytes(row["bytes_in"])
