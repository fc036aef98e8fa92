"""The HTTP path's process-wide token cache (``--http-token-cache``, on by default).

Response id → what its rollout held when it ended: the rendered tokens of its
conversation's items (not the prefix), the prefix they were read under, and the
model that read them; within a byte budget (``--http-token-cache-bytes``),
least recently used first out, per owner. A continuation whose parent is here
still reads its history from the store but does not render or tokenize it
again, and, when it keeps the parent's model, instructions and tools, reports
what the parent's rollout had processed as ``cached_tokens`` (the same
accounting as a WebSocket chain). An entry is found only under the owner that
put it: no key reads another's.
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.items import Compaction, Item

from ...config import ServerConfig
from ...engine.rollout import Rollout

__all__ = ["HTTPTokenCache", "HTTPTokenCacheEntry"]


@dataclass(frozen=True, slots=True)
class HTTPTokenCacheEntry:
    """One finished response's rollout: its ``prefix`` tokens (instructions and
    tools), its ``items`` tokens after it, and the ``model`` that read them."""

    model: str
    prefix: array[int]
    items: array[int]

    @property
    def nbytes(self) -> int:
        return (len(self.prefix) + len(self.items)) * self.items.itemsize


class HTTPTokenCache:
    """The process-wide token cache of the HTTP path (``--http-token-cache``).

    Response id → its :class:`HTTPTokenCacheEntry`, within ``budget_bytes``,
    least recently used first out. Keys are per owner: :meth:`get` finds only
    what the same owner :meth:`put`.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[tuple[str, str], HTTPTokenCacheEntry] = (
            collections.OrderedDict()
        )
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    @classmethod
    def configured(cls, config: ServerConfig) -> HTTPTokenCache | None:
        """The cache ``config`` asks for: None with ``--no-http-token-cache``."""
        return cls(config.http_token_cache_bytes) if config.http_token_cache else None

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, owner: str, response_id: str) -> HTTPTokenCacheEntry | None:
        entry = self._entries.get((owner, response_id))
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end((owner, response_id))
        return entry

    def put(self, owner: str, response_id: str, entry: HTTPTokenCacheEntry) -> None:
        """Keep ``entry``; the least recently used go until the budget holds (an
        entry larger than the whole budget is not kept)."""
        if entry.nbytes > self.budget_bytes:
            return
        old = self._entries.pop((owner, response_id), None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[(owner, response_id)] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes

    def seed(
        self, rollout: Rollout, *, owner: str, parent: str | None, history: Sequence[Item]
    ) -> Sequence[Item]:
        """A fresh ``rollout`` continuing ``parent`` (``owner``'s) takes ``history`` in
        from the parent's tokens when they are here, nothing rendered again
        (``Rollout.seed``: cached only when the model and prefix are its own);
        the history still to render: none then, all of it otherwise."""
        if parent is None or not history:
            return history
        if any(isinstance(item, Compaction) for item in history):
            return history  # the rollout's context is the compaction's window, not the items
        entry = self.get(owner, parent)
        if entry is None:
            return history
        rollout.seed(history, entry.items, prefix=entry.prefix, model=entry.model)
        return []

    def keep(self, rollout: Rollout, *, owner: str, response_id: str) -> None:
        """Keep what ``rollout`` holds at the end of ``owner``'s response
        ``response_id`` (not when it was cut to the window: its context is then
        not the stored conversation)."""
        if rollout.truncated:
            return
        tokens = rollout.tokens
        entry = HTTPTokenCacheEntry(
            model=rollout.model.name,
            prefix=tokens.tokens[: tokens.prefix_length],
            items=tokens.tokens[tokens.prefix_length :],
        )
        self.put(owner, response_id, entry)
