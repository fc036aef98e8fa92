"""Credentials and secrets in the text of NEW input items (user messages, tool outputs).

:func:`scan` finds them as :class:`Finding` spans, :func:`redact` replaces
them with ``[REDACTED:<kind>]``, and :class:`Policy` names what the caller
does with a hit. Nothing here keeps state or does I/O. The module uses
compiled regexes plus an entropy test instead of a library: ``detect-secrets``
(Yelp, on PyPI) took 28-120 ms per 8 KB here, reports lines but not character
offsets, and flags ordinary words when it scans one line with no file name.
This module takes about 0.06 ms per 8 KB (~2,000 tokens) of plain words and
0.2-0.25 ms per 8 KB of code or Markdown (see ``Rule.needs`` for why).

Theory of operation
-------------------
Each rule in ``secret_rules.RULES`` is a regex plus an optional ``check`` on
the match. A case-sensitive rule's regex starts with a literal (``ghp``, ``AIza``,
``-----BEGIN``), so the regex engine searches for it at C speed, and its
token boundary is a lookbehind placed after the literal. A case-insensitive
rule (``password = ...``, ``Authorization: ...``) instead lists lower-case
trigger words: its regex is tried only where ``text.lower()`` has one. No
pattern backtracks: every repeat is bounded or possessive, or stops at the
next ``-----``, so scan time grows linearly with the text. A match its check
rejects does not make every later start be tried: ``Rule.skip`` jumps past
the starts whose match could not be accepted either (``sk-sk-sk-...`` would
otherwise read each character about 85 times: 0.7 s per MB).

An assignment rule reports only the value, so ``password = "[REDACTED:
password_assignment]"`` keeps the key readable. Overlapping spans merge into
one finding with the kind of the longest; on a tie in length, the kind listed
earlier in :data:`KINDS` wins. Then the high-entropy rule judges every run of
base64/base64url characters outside those spans. A run that a finding covers
in part is judged by the pieces beside it, which is what a scan sees once
the finding is redacted.

The result is closed under redaction: ``scan(redact(text, scan(text)))`` is
empty. Rejecting a value can depend on its neighbours (``password: hunter2.
<random>`` reads as attribute access until the random part is redacted). So
when a scan finds anything, the redacted text is scanned again, and any new
findings are mapped back and added, until a pass finds nothing. Text with no
secret is scanned once; text with secrets usually twice.

High-entropy strings (``high_entropy_string``) are the fallback for secrets
with no known shape. A run of at least :data:`ENTROPY_MIN_LENGTH` characters
is split at ``- _ / +``. Its *core* is the pieces that mix letters and digits
and are not hex. The run counts as random when the core has at least
:data:`ENTROPY_MIN_CORE` characters, its Shannon entropy is at least
:data:`ENTROPY_MIN_RATIO` of ``log2(min(len, 64))``, and its characters change
class often:

* mixed case: the core splits into words (``[A-Z]+``, ``[A-Z]?[a-z]+``,
  digits) averaging at most :data:`ENTROPY_MAX_WORD_LENGTH` characters.
  Identifiers average 2.5-5 (``PBESv2SHA256AndAES256CBC``: 2.7,
  ``getHTTP2ResponseHeaderValue``: 4.5); random base62 averages 1.9.
* one case only: at least :data:`ENTROPY_MIN_SWITCH_RATE` of adjacent
  characters switch between letter and digit.

What is never a high-entropy string, by decision:

* Hex, alone or with ``-``/``_`` separators or a ``0x`` prefix: git SHAs (40),
  MD5 (32), SHA-256 (64), UUIDs, hex literals, and hex pieces of longer runs.
  Agent transcripts are full of them (git log, lockfiles, image digests), and
  as a bare string a hex secret looks exactly like a digest. A hex secret is
  still found when assigned to a secret-like key (``SECRET_KEY = "9f2c..."``).
* Digests marked as such: SRI ``sha512-...``, values after ``sha256:``,
  ``md5=`` or ``h1:`` (go.sum), ``data:...;base64,`` payloads.
* Public material: the bodies of certificate, public-key and PGP-signature PEM
  blocks, and SSH public keys (``AAAAB3NzaC1...``).
* Base64 that decodes to printable ASCII (encoded text, not key material),
  and the base64 magic of PNG, JPEG, GIF, PDF, zip and gzip.
* Identifiers of LLM APIs that rollouts carry (``call_``, ``fc_``, ``toolu_``,
  ``resp_``, ``msg_``, ``chatcmpl-``, ...) and punycode labels (``xn--``).

Known limits. Missed:

* A secret with no known shape that is shorter than 20 characters, has no
  digit, is one case with few letter/digit switches (much base32), or is hex
  outside an assignment.
* Assignments outside ``key = value`` shapes (code, env files, YAML, JSON,
  ``--flag value``), such as ``the password is hunter2``.
* A bare value without a digit, except in upper-case env style
  (``PASSWORD=hunter``).
* A quoted value with whitespace in it.
* Placeholder-looking values (``changeit``, ``your_token_here``, ``****``).

Over-flagged:

* Random-looking ids that are not secrets (CI job ids, object ids of other
  APIs).
* A private key cut off before its END line takes in the base64-like text
  that follows it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .secret_rules import (
    ENTROPY_MAX_WORD_LENGTH,
    ENTROPY_MIN_CORE,
    ENTROPY_MIN_LENGTH,
    ENTROPY_MIN_RATIO,
    ENTROPY_MIN_SWITCH_RATE,
    ENTROPY_SAMPLE_LENGTH,
    RULES,
    Rule,
    entropy_spans,
)

__all__ = [
    "ENTROPY_MAX_WORD_LENGTH",
    "ENTROPY_MIN_CORE",
    "ENTROPY_MIN_LENGTH",
    "ENTROPY_MIN_RATIO",
    "ENTROPY_MIN_SWITCH_RATE",
    "ENTROPY_SAMPLE_LENGTH",
    "KINDS",
    "Finding",
    "Policy",
    "Verdict",
    "redact",
    "scan",
]

#: Every ``Finding.kind``. On a tie in length, a kind earlier here wins.
KINDS: tuple[str, ...] = (
    "private_key",
    "aws_access_key_id",
    "github_token",
    "gitlab_token",
    "slack_token",
    "slack_webhook",
    "stripe_key",
    "google_api_key",
    "anthropic_api_key",
    "openai_api_key",
    "huggingface_token",
    "npm_token",
    "pypi_token",
    "jwt",
    "aws_secret_access_key",
    "authorization_header",
    "url_credentials",
    "password_assignment",
    "secret_assignment",
    "high_entropy_string",
)
_PRIORITY = {kind: rank for rank, kind in enumerate(KINDS)}


@dataclass(frozen=True, slots=True)
class Finding:
    """One secret: ``text[start:end]`` (character offsets) is of ``kind``."""

    kind: str
    start: int
    end: int


#: The findings in one item (empty: nothing found).
Verdict = tuple[Finding, ...]


class Policy(enum.StrEnum):
    """What the caller does with an item in which :func:`scan` found something."""

    FLAG = "flag"  # keep the text as is, record the findings
    REDACT = "redact"  # replace the text with redact(text, findings)
    REFUSE = "refuse"  # reject the item


def scan(text: str) -> list[Finding]:
    """Return the secrets in ``text``, sorted by ``start``, never overlapping.

    Overlapping matches are merged into one finding covering all of them,
    with the kind of the longest. The result is closed under redaction:
    ``scan(redact(text, scan(text)))`` is empty. A value that only looks like
    a secret once its neighbour is redacted (``password: hunter2.<random>``
    reads as attribute access until the random part is gone) is found by
    scanning the redacted text again, until that finds nothing. Pure: never
    raises on any ``str``.
    """
    findings = _merge(_scan_once(text))
    while findings:
        redacted, markers = _redact(text, findings)
        extra = _scan_once(redacted)
        if not extra:
            break
        spans = [(f.start, f.end, f.kind) for f in findings]
        for start, end, kind in extra:
            spans.append((_unredact(start, markers, False), _unredact(end, markers, True), kind))
        merged = _merge(spans)
        if merged == findings:  # nothing new covered: cannot happen, but never loop
            break
        findings = merged
    return findings


def redact(text: str, findings: Sequence[Finding]) -> str:
    """Return ``text`` with each finding's span replaced by ``[REDACTED:<kind>]``.

    ``findings`` need not be sorted. Raises :class:`ValueError` (and returns
    nothing) if a span is empty, lies outside ``text`` or overlaps another.
    """
    return _redact(text, findings)[0]


# --- scanning -----------------------------------------------------------------


def _scan_once(text: str) -> list[tuple[int, int, str]]:
    lowered = _lower(text)
    if len(lowered) != len(text):  # only "İ" lengthens; keep offsets equal
        lowered = _lower(text.replace("İ", "I"))
    spans: list[tuple[int, int, str]] = []
    present = {c: c in text for c in _NEEDED}
    found: dict[str, list[int]] = {}  # trigger word -> where it occurs in lowered
    for rule in RULES:
        if rule.needs and not any(present[c] for c in rule.needs):
            continue  # the rule cannot match: proven by a memchr per character
        for m in _matches(rule, text, lowered, found):
            start, end = m.span(rule.group)
            kind = rule.kind
            if rule.variant is not None and m.group(rule.variant[0]) is not None:
                kind = rule.variant[1]
            if kind == "private_key":
                end = start + len(m.group().rstrip())
            elif (armor := text.find("-----", start, end)) != -1:
                end = armor  # PEM armor is never part of a token: `<token>-----BEGIN ...`
            if start < end:
                spans.append((start, end, kind))
    spans.extend(entropy_spans(text, spans))
    return spans


#: Every character some rule ``needs``.
_NEEDED = frozenset("".join(rule.needs for rule in RULES))


def _lower(text: str) -> str:
    """``text.lower()``, :data:`_FIND_WINDOW` characters at a time (one call held
    the interpreter 11-16 ms for 15 MB). Only a capital sigma lowers by its
    neighbours (to the final form or not): at a piece's edge it may take the
    other form, of the same length, which no trigger word (ASCII) can tell."""
    if len(text) <= _FIND_WINDOW:
        return text.lower()
    pieces = [text[at : at + _FIND_WINDOW].lower() for at in range(0, len(text), _FIND_WINDOW)]
    return "".join(pieces)


#: Characters one ``str.find`` reads at a time: a find holds the interpreter
#: for the whole search (8-20 ms for a word absent from 15 MB), and this may
#: run in a worker thread beside the event loop. (The server reads texts this
#: long in a child process, ``serve/scan_process.py``; the windows keep the
#: thread path short too: its fallback when the child is gone, and any other
#: caller of :func:`scan`.)
_FIND_WINDOW = 1 << 18


def _occurrences(word: str, lowered: str, found: dict[str, list[int]]) -> list[int]:
    """Where ``word`` occurs in ``lowered``, found once per scan and shared by the rules
    (a window of :data:`_FIND_WINDOW` characters at a time; two windows overlap by
    the word's length less one, so no occurrence falls between them)."""
    if (where := found.get(word)) is None:
        where = found[word] = []
        at, size = 0, len(lowered)
        while at < size:
            stop = min(at + _FIND_WINDOW + len(word) - 1, size)
            hit = lowered.find(word, at, stop)
            if hit == -1:
                at = stop - len(word) + 1 if stop < size else size
            else:
                where.append(hit)
                at = hit + 1
    return where


def _matches(
    rule: Rule, text: str, lowered: str, found: dict[str, list[int]]
) -> Iterator[re.Match[str]]:
    """The accepted matches of ``rule``, none starting inside the one before.

    A match that ``check`` rejects does not hide one that starts inside it:
    ``password=s3_password password = "hunter2"`` still finds the second.
    """

    def accepted(m: re.Match[str]) -> bool:
        return rule.check is None or rule.check(m, text)

    if not rule.triggers:
        at = 0
        while (m := rule.pattern.search(text, at)) is not None:
            if accepted(m):
                yield m
                at = max(m.end(), m.start() + 1)
            else:
                at = m.start() + 1 if rule.skip is None else rule.skip(m, text)
        return
    positions: set[int] = set()
    for trigger in rule.triggers:
        positions.update(_occurrences(trigger, lowered, found))
    for key in _occurrences("key", lowered, found) if rule.key_words else ():
        for word in rule.key_words:  # `<word>key`, `<word>_key`, `<word>-key`
            for start in (key - len(word), key - 1 - len(word)):
                if (
                    start >= 0
                    and lowered.startswith(word, start)
                    and (start + len(word) == key or lowered[key - 1] in "_-")
                ):
                    positions.add(start)
    resume = 0
    for at in sorted(positions):
        if at < resume or (m := rule.pattern.match(text, at)) is None:
            continue
        if accepted(m):
            resume = m.end()
            yield m


def _merge(spans: list[tuple[int, int, str]]) -> list[Finding]:
    spans.sort()
    merged: list[Finding] = []
    best = (0, 0)  # (length, -priority) of the kind given to merged[-1]
    for start, end, kind in spans:
        rank = (end - start, -_PRIORITY[kind])
        if merged and start < merged[-1].end:
            last = merged[-1]
            if rank > best:
                best = rank
            else:
                kind = last.kind
            merged[-1] = Finding(kind, last.start, max(last.end, end))
        else:
            merged.append(Finding(kind, start, end))
            best = rank
    return merged


_Marker = tuple[int, int, int, int]  # where a marker is in the redacted text, and its span


def _unredact(at: int, markers: list[_Marker], is_end: bool) -> int:
    """Map an offset in the redacted text back to the text; inside a marker, to its span."""
    shift = 0
    for red_start, red_end, start, end in markers:
        if at <= red_start:
            break
        if at < red_end:
            return end if is_end else start
        shift = end - red_end
    return at + shift


def _redact(text: str, findings: Sequence[Finding]) -> tuple[str, list[_Marker]]:
    parts: list[str] = []
    markers: list[_Marker] = []
    cursor = 0
    size = 0  # of the redacted text so far
    for f in sorted(findings, key=lambda f: f.start):
        if not 0 <= f.start < f.end <= len(text):
            raise ValueError(f"finding {f!r} is not a span of a text of length {len(text)}")
        if f.start < cursor:
            raise ValueError(f"finding {f!r} overlaps the one before it")
        marker = f"[REDACTED:{f.kind}]"
        size += f.start - cursor
        markers.append((size, size + len(marker), f.start, f.end))
        size += len(marker)
        parts.append(text[cursor : f.start])
        parts.append(marker)
        cursor = f.end
    parts.append(text[cursor:])
    return "".join(parts), markers
