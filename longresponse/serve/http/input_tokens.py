"""``POST /v1/responses/input_tokens``: the input tokens a create would read.

Theory of operation
-------------------
The body is the part of a create body that decides the model's input:
``model``, ``input``, ``instructions``, ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``previous_response_id``, ``conversation``,
``reasoning``, ``text`` and ``truncation`` (:data:`COUNT_PARAMETERS`); anything else is
``unknown_parameter``. It is decoded and checked as a create would be: the
model is resolved, a ``previous_response_id`` is read back from the store
(same owner; its pending calls must be answered), a ``conversation``'s
items are put before the input (as on a create), and admission validates
the tools, the ``text.format`` and the whole input and applies the secrets
policy. Then the context is rendered (the prefix of the instructions and
tools, the stored history, the new input) and counted, with the create's
window rules: over the model's context window, ``truncation: "auto"`` counts
what would be kept, otherwise ``context_length_exceeded`` (400, param
``input``).

Nothing is stored, no usage is billed and no model runs. The answer is
``{"object": "response.input_tokens", "input_tokens": N}``: N is the
``usage.input_tokens`` the same body would get from ``POST /v1/responses``
(HTTP rebuilds every conversation, so the model reads all of it).
"""

from __future__ import annotations

from typing import Final

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protocol import ErrorCode, ProtocolError, RemoteProtocolError, decode_create_body
from protocol.items import as_items

from ...engine.compaction import drain
from ...engine.counting import token_lengths
from ...engine.render import items_to_drop, render_prefix
from ..errors import http_error
from ..references import resolve_references
from .responses import ResponsesHTTP

__all__ = ["COUNT_PARAMETERS", "InputTokens"]

#: The create parameters that decide the input, and so the count.
COUNT_PARAMETERS: Final = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "previous_response_id", "conversation", "reasoning", "text", "truncation",
    }
)  # fmt: skip


#: Reads just the top-level keys (the create decoder has checked the values).
_keys_decoder: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])


class InputTokens:
    """The counting endpoint; shares the HTTP API's keys, body limit and store."""

    def __init__(self, http: ResponsesHTTP) -> None:
        self.http = http

    def routes(self) -> list[Route]:
        return [Route("/v1/responses/input_tokens", self.count, methods=["POST"])]

    async def count(self, request: Request) -> Response:
        http = self.http
        try:
            owner = http.owner(request)
            raw = await http.read_body(request)
            await http.check_skeleton(raw)
            body = decode_create_body(raw)  # JSON, types, unknown create parameters
            for key in _keys_decoder.decode(raw):
                if key not in COUNT_PARAMETERS:
                    raise RemoteProtocolError(
                        f"Unknown parameter: '{key}' (not a parameter of input token counts).",
                        code=ErrorCode.UNKNOWN_PARAMETER,
                        param=key,
                    )
            model = http.turns.resolve(body)
            body = await resolve_references(body, http.persistence, owner=owner)
            new_items = as_items(body.input)
            continuation = await http.stored_continuation(body, new_items, owner)
            compactor = http.turns.compactor(owner)
            # The costly checks, off the loop.
            async with http.turns.settled(body, [*continuation.history, *new_items], owner=owner):
                admission = http.turns.pipeline.admit(
                    new_items,
                    history=continuation.history,
                    tools=body.tools,
                    text_format=body.text.format if body.text is not None else None,
                    cached=False,
                    compactor=compactor,
                )
            # As a turn takes them in: a compaction item's window replaces what
            # came before it, and a trailing compaction_trigger is no item.
            taken = drain([*continuation.history, *admission.items], compactor).items
            prefix = len(render_prefix(body.instructions, body.tools))
            lengths = await token_lengths(taken)  # the loop runs between pieces
            total = prefix + sum(lengths)
            window = model.context_window
            if total > window:
                if body.truncation != "auto":
                    raise RemoteProtocolError(
                        model.too_long(total),
                        code="context_length_exceeded",
                        param="input",
                    )
                total -= sum(lengths[: items_to_drop(prefix, lengths, window)])
        except ProtocolError as error:
            return http_error(error)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": total})
