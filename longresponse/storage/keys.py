"""API keys and ownership.

With keys configured (``--api-key``, repeatable, or ``LONGRESPONSE_API_KEYS``,
comma-separated), every HTTP request and every WebSocket upgrade must carry
``Authorization: Bearer <key>``; anything else gets a 401 before any state is
created. Each key owns what it stores: an ``owner`` is a digest of the key, so
keys are never written to the store. Without keys, everything has the owner
``""`` and the server refuses to listen beyond loopback unless told to.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["API_KEYS_ENV", "ApiKeys", "Unauthorized", "is_loopback"]

API_KEYS_ENV: Final = "LONGRESPONSE_API_KEYS"


class Unauthorized(Exception):
    """The request has no valid API key."""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class ApiKeys:
    """The accepted keys; maps a request's ``Authorization`` header to its owner."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._owners = {key: _digest(key) for key in keys if key}

    @classmethod
    def from_env(
        cls, extra: Iterable[str] = (), environ: Mapping[str, str] = os.environ
    ) -> ApiKeys:
        keys = [k.strip() for k in environ.get(API_KEYS_ENV, "").split(",")]
        return cls([*extra, *keys])

    @property
    def enabled(self) -> bool:
        return bool(self._owners)

    def owner(self, authorization: str | None) -> str:
        """The owner for an ``Authorization`` header value.

        Raises :class:`Unauthorized` when keys are configured and the header
        does not carry one of them.
        """
        if not self._owners:
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer":
            token = token.strip()
            for key, owner in self._owners.items():
                if hmac.compare_digest(key.encode(), token.encode()):
                    return owner
        raise Unauthorized("Incorrect API key provided.")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
