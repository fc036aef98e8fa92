"""The HTTP path's optional process-wide token cache (``--http-token-cache``).

Response id → the rendered tokens of its conversation's items (not the
prefix), within a byte budget, least recently used first out, per owner. A
continuation whose parent is here still reads its history from the store but
does not render or tokenize it again: the ``http-cached`` design the
benchmark compares.
"""

from __future__ import annotations

import collections
from array import array

__all__ = ["HTTPTokenCache"]


class HTTPTokenCache:
    """The optional process-wide token cache of the HTTP path (``--http-token-cache``).

    Response id → the rendered tokens of its conversation's items (not the
    prefix), within a byte budget, least recently used first out. A
    continuation whose parent is here still reads its history from the store
    but does not render or tokenize it again. Keys are per owner.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[tuple[str, str], array[int]] = (
            collections.OrderedDict()
        )
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, owner: str, response_id: str) -> array[int] | None:
        tokens = self._entries.get((owner, response_id))
        if tokens is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end((owner, response_id))
        return tokens

    def put(self, owner: str, response_id: str, tokens: array[int]) -> None:
        size = len(tokens) * tokens.itemsize
        if size > self.budget_bytes:
            return
        self._entries[(owner, response_id)] = tokens
        self.nbytes += size
        while self.nbytes > self.budget_bytes:
            _, old = self._entries.popitem(last=False)
            self.nbytes -= len(old) * old.itemsize
