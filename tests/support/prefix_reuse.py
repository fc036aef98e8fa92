"""What a client at its defaults should be told it reused (issue 29's target).

A client that resends its whole conversation on every model request (the
Agents SDK within a run, pydantic-ai, LangChain) or chains it with
``previous_response_id`` should be billed only for what is new: from the
second request of a conversation on, at least :data:`REUSED_SHARE` of each
request's input tokens are reported as ``cached_tokens``, over HTTP and the
WebSocket alike.

- ``Usage``: one model request's input tokens and the part reported cached,
  as the client read them.
- ``assert_prefix_reused``: every request after the first reused its prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

__all__ = ["REUSED_SHARE", "Usage", "assert_prefix_reused"]

#: The share of a request's input that must be reported cached from the second
#: request of a conversation on (issue 29: "at least 95% of each turn's prefix").
REUSED_SHARE: Final = 0.95


class Usage(NamedTuple):
    """One model request's usage as its client saw it."""

    input_tokens: int
    cached_tokens: int


def assert_prefix_reused(usages: Sequence[Usage], client: str) -> None:
    """Assert that every request after the first of one conversation reports at
    least :data:`REUSED_SHARE` of its input tokens cached.

    Raises ``AssertionError`` naming ``client`` and listing every request's
    ``(input_tokens, cached_tokens)`` when one does not (or when there are fewer
    than two requests, where there would be nothing to check)."""
    assert len(usages) >= 2, f"{client}: {len(usages)} model requests, nothing reused to check"
    short = [
        number
        for number, usage in enumerate(usages[1:], start=2)
        if usage.cached_tokens < REUSED_SHARE * usage.input_tokens
    ]
    seen = ", ".join(
        f"#{n}: ({u.input_tokens}, {u.cached_tokens})" for n, u in enumerate(usages, 1)
    )
    assert not short, (
        f"{client}: requests {short} report less than {REUSED_SHARE:.0%} of their input "
        f"cached; (input_tokens, cached_tokens) per request: {seen}"
    )
