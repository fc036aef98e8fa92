"""Credentials and secrets in the text of NEW input items (user messages, tool outputs).

:func:`scan` finds them as :class:`Finding` spans, :func:`redact` replaces
them with ``[REDACTED:<kind>]``, and :class:`Policy` names what the caller
does with a hit. Nothing here keeps state or does I/O. The module uses
compiled regexes plus an entropy test instead of a library: ``detect-secrets``
(Yelp, on PyPI) took 28-120 ms per 8 KB here, reports lines but not character
offsets, and flags ordinary words when it scans one line with no file name.
This module takes about 0.15-0.2 ms per 8 KB (~2,000 tokens) of ordinary text.

Theory of operation
-------------------
Each rule in :data:`_RULES` is a regex plus an optional ``check`` on the
match. A case-sensitive rule's regex starts with a literal (``ghp``, ``AIza``,
``-----BEGIN``), so the regex engine searches for it at C speed, and its
token boundary is a lookbehind placed after the literal. A case-insensitive
rule (``password = ...``, ``Authorization: ...``) instead lists lower-case
trigger words: its regex is tried only where ``text.lower()`` has one. No
pattern backtracks: every repeat is bounded or possessive, or stops at the
next ``-----``, so scan time grows linearly with the text.

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

import binascii
import bisect
import enum
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

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
    "redact",
    "scan",
]

#: Shortest run of base64/base64url characters examined for entropy.
ENTROPY_MIN_LENGTH = 20
#: Shortest random core (letter+digit pieces that are not hex) flagged.
ENTROPY_MIN_CORE = 16
#: Shannon entropy needed, as a fraction of ``log2(min(len(core), 64))``.
ENTROPY_MIN_RATIO = 0.75
#: Mixed-case cores: the average word length must be at most this.
ENTROPY_MAX_WORD_LENGTH = 2.3
#: Single-case cores: the fraction of adjacent pairs switching letter/digit.
ENTROPY_MIN_SWITCH_RATE = 0.35
#: Longer runs are judged by this many leading characters (a multiple of 4).
ENTROPY_SAMPLE_LENGTH = 256

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
    lowered = text.lower()
    if len(lowered) != len(text):  # only "İ" lengthens; keep offsets equal
        lowered = text.replace("İ", "I").lower()
    spans: list[tuple[int, int, str]] = []
    for rule in _RULES:
        for m in _matches(rule, text, lowered):
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
    spans.extend(_entropy_spans(text, spans))
    return spans


def _matches(rule: _Rule, text: str, lowered: str) -> Iterator[re.Match[str]]:
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
                at = m.start() + 1
        return
    positions: set[int] = set()
    for trigger in rule.triggers:
        at = lowered.find(trigger)
        while at != -1:
            positions.add(at)
            at = lowered.find(trigger, at + 1)
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


# --- rules --------------------------------------------------------------------

_Check = Callable[[re.Match[str], str], bool]


@dataclass(frozen=True, slots=True)
class _Rule:
    """Where ``pattern`` matches in a text, ``group`` of the match is a ``kind``.

    Without ``triggers`` the pattern is searched for; it starts with a
    literal, so the regex engine skips ahead at C speed. With ``triggers``
    (lower case; case-insensitive rules) the pattern is matched only where
    one of them occurs in ``text.lower()``, and starts there. ``check``
    rejects a match whose value is code, a placeholder, or not random.
    """

    kind: str
    pattern: re.Pattern[str]
    group: str | int = 0
    check: _Check | None = None
    triggers: tuple[str, ...] = ()
    variant: tuple[str, str] | None = None  # (group, kind): the kind if group took part


_PLACEHOLDERS = frozenset(
    {
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "required",
        "optional",
        "string",
        "str",
        "bytes",
        "redacted",
        "example",
        "changeit",
        "xxx",
        "password",
        "passwd",
        "pass",
        "pwd",
        "secret",
        "token",
    }
)
_TEMPLATE_START = tuple("${<%*[")
_TEMPLATE = re.compile(r"%[sdr(]|\{\w*\}|\$\{|\$\(")  # "%s", "{}", "{name}", "${X}", "$(cmd)"
_PLACEHOLDER_SHAPE = re.compile(r"(?i)(?:your|my)[_-]|.*[_-]here$|(.)\1*$")
_HAS_ALNUM = re.compile(r"[A-Za-z0-9]")
_HAS_DIGIT = re.compile(r"[0-9]")
_WORDLIKE = re.compile(r"[A-Za-z_][A-Za-z_.\-]*")  # a name; no digit
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")  # a variable, maybe dotted
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # attribute access
_PATHLIKE = re.compile(r"(?:~|\.{1,2})?/|[A-Za-z]:\\")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{40}")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")  # `auth: https://...` names a place


def _is_placeholder(value: str) -> bool:
    return (
        value.lower() in _PLACEHOLDERS
        or value.startswith(_TEMPLATE_START)
        or _TEMPLATE.search(value) is not None
        or _PLACEHOLDER_SHAPE.match(value) is not None
        or _HAS_ALNUM.search(value) is None
        or _URL.match(value) is not None
    )


def _squash(s: str) -> str:
    return s.lower().replace("_", "").replace("-", "")


def _mixed_token(m: re.Match[str], text: str) -> bool:
    """The token has a digit, an upper- and a lower-case letter (random base62)."""
    tail = m.group("tail")
    return (
        _HAS_DIGIT.search(tail) is not None
        and any(c.isupper() for c in tail)
        and any(c.islower() for c in tail)
    )


def _pem_body(m: re.Match[str], text: str) -> bool:
    # A header quoted in code or prose has no key material after it.
    return _BASE64_RUN.search(m.group("body")) is not None


def _url_password(m: re.Match[str], text: str) -> bool:
    scheme_end = m.start()
    return scheme_end > 0 and text[scheme_end - 1].isalnum() and not _is_placeholder(m["value"])


def _aws_secret(m: re.Match[str], text: str) -> bool:
    # SecretAccessKey names AWS by itself; SECRET_KEY counts after "AWS_" only.
    before = text[max(0, m.start() - 4) : m.start()].lower()
    return m.group("access") is not None or before.endswith(("aws", "aws_"))


def _bearer_value(m: re.Match[str], text: str) -> bool:
    # In a header any value counts; a bare "bearer <word>" needs a digit.
    value = m.group("value")
    header = m.group("header") is not None
    return not _is_placeholder(value) and (header or _HAS_DIGIT.search(value) is not None)


def _assignment(m: re.Match[str], text: str) -> bool:
    """Accept ``key <sep> value`` when the value is a literal, not code or a placeholder."""
    value, key, sep = m.group("value"), m.group("kw"), m.group("sep")
    password = m.group("pw") is not None
    if len(value) < (4 if password else 8):
        return False
    quoted = m.group("quote") is not None
    has_digit = _HAS_DIGIT.search(value) is not None
    if _is_placeholder(value):
        return False
    names_key = _squash(key) in _squash(value)
    if names_key and (not has_digit if quoted else _IDENTIFIER.fullmatch(value) is not None):
        return False  # `credentials=s3_credentials`, "your_password", "challengePassword"
    if not sep.strip():  # `--password hunter2`: flags only
        key_start = m.start("kw")
        while key_start > 0 and (text[key_start - 1].isalnum() or text[key_start - 1] in "_-"):
            key_start -= 1
        if not text.startswith("--", key_start):
            return False
    if value.isdigit():  # a PIN may be a password; a count is not a token
        return password
    if quoted:
        return password or has_digit or len(value) >= 16 or _WORDLIKE.fullmatch(value) is None
    if _PATHLIKE.match(value) or _DOTTED.fullmatch(value):
        return False  # `PWD=/home/x`, `token = self.token`
    if text[m.end("value") : m.end("value") + 1] in ("(", "["):
        return False  # `token = next_token()`, `key = keys[0]`
    if _WORDLIKE.fullmatch(value) is None:
        return True  # has a digit or a symbol: a literal
    # A bare name is a variable (`password=pw`), except in env style: `PASSWORD=hunter`.
    return password and key.isupper() and sep == "="


_E = r"(?![A-Za-z0-9])"  # a token ends here


def _token(prefix: str, rest: str) -> re.Pattern[str]:
    """A token starting with ``prefix`` after no letter or digit.

    The literal comes first so that the regex engine searches for it at C speed.
    ``_`` or ``-`` before the prefix still starts a token: ``MY_ghp_...`` is a
    GitHub token, and ``task_live_`` is not a Stripe key.
    """
    literal = re.escape(prefix)
    return re.compile(f"{literal}(?<![A-Za-z0-9]{literal}){rest}")


_RULES: tuple[_Rule, ...] = (
    _Rule(
        "private_key",
        re.compile(
            r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"
            r"(?P<body>(?:[A-Za-z0-9+/=:,.()\s]|\\[nrt]|-(?!----))*+)"
            r"(?:-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----)?"
        ),
        check=_pem_body,
    ),
    _Rule(
        "aws_access_key_id",
        _token("A", r"(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ),
    _Rule("github_token", _token("gh", r"[pousr]_[A-Za-z0-9]{36,255}+" + _E)),
    _Rule("github_token", _token("github_pat_", r"[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _E)),
    _Rule(
        "gitlab_token",
        _token(
            "gl",
            r"(?:pat|dt|rt|ptt|soat|ft)-[A-Za-z0-9_\-]{20,255}+(?:\.[0-9a-z]{2}\.[a-z0-9]{9})?",
        ),
    ),
    _Rule("slack_token", _token("x", r"(?:ox[abposre]|app)-[A-Za-z0-9\-]{10,255}+")),
    _Rule(
        "slack_webhook",
        re.compile(
            r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+\-]{20,}+"
        ),
    ),
    _Rule("stripe_key", _token("sk_", r"(?:live|test)_[A-Za-z0-9]{10,255}+")),
    _Rule("stripe_key", _token("rk_", r"(?:live|test)_[A-Za-z0-9]{10,255}+")),
    _Rule("stripe_key", _token("whsec_", r"[A-Za-z0-9+/=]{24,}+")),
    _Rule("google_api_key", _token("AIza", r"[A-Za-z0-9_\-]{35}" + _E)),
    _Rule(
        "openai_api_key",
        _token("sk-", r"(?P<ant>ant-)?(?:proj-|svcacct-|admin-)?(?P<tail>[A-Za-z0-9_\-]{20,255}+)"),
        check=_mixed_token,
        variant=("ant", "anthropic_api_key"),
    ),
    _Rule(
        "huggingface_token", _token("hf_", r"(?P<tail>[A-Za-z0-9]{34})" + _E), check=_mixed_token
    ),
    _Rule("npm_token", _token("npm_", r"(?P<tail>[A-Za-z0-9]{36})" + _E), check=_mixed_token),
    _Rule(
        "pypi_token",  # a macaroon whose location is pypi.org or test.pypi.org
        _token("pypi-Ag", r"(?:EIcHlwaS5vcmc|ENdGVzdC5weXBpLm9yZw)[A-Za-z0-9_\-]{50,}+"),
    ),
    _Rule(
        "jwt",
        _token(
            "eyJ",
            r"[A-Za-z0-9_\-]{8,}+\."
            r"(?:eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]*+"
            r"|[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+)"
            r"(?:\.[A-Za-z0-9_\-]++){0,2}",  # a JWE has five segments
        ),
    ),
    _Rule(
        "url_credentials",  # scheme://user:PASSWORD@host
        re.compile(r"://[^\s/:@\"'<>]{0,256}+:(?P<value>[^\s/:@\"'<>]{1,256}+)@"),
        group="value",
        check=_url_password,
    ),
    _Rule(
        "aws_secret_access_key",  # (AWS_)SECRET_ACCESS_KEY, SecretAccessKey, AWS_SECRET_KEY
        re.compile(
            r"(?i:secret_?(?P<access>access_?)?key)\\?[\"']?[ \t]*(?::|=>?)"
            r"[ \t]*\\?[\"']?(?P<value>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"
        ),
        group="value",
        check=_aws_secret,
        triggers=("secret",),
    ),
    _Rule(
        "authorization_header",
        re.compile(
            r"(?i:(?<![A-Za-z0-9])(?:(?P<header>authorization)\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?"
            r"(?:bearer|basic|token|bot|apikey)|bearer)[ \t]+)"
            r"(?P<value>[A-Za-z0-9._~+/\-]{8,1024}+=*)"
        ),
        group="value",
        check=_bearer_value,
        triggers=("authorization", "bearer"),
    ),
    _Rule(
        "secret_assignment",
        re.compile(
            r"(?i:(?P<kw>(?P<pw>passw(?:or)?d|passphrase|(?<![a-z])(?:pass|pwd))"
            r"|(?:secret|access|private|signing|encryption|master|api|auth)[_-]?key"
            r"|secret|token|credentials?))"
            r"\\?[\"']?"
            r"(?P<sep>[ \t]*(?::=|=>|(?::[ \t]*[A-Za-z_][A-Za-z0-9_.\[\]| ,]{0,40}?)?=(?!=)|:(?!:))"
            r"[ \t]*|[ \t]+)"
            r"(?:\\?(?P<quote>[\"'`]))?"
            r"(?P<value>(?(quote)[^\"'`\s\\]{1,256}+"
            r"|[^\s\"'`,;&|<>(){}\[\]\\=]"  # a bare value; & ends it before a next
            r"(?:[^\s\"'`,;&|<>(){}\[\]\\]|&(?![A-Za-z0-9_.\-]+=)){0,255}(?<![.:!?])))"
            r"(?(quote)\\?(?P=quote))"
        ),
        group="value",
        check=_assignment,
        triggers=(
            "pass",
            "pwd",
            "secret",
            "token",
            "credential",
            "api",
            "access",
            "private",
            "signing",
            "encryption",
            "master",
            "auth",
        ),
        variant=("pw", "password_assignment"),
    ),
)

# --- high-entropy strings -----------------------------------------------------

# Candidates are found in a one-byte-per-character image of the text (latin-1,
# "?" for any other character) where base64/base64url characters read "a":
# a regex with a literal prefix finds runs there ~10x faster than a character
# class finds them in the text. Offsets are the same in both.
_BASE64_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-"
_RUN_IMAGE = bytes(
    ord("a") if b in _BASE64_CHARS else ord("=") if b == ord("=") else ord(" ") for b in range(256)
)
_CANDIDATE = re.compile(b"a" * ENTROPY_MIN_LENGTH + b"a*={0,2}")
_PIECES = re.compile(r"[-_/+]")
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F_\-]+")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_NOT_SECRET_PREFIX = re.compile(
    r"(?i:xn--|sha(?:1|224|256|384|512)-)"  # punycode; subresource integrity
    r"|(?:call|fc|toolu|resp|msg|rs|req|run|thread|asst|batch|file|chatcmpl|evt)[_-]"  # API ids
    r"|iVBORw0KGgo|/9j/|R0lGOD|JVBERi0|UEsDB|H4sI"  # PNG JPEG GIF PDF zip gzip
    r"|AAAA[BC]3NzaC1|AAAAE2VjZHNh|AAAA[GI]nNr"  # SSH public keys (RFC 4253 6.6)
)
# Certificates and public keys are public; their bodies are not entropy hits.
_PUBLIC_PEM = re.compile(
    r"-----BEGIN (?P<label>CERTIFICATE|TRUSTED CERTIFICATE|CERTIFICATE REQUEST|X509 CRL"
    r"|(?:RSA |SSH2 )?PUBLIC KEY|PGP PUBLIC KEY BLOCK|PGP SIGNATURE|(?:DH|EC) PARAMETERS)-----"
    r"(?:[A-Za-z0-9+/=:,.()\s]|\\[nrt]|-(?!----))*+-----END (?P=label)-----"
)
_DIGEST_CONTEXT = re.compile(r"(?i:sha(?:1|224|256|384|512)|md5|h1)[:=]$|base64,$")
_PRINTABLE = bytes(range(32, 127)) + b"\t\n\r"


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _switch_rate(s: str) -> float:
    switches = sum(a.isdigit() != b.isdigit() for a, b in itertools.pairwise(s))
    return switches / (len(s) - 1)


def _decodes_to_text(token: str) -> bool:
    padded = token.replace("-", "+").replace("_", "/") + "=" * (-len(token) % 4)
    try:
        raw = binascii.a2b_base64(padded, strict_mode=True)
    except binascii.Error:
        return False
    return not raw.translate(None, _PRINTABLE)


def _is_random(candidate: str, start: int, text: str) -> bool:
    # The head of a long run speaks for all of it; a multiple of 4 keeps base64 aligned.
    token = candidate[:ENTROPY_SAMPLE_LENGTH].rstrip("=")
    if _HAS_DIGIT.search(token) is None or _HEX.fullmatch(token):
        return False
    if _NOT_SECRET_PREFIX.match(token) or _DIGEST_CONTEXT.search(text, max(0, start - 8), start):
        return False
    core = "".join(
        piece
        for piece in _PIECES.split(token)
        if not piece.isalpha() and not piece.isdigit() and not _HEX.fullmatch(piece)
    )
    if len(core) < ENTROPY_MIN_CORE:
        return False
    if _entropy(core) < ENTROPY_MIN_RATIO * math.log2(min(len(core), 64)):
        return False
    if core.lower() != core and core.upper() != core:  # mixed case
        if len(core) / len(_WORDS.findall(core)) > ENTROPY_MAX_WORD_LENGTH:
            return False
    elif _switch_rate(core) < ENTROPY_MIN_SWITCH_RATE:
        return False
    return not _decodes_to_text(token)


def _entropy_spans(text: str, found: list[tuple[int, int, str]]) -> Iterator[tuple[int, int, str]]:
    """The runs of ``text`` that look random, outside the spans already ``found``.

    Where a finding of another rule covers part of a run, only the pieces
    left beside it are judged, each as a run of its own: that is what a scan
    of the redacted text sees, so redacting never exposes a new finding.
    """
    public = [m.span() for m in _PUBLIC_PEM.finditer(text)] if "-----BEGIN" in text else []
    spans = sorted((a, b) for a, b, _ in found)
    starts = [a for a, _ in spans]
    reach = list(itertools.accumulate((b for _, b in spans), max))  # furthest end so far
    raw = text.encode("latin-1", "replace").replace(b"-----", b"     ")  # PEM armor ends a run
    image = raw.translate(_RUN_IMAGE)
    for run in _CANDIDATE.finditer(image):
        start, end = run.span()
        if _HAS_DIGIT.search(text, start, end) is None:  # nor has any piece of it
            continue
        if public and any(a <= start < b for a, b in public):
            continue
        inside: list[tuple[int, int]] = []
        j = bisect.bisect_left(starts, end) - 1  # spans[: j + 1] start before the run ends
        while j >= 0 and reach[j] > start:
            if spans[j][1] > start:
                inside.append(spans[j])
            j -= 1
        inside.reverse()
        if not inside:
            if _is_random(text[start:end], start, text):
                yield start, end, "high_entropy_string"
            continue
        cursor = start
        for a, b in [*inside, (end, end)]:
            for piece in _CANDIDATE.finditer(image, cursor, a) if cursor < a else ():
                if _is_random(text[piece.start() : piece.end()], piece.start(), text):
                    yield piece.start(), piece.end(), "high_entropy_string"
            cursor = max(cursor, b)
