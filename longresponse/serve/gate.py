"""The gate in front of every route: what is not there, who may ask, which method.

Theory of operation
-------------------
A pure ASGI layer around the app (no ``BaseHTTPMiddleware``). For each HTTP
request it matches the path against the app's own routes, in this order:

1. no route has the path: **404**, ``code: "unknown_url"``, whoever asks;
2. with API keys on, a request without a valid ``Authorization: Bearer`` key:
   **401**, ``code: "invalid_api_key"``, on every known route (``/v1/models``,
   ``/metrics`` and ``/healthz`` included), before the route runs; under
   ``/inspect`` only, the key may come as ``?key=`` instead (a browser's page
   load and ``EventSource`` cannot set a header; the query is read once,
   percent-decoded, by :func:`authorization`); a valid key other than the
   operator's asking for ``/metrics`` (every tenant's counters): **403**,
   ``code: "operator_key_required"``. The inspector's routes show a tenant
   only its own records (:func:`viewer`);
3. the path is known but not with this method: **405**,
   ``code: "method_not_allowed"``, with an ``Allow`` header listing the
   methods it has;
4. otherwise the route runs.

A request let through carries its key's owner in the scope
(:data:`OWNER_KEY`, ``""`` with keys off), for the routes that count per key.

All three answers are the shipped HTTP error envelope (``message``, ``type``,
``param``, ``code``). A WebSocket upgrade to a path with no WebSocket route
gets the same 404, sent as the upgrade's HTTP response where the server
supports that (uvicorn does), else a refused upgrade. A known WebSocket path
checks its key itself (``longresponse.serve.ws.session``), so the 401 comes before
any state exists there too.
"""

from __future__ import annotations

import logging
import re
from typing import Final
from urllib.parse import unquote_plus

from starlette.datastructures import Headers, QueryParams
from starlette.routing import BaseRoute, Match, Route, Router

from protocol import RemoteProtocolError

from ..storage.keys import ApiKeys, Unauthorized
from .errors import http_error, log_refusal
from .request_ids import request_id
from .types import ASGIApp, Receive, Scope, Send

__all__ = [
    "INSPECT_PREFIX",
    "METHOD_NOT_ALLOWED",
    "OPERATOR_KEY_REQUIRED",
    "OPERATOR_PATHS",
    "OWNER_KEY",
    "UNKNOWN_URL",
    "RedactQueryKey",
    "RouteGate",
    "authorization",
    "owner_of",
    "redact_access_log",
    "redact_query_key",
    "viewer",
]

#: ``error.code`` of a path the server does not have.
UNKNOWN_URL: Final = "unknown_url"
#: ``error.code`` of a known path asked with a method it does not take.
METHOD_NOT_ALLOWED: Final = "method_not_allowed"
#: The inspector's paths, where the key may also come as the query's ``key``.
INSPECT_PREFIX: Final = "/inspect"
#: Where the scope of a request let through carries its key's owner.
OWNER_KEY: Final = "longresponse.owner"
#: The query parameter that carries the key under :data:`INSPECT_PREFIX`.
QUERY_KEY: Final = "key"
#: ``error.code`` (403) of a tenant's key on a path for the operator key only.
OPERATOR_KEY_REQUIRED: Final = "operator_key_required"
#: Paths for the operator key only, when keys are on: every tenant's figures.
OPERATOR_PATHS: Final = frozenset({"/metrics"})
#: One query parameter as it stands in a raw query string: name, ``=``, value.
_QUERY_PARAM: Final = re.compile(r"(?<=[?&])([^=&\s\"#]*)=([^&\s\"#]*)")
#: Percent-decodings tried on a parameter's name before the redaction gives up
#: decoding and redacts (``%25`` nests).
_DECODINGS: Final = 4


def _names_key(name: str) -> bool:
    """Whether a raw query parameter name is, or decodes to, ``key`` (any case)."""
    for _ in range(_DECODINGS):
        if name.strip().lower() == QUERY_KEY:
            return True
        decoded = unquote_plus(name)
        if decoded == name:
            return False
        name = decoded
    return True  # still encoded after all that: redacted, to be sure


def redact_query_key(text: str) -> str:
    """``text`` with the value of every query parameter whose name decodes to
    ``key`` replaced by ``[redacted]`` (``?%6Bey=`` and ``?k%65y=`` included)."""
    if "=" not in text:
        return text
    return _QUERY_PARAM.sub(
        lambda m: f"{m[1]}=[redacted]" if _names_key(m[1]) else m[0], text
    )


class RedactQueryKey(logging.Filter):
    """Cuts a query's ``key`` out of log lines (uvicorn's access log prints the
    path with its raw query, and the inspector's page carries its key there),
    whatever its encoding (:func:`redact_query_key`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_query_key(arg) if isinstance(arg, str) else arg for arg in record.args
            )
        elif isinstance(record.msg, str):
            record.msg = redact_query_key(record.msg)
        return True


_REDACT: Final = RedactQueryKey()


def redact_access_log() -> None:
    """Keep API keys given as ``?key=`` out of uvicorn's access log (once per process)."""
    access = logging.getLogger("uvicorn.access")
    if _REDACT not in access.filters:
        access.addFilter(_REDACT)


class RouteGate:
    """404 / 401 / 405 in the shipped envelope, before any route runs (module docstring)."""

    def __init__(self, app: ASGIApp, *, router: Router, keys: ApiKeys) -> None:
        self.app = app
        self.router = router
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        elif scope["type"] == "websocket" and not self._matches(scope):
            await self._refuse_upgrade(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _matches(self, scope: Scope) -> list[tuple[Match, BaseRoute]]:
        matched: list[tuple[Match, BaseRoute]] = []
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                matched.append((match, route))
        return matched

    def _refusal(self, scope: Scope) -> ASGIApp | None:
        """The error answer for this request, or ``None`` to let it through."""
        matched = self._matches(scope)
        method, path = scope["method"], scope["path"]
        if not matched:
            return http_error(
                RemoteProtocolError(
                    f"Invalid URL ({method} {path}).", code=UNKNOWN_URL, status=404
                )
            )
        scope[OWNER_KEY] = ""
        if self.keys.enabled:
            try:
                owner = self.keys.owner(authorization(scope))
                scope[OWNER_KEY] = owner
            except Unauthorized as exc:
                return http_error(
                    RemoteProtocolError(str(exc), code="invalid_api_key", status=401)
                )
            if path in OPERATOR_PATHS and self.keys.viewer(owner) is not None:
                return http_error(
                    RemoteProtocolError(
                        f"{path} shows every tenant's figures: only the operator key "
                        "(--operator-key) may read it.",
                        code=OPERATOR_KEY_REQUIRED,
                        status=403,
                    )
                )
        # A literal path (``/v1/responses/compact``) is that route's, even where a
        # parameter route (``/v1/responses/{response_id}``) would take the method.
        literal = [
            route
            for match, route in matched
            if isinstance(route, Route) and not route.param_convertors
        ]
        if literal and not any(m is Match.FULL for m, r in matched if r in literal):
            matched = [(Match.PARTIAL, route) for route in literal]
        elif any(match is Match.FULL for match, _ in matched):
            return None
        allowed = sorted(
            {m for _, route in matched if isinstance(route, Route) for m in route.methods or ()}
        )
        response = http_error(
            RemoteProtocolError(
                f"Method {method} is not allowed on {path}; use {', '.join(allowed)}.",
                code=METHOD_NOT_ALLOWED,
                status=405,
            )
        )
        response.headers["allow"] = ", ".join(allowed)
        return response

    async def _refuse_upgrade(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":  # pragma: no cover - ASGI contract
            return
        if "websocket.http.response" not in scope.get("extensions", {}):  # pragma: no cover
            await send({"type": "websocket.close", "code": 1008})
            return
        response = http_error(
            RemoteProtocolError(
                f"Invalid URL (WebSocket {scope['path']}).", code=UNKNOWN_URL, status=404
            )
        )
        log_refusal(f"WebSocket {scope['path']}", response.error, request_id(scope))
        await send(
            {
                "type": "websocket.http.response.start",
                "status": response.status_code,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "websocket.http.response.body", "body": response.body})


def authorization(scope: Scope) -> str | None:
    """The request's ``Authorization``; under ``/inspect``, else ``?key=`` as a bearer.

    The one place the query's key is read: parameter names and values are
    percent-decoded once (``?%6Bey=K`` is ``?key=K``), as every other reader of
    the query decodes them, so an encoding authenticates exactly as the key
    itself; the access log redacts every such spelling (:func:`redact_query_key`).
    """
    header = Headers(scope=scope).get("authorization")
    path = scope["path"]
    if header is None and (path == INSPECT_PREFIX or path.startswith(f"{INSPECT_PREFIX}/")):
        key = QueryParams(scope["query_string"]).get(QUERY_KEY)
        if key:
            return f"Bearer {key}"
    return header


def viewer(scope: Scope, keys: ApiKeys) -> str | None:
    """Whose records this request may read where every tenant's are kept: its key's
    owner, or ``None`` (everyone's) for the operator key and with keys off.

    Raises :class:`Unauthorized` without a valid key (the gate has answered 401
    before any route runs, so a route does not meet it).
    """
    return keys.viewer(owner_of(scope, keys))


def owner_of(scope: Scope, keys: ApiKeys) -> str:
    """The owner of the request's key: the one the gate found (:data:`OWNER_KEY`),
    or, for a request that did not pass the gate, found now. Raises
    :class:`Unauthorized` without a valid key."""
    owner = scope.get(OWNER_KEY)
    if isinstance(owner, str):
        return owner
    written = authorization(scope)
    return keys.owner(written)
