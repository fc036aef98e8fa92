"""Boundaries: where segments ended, and what a fork at one of them starts from."""

from __future__ import annotations

import pytest

from longresponse.engine.boundary import Boundaries
from longresponse.engine.render import TokenCache, render_prefix
from protocol.items import Item, Message
from protocol.response import Response


def _response(response_id: str) -> Response:
    return Response(id=response_id, created_at=0, status="completed", model="sim")


def _said(text: str) -> list[Item]:
    return [Message(role="user", content=text), Message(role="assistant", content="ok")]


def test_a_chain_with_one_prefix_holds_one_copy_of_it() -> None:
    tokens = TokenCache(render_prefix("be brief", []))
    boundaries = Boundaries()
    context: list[Item] = []
    for n in range(3):
        context += _said(f"turn {n}")
        tokens.extend(context[-2:])
        boundaries.mark(
            f"resp_{n}",
            items=len(context),
            tokens=tokens,
            pending={},
            response=_response(f"resp_{n}"),
            stream_id=None,
        )
    first, second, third = boundaries
    assert first.prefix is second.prefix is third.prefix
    assert [b.items for b in boundaries] == [2, 4, 6]
    assert third.tokens == len(tokens)
    assert third.item_tokens == len(tokens) - tokens.prefix_length
    # The prefix counted once: two more boundaries cost only what each holds beside it.
    one = Boundaries([first])
    prefix_bytes = len(first.prefix) * first.prefix.itemsize
    assert prefix_bytes > 0
    assert boundaries.nbytes - one.nbytes == 2 * (one.nbytes - prefix_bytes)


def test_a_fork_takes_what_the_boundary_held_and_what_the_model_saw_of_it() -> None:
    tokens = TokenCache(render_prefix(None, []))
    boundaries = Boundaries()
    context = _said("first")
    tokens.extend(context)
    first = boundaries.mark(
        "resp_1", items=2, tokens=tokens, pending={}, response=_response("resp_1"), stream_id=None
    )
    context += _said("second")
    tokens.extend(context[2:])
    start = boundaries.fork_at(first, context=context, tokens=tokens, model_seen=len(tokens))
    assert start.context == context[:2]
    assert start.tokens.tokens.tolist() == tokens.tokens.tolist()[: first.tokens]
    assert list(start.boundaries) == [first]
    assert start.model_seen == first.tokens  # the shared prefix was processed
    # Instructions changed since: the model has processed none of the fork's tokens.
    rebased = tokens.rebase(render_prefix("new instructions", []))
    moved = boundaries.fork_at(first, context=context, tokens=rebased, model_seen=len(rebased))
    assert moved.model_seen == 0
    assert moved.tokens.tokens.tolist()[: first.tokens] == start.tokens.tokens.tolist()


def test_a_fork_at_a_forgotten_boundary_is_refused() -> None:
    tokens = TokenCache(render_prefix(None, []))
    boundaries = Boundaries()
    tokens.extend(_said("first"))
    first = boundaries.mark(
        "resp_1", items=2, tokens=tokens, pending={}, response=_response("resp_1"), stream_id=None
    )
    boundaries.clear()  # a compaction's window: no segment ends inside it
    assert len(boundaries) == 0
    with pytest.raises(ValueError, match="not in list"):
        boundaries.fork_at(first, context=[], tokens=tokens, model_seen=0)
