"""API keys and ownership.

With keys configured (``--api-key``, repeatable, or ``LONGRESPONSE_API_KEYS``,
comma-separated), every HTTP request and every WebSocket upgrade must carry
``Authorization: Bearer <key>``; anything else gets a 401 before any state is
created. Each key owns what it stores: an ``owner`` is a digest of the key, so
keys are never written to the store. Without keys, everything has the owner
``""`` and the server refuses to listen beyond loopback unless told to.

The operator key (``--operator-key`` or ``LONGRESPONSE_OPERATOR_KEY``) is an
accepted key with an owner of its own, and the one key that may read what
concerns every tenant: the whole inspector and ``/metrics``
(:meth:`ApiKeys.viewer`). Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["API_KEYS_ENV", "OPERATOR_KEY_ENV", "ApiKeys", "Unauthorized", "is_loopback"]

API_KEYS_ENV: Final = "LONGRESPONSE_API_KEYS"
#: The environment variable that may hold the operator key (module docstring).
OPERATOR_KEY_ENV: Final = "LONGRESPONSE_OPERATOR_KEY"


class Unauthorized(Exception):
    """The request has no valid API key."""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class ApiKeys:
    """The accepted keys; maps a request's ``Authorization`` header to its owner."""

    def __init__(self, keys: Iterable[str] = (), operator: str | None = None) -> None:
        self._owners = {key: _digest(key) for key in keys if key}
        #: The operator key's owner (None: no operator key).
        self.operator: str | None = None
        if operator:
            self.operator = self._owners[operator] = _digest(operator)

    @classmethod
    def from_env(
        cls,
        extra: Iterable[str] = (),
        environ: Mapping[str, str] = os.environ,
        *,
        operator: str | None = None,
    ) -> ApiKeys:
        keys = [k.strip() for k in environ.get(API_KEYS_ENV, "").split(",")]
        return cls([*extra, *keys], operator or environ.get(OPERATOR_KEY_ENV, "").strip())

    def viewer(self, owner: str) -> str | None:
        """Whose records ``owner`` may read where every tenant's are kept (the
        inspector, ``/metrics``): its own (``owner``), or everyone's (``None``) for
        the operator key and when keys are off."""
        if not self._owners or owner == self.operator:
            return None
        return owner

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
