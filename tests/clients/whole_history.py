"""What the suite asks of a client that sends the whole conversation in every
request (the Vercel AI SDK, the Agents SDK for JavaScript, Cline): a tool loop
and a second user turn that the simulated model answers from the whole
context, and the reuse issue 29 targets: from its second model request on, at
least :data:`REUSED_FRACTION` of each request's input tokens reported as
``cached_tokens`` (the prefix the server had rendered already), whatever the
client resends.

The Node scripts run on the Node 22 that ``tests/clients/package.json`` pins
(the ``node`` package from npm; ``ai`` 7 needs Node 22 and the machine's own
Node may be older).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from longresponse.backends.sim.sampler import QUOTE_CHARS

HERE: Final = Path(__file__).parent
#: Node 22 from npm, installed by ``make node-clients``.
NODE: Final = HERE / "node_modules" / ".bin" / "node"
#: From the second model request on, at least this share of each request's
#: input tokens is reported cached.
REUSED_FRACTION: Final = 0.95


@dataclass(frozen=True)
class RequestUsage:
    """What one model request reported, as the client read it."""

    input_tokens: int
    cached_tokens: int


def run_node(
    script: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> dict[str, Any]:
    """Run ``script`` (beside this module) on the pinned Node 22, in ``env`` if
    given, and return the one JSON object it prints; fails the test with its
    stderr if it exits non-zero."""
    assert NODE.is_file(), "Node 22 is missing: make node-clients installs it"
    done = subprocess.run(
        [str(NODE), str(HERE / script), *args],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def sim_answer(asked: Sequence[str], outputs: Sequence[tuple[str, str]]) -> str:
    """The simulated model's answer to a context holding the user messages
    ``asked`` and the tool outputs ``outputs`` ((call_id, output), in order):
    it quotes the head of each."""

    def quote(text: str) -> str:
        return "«" + text[:QUOTE_CHARS].replace("\n", " ") + "»"

    quoted = " | ".join(quote(question) for question in asked)
    read = " ".join(f"[{call_id}] {quote(output)}" for call_id, output in outputs)
    return f"You asked: {quoted}. I read {len(outputs)} tool outputs: {read}."


def stored_usage(http_url: str, response_id: str) -> RequestUsage:
    """The usage the server stored for ``response_id`` (GET /v1/responses/{id})."""
    reply = httpx.get(f"{http_url}/v1/responses/{response_id}", timeout=10)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    return RequestUsage(usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"])


def responses_by_transport(http_url: str) -> dict[str, int]:
    """``longresponse_responses_total`` summed per transport (``http``, ``ws``)."""
    page = httpx.get(f"{http_url}/metrics", timeout=10).text
    pattern = r'^longresponse_responses_total\{status="[^"]+",transport="([^"]+)"\} (\S+)$'
    counts: dict[str, int] = {}
    for transport, count in re.findall(pattern, page, re.MULTILINE):
        counts[transport] = counts.get(transport, 0) + int(float(count))
    return counts


def assert_prefix_reused(usages: Sequence[RequestUsage]) -> None:
    """Every request after the first reports at least :data:`REUSED_FRACTION`
    of its input tokens as cached; the message lists every request's
    (input_tokens, cached_tokens)."""
    assert len(usages) >= 2, usages
    short = [
        number
        for number, usage in enumerate(usages, start=1)
        if number > 1 and usage.cached_tokens < REUSED_FRACTION * usage.input_tokens
    ]
    seen = [(usage.input_tokens, usage.cached_tokens) for usage in usages]
    assert not short, (
        f"requests {short} report less than {REUSED_FRACTION:.0%} of their input cached; "
        f"(input_tokens, cached_tokens) per request: {seen}"
    )
