"""Rendering conversation items to o200k_base tokens, incrementally.

Theory of operation
-------------------
A rollout's context is a list of *segments*, each rendered with a harmony-like
chat template::

    <|start|>{header}<|message|>{body}<|end|>

The first segment is the prefix (header ``system``: the instructions, then a
``# Tools`` section when tools are offered: hosted tools, which the model is
never offered, render nothing); then one segment per item:

==================== ================================ ==============================
item                 header                           body
==================== ================================ ==============================
Message              its role                         ``item_text(content)``
FunctionCall         ``assistant to=functions.NAME``  its arguments (NAME: ``NS.NAME``
                                                      when it has a namespace)
CustomToolCall       ``assistant to=custom.NAME``     its input
LocalShellCall,      ``assistant to=local_shell``,    its action (operation, actions)
ShellCall, ...       ``shell``, ``apply_patch``,      as compact JSON
                     ``computer``
any tool output      ``tool call_id=CALL_ID``         ``output_text(output)``
Reasoning            ``assistant reasoning``          summary then content texts
Compaction           ``compaction``                   (empty: its summary items follow)
==================== ================================ ==============================

``encrypted_content`` is opaque and renders nothing: a compaction item's
summary joins the context as items of its own, right after it
(``longresponse.engine.compaction``), and renders as they do. The three markers are
single token ids outside the o200k_base regular vocabulary (the ids
o200k_harmony gives them); all header and body text goes through
``encode_ordinary``, so text can never produce a marker id.

Each segment is encoded on its own and BPE never merges across a marker, so
rendering is a homomorphism over the item list::

    tokens(history + new) == tokens(history) + tokens(render(new))

which is what lets :class:`TokenCache` render only the items it has not seen.
The same tokens come from the *full* path, :func:`tokenize_text` applied to
:func:`render_text`, which splits one string on the literal marker strings.
For that path to agree, header and body text must not contain a marker
string, so both paths escape ``"<|"`` in text to ``"<\\u200b|"`` (a zero-width
space between the two characters). The escape is lossy and one-way: rendered
tokens are never decoded back into items.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import warnings
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import msgspec

from protocol.items import (
    ApplyPatchCall,
    ApplyPatchTool,
    CallOutput,
    Compaction,
    ComputerCall,
    ComputerTool,
    ComputerUsePreviewTool,
    CustomTool,
    CustomToolCall,
    FunctionCall,
    FunctionTool,
    Item,
    LocalShellCall,
    LocalShellTool,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    Message,
    NamespaceTool,
    Reasoning,
    ShellCall,
    ShellTool,
    Tool,
    answered_call_id,
    item_text,
    output_text,
)

__all__ = [
    "ENCODING_NAME",
    "END",
    "MESSAGE",
    "START",
    "TokenCache",
    "encode",
    "encode_pieces",
    "item_key",
    "items_to_drop",
    "render_item",
    "render_prefix",
    "render_text",
    "tokenize_text",
]

#: The BPE every text segment is encoded with.
ENCODING_NAME: Final = "o200k_base"

#: ``<|start|>``: opens a segment (o200k_harmony id).
START: Final[int] = 200006
#: ``<|end|>``: closes a segment (o200k_harmony id).
END: Final[int] = 200007
#: ``<|message|>``: separates a segment's header from its body (o200k_harmony id).
MESSAGE: Final[int] = 200008

_MARKERS: Final[dict[str, int]] = {
    "<|start|>": START,
    "<|end|>": END,
    "<|message|>": MESSAGE,
}
_MARKER_SPLIT: Final = re.compile("(" + "|".join(map(re.escape, _MARKERS)) + ")")
_ESCAPE_FROM: Final = "<|"
_ESCAPE_TO: Final = "<\u200b|"

_TOKEN_TYPECODE: Final = "I"


@functools.cache
def _encoding() -> Any:
    # Loaded on first use: importing bpe_openai reads every vocabulary it ships.
    # It does so with importlib.resources.open_binary, deprecated since 3.11;
    # that warning is the library's, not ours, so it is silenced here only.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"bpe_openai\b")
        import bpe_openai

        return bpe_openai.get_encoding(ENCODING_NAME)


#: The encoder refuses one call over 1,000,000 characters or 200,000 tokens,
#: so longer texts are encoded in pieces of at most this many characters: at
#: most 200,000 UTF-8 bytes, and a token is never less than a byte.
ENCODE_CHUNK_CHARS: Final = 50_000


def encode(text: str) -> list[int]:
    """Encode ``text`` as ordinary o200k_base tokens: special-token text stays text.

    Texts longer than :data:`ENCODE_CHUNK_CHARS` are cut just before a space
    (where the o200k pre-tokenizer starts a new piece anyway) and encoded piece
    by piece (:func:`encode_pieces`); only a run of that many characters
    without a space is cut hard.
    """
    if len(text) <= ENCODE_CHUNK_CHARS:
        tokens: list[int] = _encoding().encode_ordinary(text)
        return tokens
    tokens = []
    for piece in encode_pieces(text):
        tokens.extend(piece)
    return tokens


def encode_pieces(text: str) -> Iterator[list[int]]:
    """The tokens of :func:`encode`, a piece of at most :data:`ENCODE_CHUNK_CHARS`
    characters at a time (about 2 ms each): a caller can let others run between two."""
    encoding = _encoding()
    start = 0
    while start < len(text):
        end = min(start + ENCODE_CHUNK_CHARS, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)
            end = cut if cut > start else end
        yield encoding.encode_ordinary(text[start:end])
        start = end


# --- segments --------------------------------------------------------------


def _escape(text: str) -> str:
    # Keeps marker strings out of text so the full path splits only on real markers.
    # A text without "<" has none: one character is found at memchr speed (1 ms
    # for 15 MB), where the search for the marker itself held the loop 13 ms.
    if "<" not in text:
        return text
    return text.replace(_ESCAPE_FROM, _ESCAPE_TO)


def _item_segment(item: Item) -> tuple[str, str]:  # noqa: C901 (a branch per item type)
    """The escaped (header, body) of one item."""
    header: str
    body: str
    if isinstance(item, Message):
        header, body = item.role, item_text(item.content)
    elif isinstance(item, FunctionCall):
        name = f"{item.namespace}.{item.name}" if isinstance(item.namespace, str) else item.name
        header, body = f"assistant to=functions.{name}", item.arguments
    elif isinstance(item, CustomToolCall):
        name = f"{item.namespace}.{item.name}" if isinstance(item.namespace, str) else item.name
        header, body = f"assistant to=custom.{name}", item.input
    elif isinstance(item, LocalShellCall):
        header, body = "assistant to=local_shell", _json(item.action)
    elif isinstance(item, ShellCall):
        header, body = "assistant to=shell", _json(item.action)
    elif isinstance(item, ApplyPatchCall):
        header, body = "assistant to=apply_patch", _json(item.operation)
    elif isinstance(item, ComputerCall):
        header, body = "assistant to=computer", _json(item.actions or item.action)
    elif isinstance(item, CallOutput):
        header = f"tool call_id={answered_call_id(item)}"
        body = output_text(item)
    elif isinstance(item, Reasoning):
        # encrypted_content is opaque to this server: it renders nothing.
        texts = [part.text for part in item.summary]
        if isinstance(item.content, list):
            texts.extend(part.text for part in item.content)
        header, body = "assistant reasoning", "\n".join(texts)
    elif isinstance(item, McpListTools):
        header = f"tools server={item.server_label}"
        body = _json(item.tools) if not item.error else f"error: {item.error}"
    elif isinstance(item, McpCall):
        header = f"assistant to=mcp.{item.server_label}.{item.name}"
        result = item.output if isinstance(item.output, str) else _json(item.error)
        body = f"{item.arguments}\n{result}"
    elif isinstance(item, McpApprovalRequest):
        header = f"assistant to=mcp.{item.server_label}.{item.name} approval={item.id}"
        body = item.arguments
    elif isinstance(item, McpApprovalResponse):
        header = f"approval {item.approval_request_id}"
        body = "approved" if item.approve else "denied"
    elif isinstance(item, Compaction):
        header, body = "compaction", ""
    else:
        raise TypeError(f"cannot render item of type {type(item).__name__}")
    return _escape(header), _escape(body)


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _tool_text(tool: Tool) -> str | None:
    """What the model is shown of a tool; ``None`` for a hosted one (never offered)."""
    if isinstance(tool, FunctionTool):
        parameters = json.dumps(
            tool.parameters, sort_keys=True, ensure_ascii=False, separators=(",", ":")
        )
        return f"{tool.name}: {tool.description or ''}\n{parameters}"
    if isinstance(tool, CustomTool):
        description = tool.description if isinstance(tool.description, str) else ""
        grammar = _json(tool.format) if tool.format else '{"type":"text"}'
        return f"{tool.name} (custom): {description}\n{grammar}"
    if isinstance(tool, NamespaceTool):
        inner = "\n\n".join(filter(None, (_tool_text(sub) for sub in tool.tools)))
        return f"namespace {tool.name}: {tool.description}\n\n{inner}"
    if isinstance(tool, ComputerUsePreviewTool):
        size = f"{tool.display_width}x{tool.display_height}"
        return f"computer_use_preview: {tool.environment} {size}"
    if isinstance(tool, LocalShellTool | ShellTool | ApplyPatchTool | ComputerTool):
        return f"{tool.__struct_config__.tag}: built-in"
    return None


def _prefix_segment(instructions: str | None, tools: Sequence[Tool]) -> tuple[str, str]:
    """The escaped (header, body) of the system prefix: the instructions, then
    the tools offered to the model (hosted tools are not: they render nothing)."""
    sections = [instructions] if instructions else []
    offered = [text for text in map(_tool_text, tools) if text is not None]
    if offered:
        sections.append("# Tools\n\n" + "\n\n".join(offered))
    return "system", _escape("\n\n".join(sections))


#: Marker tokens in every segment: start, message, end.
_SEGMENT_MARKERS: Final = 3


def _utf8_length(text: str) -> int:
    # isascii() reads a flag of the string object: no pass over the text.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _encode_segment(header: str, body: str) -> list[int]:
    return [START, *encode(header), MESSAGE, *encode(body), END]


def _segment_text(header: str, body: str) -> str:
    return f"<|start|>{header}<|message|>{body}<|end|>"


# --- public rendering ------------------------------------------------------


def render_item(item: Item) -> list[int]:
    """The tokens of one item's segment."""
    return _encode_segment(*_item_segment(item))


def item_key(item: Item) -> bytes | None:
    """What an item is known by when a conversation's prefix is looked up again
    (``longresponse.serve.prefix_reuse``): a 16-byte digest of its kind and of
    the segment its tokens are made from, so two items with one key render the
    same tokens whatever else they carry (ids, status). ``None`` for what cannot
    be known so: a compaction item (its segment says nothing of its sealed
    content) or an item that cannot be rendered."""
    if isinstance(item, Compaction):
        return None
    try:
        header, body = _item_segment(item)
    except TypeError:
        return None
    # SHA-256, not BLAKE2: with the SHA extensions most x86 CPUs have, OpenSSL's
    # is about 2.5 times faster here (a whole history is hashed per request).
    # The header's length keeps a header and body apart whatever they hold.
    head = f"{type(item).__name__}\0{len(header)}\0{header}"
    digest = hashlib.sha256(head.encode("utf-8", "surrogatepass"))
    digest.update(body.encode("utf-8", "surrogatepass"))
    return digest.digest()[:16]


def render_prefix(instructions: str | None, tools: Sequence[Tool]) -> list[int]:
    """The tokens of the system segment: instructions, then a ``# Tools`` section."""
    return _encode_segment(*_prefix_segment(instructions, tools))


def render_text(instructions: str | None, tools: Sequence[Tool], items: Iterable[Item]) -> str:
    """The whole conversation as one string with literal marker strings.

    Text is escaped exactly as in :func:`render_item`, so
    ``tokenize_text(render_text(...))`` equals the prefix and item tokens concatenated.
    """
    segments = [_prefix_segment(instructions, tools)]
    segments.extend(_item_segment(item) for item in items)
    return "".join(_segment_text(header, body) for header, body in segments)


def tokenize_text(text: str) -> list[int]:
    """Tokenize a rendered string in one pass: marker strings become marker ids.

    Only correct for text whose content was escaped by :func:`render_text`;
    unescaped ``"<|end|>"`` in content would become a marker here.
    """
    tokens: list[int] = []
    # re.split with one capture group alternates text, marker, text, ...
    for index, piece in enumerate(_MARKER_SPLIT.split(text)):
        if index % 2:
            tokens.append(_MARKERS[piece])
        elif piece:
            tokens.extend(encode(piece))
    return tokens


# --- the incremental cache -------------------------------------------------


class TokenCache:
    """The append-only rendered tokens of one rollout.

    Holds tokens as a 32-bit ``array`` and renders each item once, when it is
    appended. ``items_rendered`` and ``tokens_rendered`` count that rendering
    work (the prefix is not counted; a fork starts at zero).

    Tokenizing can also wait: :meth:`defer` takes items and answers at once
    with an upper bound of the tokens they add (a byte-level BPE token
    covers at least one byte, so a segment is at most its UTF-8 bytes plus
    its three markers); :meth:`tokenize_deferred` tokenizes them. Everything that
    reads the tokens (``len``, :attr:`tokens`, a fork, :meth:`extend`)
    tokenizes what it holds first, so a deferred item is never lost or reordered.
    """

    __slots__ = ("_pending", "_tokens", "items_rendered", "prefix_length", "tokens_rendered")

    def __init__(self, prefix: Sequence[int] = ()) -> None:
        self._tokens = array(_TOKEN_TYPECODE, prefix)
        #: Segments :meth:`defer` holds, not tokenized yet (in order, after ``_tokens``).
        self._pending: list[tuple[str, str]] = []
        #: How many leading tokens are the prefix (instructions and tools).
        self.prefix_length = len(self._tokens)
        self.items_rendered = 0
        self.tokens_rendered = 0

    @property
    def tokens(self) -> array[int]:
        """The live token array: read it, never mutate it (use :meth:`snapshot` for a copy)."""
        self.tokenize_deferred()
        return self._tokens

    def __len__(self) -> int:
        self.tokenize_deferred()
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"<TokenCache tokens={len(self._tokens)} items_rendered={self.items_rendered}>"

    @property
    def nbytes(self) -> int:
        """Bytes held by the token payload (allocator slack not counted)."""
        return len(self._tokens) * self._tokens.itemsize

    def snapshot(self) -> list[int]:
        """A copy of the tokens as a list."""
        self.tokenize_deferred()
        return self._tokens.tolist()

    def extend(self, items: Iterable[Item]) -> int:
        """Render the new ``items`` and append their tokens; return how many were added.

        All items are rendered before anything is appended: if rendering raises,
        the tokens and the counters are unchanged.
        """
        self.tokenize_deferred()
        self._pending = [_item_segment(item) for item in items]
        return self.tokenize_deferred()

    def defer(self, items: Iterable[Item]) -> int:
        """Hold the new ``items`` for :meth:`tokenize_deferred`; return at most how many tokens
        they will add (raises, holding nothing, for an item that cannot be rendered)."""
        segments = [_item_segment(item) for item in items]
        self._pending.extend(segments)
        return sum(_SEGMENT_MARKERS + _utf8_length(h) + _utf8_length(b) for h, b in segments)

    def tokenize_deferred(self) -> int:
        """Tokenize what :meth:`defer` holds; return how many tokens that added."""
        if not self._pending:
            return 0
        rendered = array(_TOKEN_TYPECODE)
        for header, body in self._pending:  # all of them, or (raising) none
            rendered.fromlist(_encode_segment(header, body))  # 3x faster than extend()
        return self._commit(self._pending, rendered)

    def tokenizing(self) -> Iterator[None]:
        """:meth:`tokenize_deferred` in steps, for a caller that lets others run
        between two: yields after each piece of at most :data:`ENCODE_CHUNK_CHARS`
        characters, and the tokens join the cache at the end, all at once (a
        raise leaves the cache unchanged). Whatever reads the cache between two
        steps tokenizes the rest itself; this then adds nothing."""
        pending = self._pending
        rendered = array(_TOKEN_TYPECODE)
        for header, body in pending:  # defer() may add to it meanwhile: all are taken
            rendered.append(START)
            rendered.fromlist(encode(header))
            rendered.append(MESSAGE)
            for piece in encode_pieces(body):
                rendered.fromlist(piece)
                yield
            rendered.append(END)
        if self._pending is pending and pending:
            self._commit(pending, rendered)

    def _commit(self, pending: list[tuple[str, str]], rendered: array[int]) -> int:
        if self._tokens:
            self._tokens.extend(rendered)
        else:  # nothing to join: taken as it is (a copy of 5 M tokens held the loop 18 ms)
            self._tokens = rendered
        self.items_rendered += len(pending)
        self._pending = []
        self.tokens_rendered += len(rendered)
        return len(rendered)

    def fork(self, length: int) -> TokenCache:
        """A new, independent cache holding the first ``length`` tokens.

        Raises ``ValueError`` if ``length`` is negative or longer than this cache.
        """
        self.tokenize_deferred()
        if not 0 <= length <= len(self._tokens):
            raise ValueError(f"fork length {length} outside 0..{len(self._tokens)}")
        forked = TokenCache()
        forked._tokens = self._tokens[:length]
        forked.prefix_length = min(self.prefix_length, length)
        return forked

    def fork_items(self, prefix: Sequence[int], item_tokens: int) -> TokenCache:
        """A new cache: ``prefix``, then the first ``item_tokens`` of this cache's item tokens.

        For forking at an old boundary whose prefix may differ from this cache's
        current one. Raises ``ValueError`` if there are not that many item tokens.
        """
        self.tokenize_deferred()
        available = len(self._tokens) - self.prefix_length
        if not 0 <= item_tokens <= available:
            raise ValueError(f"fork of {item_tokens} item tokens outside 0..{available}")
        forked = TokenCache(prefix)
        forked._tokens.extend(self._tokens[self.prefix_length : self.prefix_length + item_tokens])
        return forked

    def extend_tokens(self, tokens: Iterable[int]) -> None:
        """Append tokens rendered elsewhere (a cache); nothing is rendered or counted."""
        self.tokenize_deferred()
        self._tokens.extend(tokens)

    def rerendered(self, prefix: Sequence[int], items: Iterable[Item]) -> TokenCache:
        """A new cache: ``prefix`` and ``items`` rendered again from scratch.

        For when the cache cannot be reused (it is switched off, or items were
        dropped from the front); this cache's work counters carry over, plus
        the new rendering.
        """
        self.tokenize_deferred()
        fresh = TokenCache(prefix)
        fresh.extend(items)
        fresh.items_rendered += self.items_rendered
        fresh.tokens_rendered += self.tokens_rendered
        return fresh

    def rebase(self, prefix: Sequence[int]) -> TokenCache:
        """A new cache with ``prefix`` in place of this one's, and the same item tokens.

        Item renderings do not depend on the prefix, so nothing is re-tokenized:
        changed instructions or tools cost a copy, not a render. Counters carry over.
        """
        self.tokenize_deferred()
        rebased = TokenCache(prefix)
        rebased._tokens.extend(self._tokens[self.prefix_length :])
        rebased.items_rendered = self.items_rendered
        rebased.tokens_rendered = self.tokens_rendered
        return rebased


def items_to_drop(prefix_tokens: int, item_tokens: Sequence[int], window: int) -> int:
    """How many of the oldest items ``truncation: "auto"`` drops so the rest fits
    ``window`` (all of them, when even the prefix alone does not fit)."""
    total = prefix_tokens + sum(item_tokens)
    dropped = 0
    while dropped < len(item_tokens) and total > window:
        total -= item_tokens[dropped]
        dropped += 1
    return dropped
