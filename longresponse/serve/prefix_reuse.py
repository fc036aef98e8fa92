"""Prefix reuse: a turn whose input begins with a conversation seen recently costs only what is new.

Theory of operation
-------------------
Many clients resend the whole conversation with every request (the AI SDK,
Cline, the Agents SDKs within a run) and never chain; a chained HTTP request
reads its history back from the store. Either way a fresh rollout would
render, tokenize and classify the whole history again. This cache, one per
server and shared by every transport and connection, remembers the
conversations its rollouts held at the end of each turn, so that a fresh
rollout whose input (history first, then the new input) begins with one of
them takes that part in as it was: its tokens, nothing rendered or read
again.

- **Keys.** An item is known by :func:`~longresponse.engine.render.item_key`:
  a digest of its kind and of the segment its tokens are made from, so ids,
  statuses and other fields that render nothing do not matter (the AI SDK
  sends an output message back in another shape than it came). A
  conversation's first ``n`` items are known by a chain of those digests,
  ``d_n = sha256(d_{n-1} + key_n)``, seeded with the API key's owner: one
  key's lookups never find another key's conversations, so neither the
  answer nor its timing tells a key anything of another's. A compaction item
  ends a chain (what it seals does not show in its segment).
- **Marks.** At the end of each turn (:meth:`PrefixReuse.keep`, from the
  turn's timing hook, on every transport) the rollout's context is marked:
  its chain digest names the rollout's token array and the model reading it,
  how many item tokens the context spans, and how many of them that model
  has processed. A rollout's chain digests are kept beside it (a weak map),
  so a turn hashes only the items it added.
- **Lookup.** :meth:`PrefixReuse.find` hashes a request's items and takes the
  longest marked prefix: the known items and a copy of their tokens
  (:class:`~longresponse.engine.boundary.KnownPrefix`). The turn then
  validates every item (cheap), and classifies, renders and tokenizes only
  the rest. What was processed counts as ``cached_tokens`` when the model
  and the instructions and tools are the same, as for a WebSocket chain, and
  the turn keeps the conversation's affinity key (a real engine's slot).
- **Memory.** A rollout's token array is shared with its marks, never
  copied: it only grows at its end, so a marked length stays true. A rollout
  seeded from a mark takes over the marks of the array it came from that it
  covers, so a conversation resent turn after turn holds one array, not one
  per turn. The budget (``--prefix-reuse-bytes``) counts what each array
  takes (its allocation as last marked, and :data:`HELD_BYTES` for holding
  it) and :data:`MARK_BYTES` per mark; arrays go least recently used first,
  with their marks.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import sys
import weakref
from array import array
from collections.abc import Iterator, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.items import Item

from ..config import ServerConfig
from ..engine.boundary import KnownPrefix
from ..engine.render import item_key
from ..engine.rollout import Rollout

__all__ = ["HELD_BYTES", "MARK_BYTES", "Found", "PrefixReuse", "PrefixReuseCounters"]

#: What one mark costs beside the tokens (its dict entry, digest and record;
#: measured with tracemalloc over 100,000 marks, CPython 3.11).
MARK_BYTES: Final = 240
#: What one held array costs beside its allocation and its marks (its holder,
#: the holder's entry in the cache and dict of marks, its chain id; measured
#: with tracemalloc over short conversations, CPython 3.11).
HELD_BYTES: Final = 512
_DIGEST_BYTES: Final = 16


class _Tokens:
    """One rollout's token array as the cache holds it, read by ``model``, with
    the marks it names."""

    __slots__ = (
        "allocated",
        "chain",
        "charged",
        "flagged",
        "marks",
        "model",
        "prefix_length",
        "tokens",
    )

    def __init__(self, tokens: array[int], prefix_length: int, model: str, chain: str) -> None:
        self.tokens = tokens
        self.prefix_length = prefix_length
        self.model = model
        self.chain = chain
        self.marks: dict[bytes, _Mark] = {}
        #: Bytes the array took when last marked (its header and room to grow too).
        self.allocated = 0
        #: Bytes charged to the budget for it now.
        self.charged = 0
        #: The secrets classifier found something in the conversation: its items
        #: are read again when reused, so that each Response flags what it holds.
        self.flagged = False

    @property
    def nbytes(self) -> int:
        return self.allocated + HELD_BYTES + MARK_BYTES * len(self.marks)

    def flag(self, found: bool) -> None:
        """The conversation holds what the classifier flags (once true, it stays)."""
        self.flagged = self.flagged or found

    def count(self) -> None:
        """Measure the array as it is now (a live one grows between two marks)."""
        self.allocated = sys.getsizeof(self.tokens)

    def take(self, tokens: array[int], prefix_length: int, model: str, chain: str) -> None:
        """Hold ``tokens`` instead: a longer array whose item tokens begin with
        those of every mark held (a rollout seeded from them)."""
        self.tokens, self.prefix_length, self.model, self.chain = (
            tokens,
            prefix_length,
            model,
            chain,
        )

    def recharge(self) -> int:
        """Charge what it takes now; the change since it was last charged."""
        change, self.charged = self.nbytes - self.charged, self.nbytes
        return change

    def let_go(self) -> tuple[int, dict[bytes, _Mark]]:
        """It leaves the cache: what it was charged and the marks it named."""
        charged, marks = self.charged, self.marks
        self.charged, self.marks = 0, {}
        return charged, marks


@dataclasses.dataclass(frozen=True, slots=True)
class _Mark:
    """A conversation's first ``items`` items: ``item_tokens`` tokens of ``held``
    after its prefix, of which the model processed ``seen``."""

    held: _Tokens
    items: int
    item_tokens: int
    seen: int


class _Chain:
    """A rollout's context as last hashed: its items (the objects) and the chain
    digest after each, up to the first that has no key; the mark it was seeded
    from, and the array the cache holds for it."""

    __slots__ = ("digests", "held", "items", "seeded")

    def __init__(
        self, items: list[Item], digests: list[bytes], seeded: _Mark | None = None
    ) -> None:
        self.items = items
        self.digests = digests
        self.seeded = seeded
        self.held: _Tokens | None = None

    def extend(self, seed: bytes, context: list[Item]) -> None:
        """Hash what ``context`` (which begins with :attr:`items`) added."""
        if len(self.digests) == len(self.items):  # no item without a key yet
            self.digests = _extend_chain(seed, self.digests, context[len(self.items) :])
        self.items = list(context)

    def hold(self, held: _Tokens) -> None:
        self.held = held

    def take_seeded(self) -> _Mark | None:
        """The mark it was seeded from, once: its first mark takes it over."""
        seeded, self.seeded = self.seeded, None
        return seeded


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """A lookup's answer: the known prefix, and the chain digests of the items it
    hashed (handed to :meth:`PrefixReuse.seeded` with the rollout it seeds)."""

    known: KnownPrefix
    mark: _Mark
    items: list[Item]
    digests: list[bytes]


class PrefixReuse:
    """The server's known conversations (see the module docstring)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._marks: dict[bytes, _Mark] = {}
        #: The arrays held, least recently used first (keyed by identity).
        self._held: collections.OrderedDict[int, _Tokens] = collections.OrderedDict()
        self._chains: weakref.WeakKeyDictionary[Rollout, _Chain] = weakref.WeakKeyDictionary()
        self.nbytes = 0
        #: Counters (``/metrics`` and tests): lookups, those that found a prefix,
        #: the items they found, and arrays let go for room.
        self.lookups = 0
        self.hits = 0
        self.items_found = 0
        self.evictions = 0

    @classmethod
    def configured(cls, config: ServerConfig) -> PrefixReuse | None:
        """The cache ``config`` asks for: None with ``--no-prefix-reuse``."""
        return cls(config.prefix_reuse_bytes) if config.prefix_reuse else None

    def __len__(self) -> int:
        """Marks held."""
        return len(self._marks)

    # --- lookup -------------------------------------------------------------------

    def find(self, owner: str, items: Sequence[Item]) -> Found | None:
        """The longest prefix of ``items`` (a fresh rollout's history then input)
        that ``owner`` had in a rollout's context at the end of a turn: its items
        and tokens, or None. At least one item is left to the turn."""
        self.lookups += 1
        # The last item is left to the turn whatever is known: it is not hashed.
        digests = _extend_chain(_seed(owner), (), items[:-1])
        for count in range(len(digests), 0, -1):
            mark = self._marks.get(digests[count - 1])
            if mark is None:
                continue
            held = mark.held
            self._held.move_to_end(id(held))
            start = held.prefix_length
            known = KnownPrefix(
                items=count,
                tokens=held.tokens[start : start + mark.item_tokens],
                prefix=held.tokens[:start],
                model=held.model,
                seen=mark.seen,
                chain=held.chain,
                classified=not held.flagged,
            )
            self.hits += 1
            self.items_found += count
            return Found(known, mark, list(items[:count]), digests[:count])
        return None

    def seeded(self, rollout: Rollout, found: Found) -> None:
        """``rollout`` took ``found``'s prefix in: its chain starts from the digests
        already computed, and its first mark takes over those it covers."""
        self._chains[rollout] = _Chain(list(found.items), list(found.digests), found.mark)

    # --- marks ----------------------------------------------------------------------

    def keep(self, rollout: Rollout, *, owner: str) -> None:
        """Mark ``rollout``'s context as it is at the end of a turn (not when it
        was cut to the window: its context is then not the client's; nor when
        its tokens are behind its context, a turn cut off while it took its input in)."""
        if rollout.truncated or not rollout.tokens_match_context:
            return
        context = rollout.context
        chain = self._chains.get(rollout)
        if chain is None or not _still_holds(chain.items, context):
            chain = _Chain([], [])
            self._chains[rollout] = chain
        chain.extend(_seed(owner), context)
        if not context or len(chain.digests) < len(context):
            return
        tokens = rollout.tokens
        live, start = tokens.tokens, tokens.prefix_length
        held = chain.held
        # A new holder when the array was replaced, or when another model reads
        # it now (switched in place): the marks held so far say what the model
        # that read them processed, and stay its.
        if (
            held is None
            or held.tokens is not live
            or held.model != rollout.model.name
            or self._held.get(id(held)) is not held
        ):
            held = self._hold(rollout, chain.take_seeded())
            chain.hold(held)
        seen = max(0, rollout.model_seen - start)
        self._mark(chain.digests[-1], _Mark(held, len(context), len(live) - start, seen))
        held.flag(any(rollout.verdicts))
        held.count()
        self._charge(held)
        self._held.move_to_end(id(held))
        self._make_room()

    def _mark(self, digest: bytes, mark: _Mark) -> None:
        old = self._marks.get(digest)
        if old is not None and old.held is not mark.held:
            self._unmark(digest, old)
        self._marks[digest] = mark
        mark.held.marks[digest] = mark

    def _hold(self, rollout: Rollout, seeded: _Mark | None) -> _Tokens:
        """What holds ``rollout``'s token array from now on. A rollout seeded from
        ``seeded`` begins with its array's item tokens: when that array's marks
        all lie within them (a conversation resent turn after turn), the
        rollout's array takes its place under them, in one step; otherwise a
        new holder takes over the marks it covers."""
        tokens = rollout.tokens
        fresh = (tokens.tokens, tokens.prefix_length, rollout.model.name, rollout.chain)
        old = seeded.held if seeded is not None else None
        if seeded is not None and old is not None and self._held.get(id(old)) is old:
            if all(mark.items <= seeded.items for mark in old.marks.values()):
                old.take(*fresh)
                return old
        held = _Tokens(*fresh)
        self._held[id(held)] = held
        if seeded is not None:
            self._adopt(seeded, held)
        return held

    def _adopt(self, seeded: _Mark, held: _Tokens) -> None:
        """``held`` begins with the tokens of ``seeded``: the marks of ``seeded``'s
        array that it covers move to it (the same item tokens at the same offsets
        after its own prefix); an array left with no mark is let go."""
        old = seeded.held
        if old is held or self._held.get(id(old)) is not old:
            return
        for digest, mark in list(old.marks.items()):
            if mark.items <= seeded.items and mark.item_tokens <= seeded.item_tokens:
                del old.marks[digest]
                moved = _Mark(held, mark.items, mark.item_tokens, mark.seen)
                self._marks[digest] = moved
                held.marks[digest] = moved
        self._settle(old)

    def _unmark(self, digest: bytes, mark: _Mark) -> None:
        mark.held.marks.pop(digest, None)
        self._settle(mark.held)

    def _settle(self, held: _Tokens) -> None:
        """``held`` lost marks: charged anew, or let go when none is left."""
        if held.marks:
            self._charge(held)
        else:
            self._drop(held)

    def _charge(self, held: _Tokens) -> None:
        """Count what ``held`` takes now against the budget."""
        if self._held.get(id(held)) is held:
            self.nbytes += held.recharge()

    def _drop(self, held: _Tokens) -> None:
        if self._held.get(id(held)) is not held:
            return
        del self._held[id(held)]
        charged, marks = held.let_go()
        self.nbytes -= charged
        for digest, mark in marks.items():
            if self._marks.get(digest) is mark:
                del self._marks[digest]

    def _make_room(self) -> None:
        """The least recently used arrays go until the budget holds (the newest
        too, if it alone is over)."""
        while self.nbytes > self.budget_bytes and self._held:
            self._drop(next(iter(self._held.values())))
            self.evictions += 1


class PrefixReuseCounters(Collector):
    """``longresponse_prefix_reuse_*`` on ``/metrics``: lookups, what they found,
    what the cache holds and what it let go for room."""

    def __init__(self, prefixes: PrefixReuse) -> None:
        self.prefixes = prefixes

    def collect(self) -> Iterator[Metric]:
        cache = self.prefixes
        for name, help_text, value in (
            ("lookups", "New rollouts that looked for a known prefix.", cache.lookups),
            ("hits", "Lookups that found one.", cache.hits),
            ("items_found", "Items the hits did not read again.", cache.items_found),
            ("evictions", "Conversations let go for room (least recently used).", cache.evictions),
        ):
            yield CounterMetricFamily(f"longresponse_prefix_reuse_{name}", help_text, value=value)
        yield GaugeMetricFamily(
            "longresponse_prefix_reuse_bytes",
            "Bytes the known conversations take (tokens and marks), of --prefix-reuse-bytes.",
            value=cache.nbytes,
        )
        yield GaugeMetricFamily(
            "longresponse_prefix_reuse_marks", "Conversation ends held.", value=len(cache)
        )


def _seed(owner: str) -> bytes:
    """The first link of ``owner``'s chains."""
    return hashlib.sha256(f"owner\0{owner}".encode()).digest()[:_DIGEST_BYTES]


def _extend_chain(seed: bytes, digests: Sequence[bytes], items: Sequence[Item]) -> list[bytes]:
    """``digests`` (a chain so far, from ``seed``) extended over ``items``, up to the
    first item without a key (:func:`~longresponse.engine.render.item_key`)."""
    chain = list(digests)
    last = chain[-1] if chain else seed
    for item in items:
        key = item_key(item)
        if key is None:
            break
        last = hashlib.sha256(last + key).digest()[:_DIGEST_BYTES]
        chain.append(last)
    return chain


def _still_holds(items: Sequence[Item], context: Sequence[Item]) -> bool:
    """Whether ``context`` still begins with ``items`` (the same objects). A
    rollout's context only grows at its end, loses items from its front (the
    window) or is replaced whole, so its first and last are enough to tell."""
    if len(context) < len(items):
        return False
    if not items:
        return True
    return context[0] is items[0] and context[len(items) - 1] is items[-1]
