"""The shipped shape's connection cache: segment id → (Rollout, Boundary).

Theory of operation
-------------------
Each shipped Response is one segment of a :class:`Rollout`; a continuation
names its parent by ``previous_response_id``, and where the parent is found
here decides whether the turn continues in place or forks
(``longresponse.serve.continuation``). The cache holds every segment id of
the connection's Rollouts within a byte budget (``connection_cache_bytes``),
least recently used Rollout first out. A Rollout dropped (over budget,
evicted after a failed continuation, or the connection closing) is kept in
a list until its owner takes it (:meth:`SegmentCache.take_dropped`) to
release its sampler: only a Rollout no segment runs any more can be closed.
"""

from __future__ import annotations

import collections

from ...engine.rollout import Boundary, Rollout

__all__ = ["SegmentCache"]


class SegmentCache:
    """Segment id → (Rollout, Boundary), within a byte budget (LRU by Rollout).

    The size is a running total: each Rollout counts as large as it was when
    it last added a boundary (it grows only by running a turn, which adds one).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._segments: dict[str, tuple[Rollout, Boundary]] = {}
        self._rollouts: collections.OrderedDict[int, tuple[Rollout, list[str]]] = (
            collections.OrderedDict()
        )
        self._sizes: dict[int, int] = {}  # id(Rollout) → its nbytes at its last add
        self.nbytes = 0
        self.evictions = 0
        #: Rollouts no longer cached, whose samplers are yet to be released.
        self._dropped: list[Rollout] = []

    def __len__(self) -> int:
        return len(self._segments)

    @property
    def rollouts(self) -> list[Rollout]:
        """The Rollouts cached, least recently used first (a new list)."""
        return [rollout for rollout, _ in self._rollouts.values()]

    def lookup(self, segment_id: str) -> tuple[Rollout, Boundary] | None:
        found = self._segments.get(segment_id)
        if found is not None:
            self._rollouts.move_to_end(id(found[0]))
        return found

    def add(self, rollout: Rollout, boundary: Boundary) -> None:
        self._segments[boundary.segment_id] = (rollout, boundary)
        entry = self._rollouts.get(id(rollout))
        if entry is None:
            self._rollouts[id(rollout)] = (rollout, [boundary.segment_id])
        else:
            entry[1].append(boundary.segment_id)
            self._rollouts.move_to_end(id(rollout))
        size = rollout.nbytes
        self.nbytes += size - self._sizes.get(id(rollout), 0)
        self._sizes[id(rollout)] = size
        self._enforce_budget(keep=rollout)

    def evict(self, segment_id: str) -> None:
        """Forget one segment id (its Rollout stays while other ids name it)."""
        found = self._segments.pop(segment_id, None)
        if found is None:
            return
        rollout = found[0]
        entry = self._rollouts.get(id(rollout))
        if entry is not None:
            entry[1].remove(segment_id)
            if not entry[1]:
                self.drop_rollout(rollout)

    def drop_rollout(self, rollout: Rollout) -> None:
        entry = self._rollouts.pop(id(rollout), None)
        if entry is not None:
            self.nbytes -= self._sizes.pop(id(rollout), 0)
            for segment_id in entry[1]:
                self._segments.pop(segment_id, None)
            self._dropped.append(rollout)

    def take_dropped(self) -> list[Rollout]:
        """The Rollouts dropped since the last call, whose samplers are yet to be
        released (the caller releases them); forgotten here."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def clear(self) -> None:
        """Forget every segment (the connection is closing)."""
        for rollout, _ in list(self._rollouts.values()):
            self.drop_rollout(rollout)

    def _enforce_budget(self, keep: Rollout) -> None:
        while self.nbytes > self.budget_bytes and len(self._rollouts) > 1:
            oldest_key = next(iter(self._rollouts))
            rollout, _ = self._rollouts[oldest_key]
            if rollout is keep:
                break
            self.drop_rollout(rollout)
            self.evictions += 1
