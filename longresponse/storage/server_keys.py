"""The server's compaction key: configured, or made once and kept in the store.

Compaction items are sealed with one key per deployment, so that every
process behind one store opens every other's items and a restart keeps them
valid. Where it comes from, first match wins:

1. ``--compaction-key SECRET``, or the environment variable
   :data:`COMPACTION_KEY_ENV`: a secret of any length, from which the engine
   derives the AES key (``CompactionKey.derive``). Give every process the same
   secret; changing it makes earlier compaction items fail to open.
2. Otherwise :data:`KEY_BYTES` random bytes, made by the first process that
   needs them and kept in the store under :data:`COMPACTION_SECRET`
   (``ResponseStore.secret``: first writer wins, never expires). With
   SQLite or Redis every process on that store reads the same key, and it
   survives restarts; with ``memory://`` the key is the process's own and dies
   with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from .records import ResponseStore

__all__ = [
    "COMPACTION_KEY_ENV",
    "COMPACTION_SECRET",
    "KEY_BYTES",
    "configured_compaction_secret",
    "stored_compaction_key",
]

#: The environment variable holding the compaction secret (like ``--compaction-key``).
COMPACTION_KEY_ENV: Final = "LONGRESPONSE_COMPACTION_KEY"
#: The name the generated key is kept under in the store.
COMPACTION_SECRET: Final = "compaction-key"
#: Bytes of a generated key (AES-256).
KEY_BYTES: Final = 32


def configured_compaction_secret(
    flag: str | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The configured secret: the flag's, else the environment's; ``None`` if neither."""
    return flag or environ.get(COMPACTION_KEY_ENV) or None


async def stored_compaction_key(store: ResponseStore) -> bytes:
    """The key kept in ``store``, made now if there is none. Raises ``StoreError``."""
    return await store.secret(COMPACTION_SECRET, os.urandom(KEY_BYTES))
