"""The HTTP Conversations API: ``/v1/conversations`` and its items.

``POST /v1/conversations`` (``items`` up to 20, ``metadata``),
``GET``/``POST`` (update metadata)/``DELETE /v1/conversations/{id}``;
``POST``/``GET /v1/conversations/{id}/items`` (add up to 20; list with
``after``, ``limit``, ``order``), ``GET``/``DELETE
/v1/conversations/{id}/items/{item_id}``. Shapes are the shipped ones (the
official SDK's ``types/conversations``); ``include`` is accepted and changes
nothing. Owned per API key as responses are (``longresponse.serve.conversations``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from protocol import ErrorCode, ProtocolError, RemoteProtocolError

from ...storage.records import StoredConversation
from ..conversations import Conversations, decode_conversation_body, item_not_found
from ..errors import http_error
from .listing import item_id, list_query, page, past
from .responses import ResponsesHTTP

__all__ = ["ConversationsHTTP"]

_encoder = msgspec.json.Encoder()


def _json(obj: Any) -> Response:
    return Response(_encoder.encode(obj), media_type="application/json")


def _conversation(record: StoredConversation) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "conversation",
        "created_at": record.created_at,
        "metadata": record.metadata,
    }




class ConversationsHTTP:
    """The endpoints, reading the key and the body as ``/v1/responses`` does."""

    def __init__(self, http: ResponsesHTTP, conversations: Conversations) -> None:
        self.http = http
        self.conversations = conversations

    def routes(self) -> list[Route]:
        one = "/v1/conversations/{conversation_id}"
        return [
            Route("/v1/conversations", self.create, methods=["POST"]),
            Route(one, self.retrieve, methods=["GET"]),
            Route(one, self.update, methods=["POST"]),
            Route(one, self.delete, methods=["DELETE"]),
            Route(f"{one}/items", self.create_items, methods=["POST"]),
            Route(f"{one}/items", self.list_items, methods=["GET"]),
            Route(f"{one}/items/{{item_id}}", self.retrieve_item, methods=["GET"]),
            Route(f"{one}/items/{{item_id}}", self.delete_item, methods=["DELETE"]),
        ]

    async def create(self, request: Request) -> Response:
        try:
            owner = self.http.owner(request)
            items, metadata = decode_conversation_body(await self.http.read_body(request))
            record = await self.conversations.create(owner, items, metadata)
        except ProtocolError as error:
            return http_error(error)
        return _json(_conversation(record))

    async def retrieve(self, request: Request) -> Response:
        try:
            owner = self.http.owner(request)
            record = await self.conversations.get(request.path_params["conversation_id"], owner)
        except ProtocolError as error:
            return http_error(error)
        return _json(_conversation(record))

    async def update(self, request: Request) -> Response:
        try:
            owner = self.http.owner(request)
            items, metadata = decode_conversation_body(await self.http.read_body(request))
            if items:
                raise RemoteProtocolError(
                    "Unknown parameter: 'items' (add items with POST .../items).",
                    code=ErrorCode.UNKNOWN_PARAMETER,
                    param="items",
                )
            conversation_id = request.path_params["conversation_id"]
            record = await self.conversations.update(conversation_id, owner, metadata)
        except ProtocolError as error:
            return http_error(error)
        return _json(_conversation(record))

    async def delete(self, request: Request) -> Response:
        conversation_id = request.path_params["conversation_id"]
        try:
            await self.conversations.delete(conversation_id, self.http.owner(request))
        except ProtocolError as error:
            return http_error(error)
        return _json({"id": conversation_id, "object": "conversation.deleted", "deleted": True})

    async def create_items(self, request: Request) -> Response:
        try:
            owner = self.http.owner(request)
            items, metadata = decode_conversation_body(await self.http.read_body(request))
            if metadata is not None:
                raise RemoteProtocolError(
                    "Unknown parameter: 'metadata'.",
                    code=ErrorCode.UNKNOWN_PARAMETER,
                    param="metadata",
                )
            conversation_id = request.path_params["conversation_id"]
            added = await self.conversations.append(conversation_id, owner, items)
        except ProtocolError as error:
            return http_error(error)
        return _json(page(added, has_more=False))

    async def list_items(self, request: Request) -> Response:
        query = request.query_params
        try:
            owner = self.http.owner(request)
            limit, order = list_query(query)
            record = await self.conversations.get(request.path_params["conversation_id"], owner)
            items = record.items if order == "asc" else record.items[::-1]
            where = f"conversation '{RemoteProtocolError.clip(record.id)}'"
            items = past(items, query.get("after"), noun="item", where=where)
        except ProtocolError as error:
            return http_error(error)
        return _json(page(items[:limit], has_more=len(items) > limit))

    async def retrieve_item(self, request: Request) -> Response:
        wanted = request.path_params["item_id"]
        try:
            owner = self.http.owner(request)
            record = await self.conversations.get(request.path_params["conversation_id"], owner)
            found = [item for item in record.items if item_id(item) == wanted]
            if not found:
                raise item_not_found(wanted)
        except ProtocolError as error:
            return http_error(error)
        return _json(found[0])

    async def delete_item(self, request: Request) -> Response:
        try:
            owner = self.http.owner(request)
            record = await self.conversations.delete_item(
                request.path_params["conversation_id"], owner, request.path_params["item_id"]
            )
        except ProtocolError as error:
            return http_error(error)
        return _json(_conversation(record))


