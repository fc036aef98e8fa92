"""The secrets classifier's rules: one regex (and check) per kind, and the entropy test.

Theory of operation
-------------------
:data:`RULES` holds one :class:`Rule` per credential format: a regex that
starts with a literal (case-sensitive kinds) or is tried only where a
lower-case trigger word occurs (case-insensitive kinds), plus an optional
``check`` of the match that rejects placeholders, templates, paths and other
look-alikes. :func:`entropy_spans` finds random-looking runs that no rule
named. ``longresponse.engine.classifier`` runs both and merges the spans;
see its docstring for what is found and what is missed.
"""

from __future__ import annotations

import binascii
import bisect
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "ENTROPY_MAX_WORD_LENGTH",
    "ENTROPY_MIN_CORE",
    "ENTROPY_MIN_LENGTH",
    "ENTROPY_MIN_RATIO",
    "ENTROPY_MIN_SWITCH_RATE",
    "ENTROPY_SAMPLE_LENGTH",
    "RULES",
    "Rule",
    "entropy_spans",
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


# --- rules --------------------------------------------------------------------

_Check = Callable[[re.Match[str], str], bool]
_Skip = Callable[[re.Match[str], str], int]


@dataclass(frozen=True, slots=True)
class Rule:
    """Where ``pattern`` matches in a text, ``group`` of the match is a ``kind``.

    Without ``triggers`` the pattern is searched for; it starts with a
    literal, so the regex engine skips ahead at C speed. With ``triggers``
    (lower case; case-insensitive rules) the pattern is matched only where
    one of them occurs in ``text.lower()``, and starts there. ``check``
    rejects a match whose value is code, a placeholder, or not random.

    Two shortcuts skip work without changing what is found. ``needs`` lists
    characters of which every match holds at least one (``_`` for ``ghp_``):
    text holding none of them is not searched at all, which one ``in`` test
    per character proves at memchr speed. ``key_words`` are trigger words
    that start a match only as ``<word>[_-]?key`` (``api_key``): their
    positions are found from the occurrences of ``key``, one text scan
    instead of one per word.
    """

    kind: str
    pattern: re.Pattern[str]
    group: str | int = 0
    check: _Check | None = None
    triggers: tuple[str, ...] = ()
    variant: tuple[str, str] | None = None  # (group, kind): the kind if group took part
    needs: str = ""
    key_words: tuple[str, ...] = ()
    #: After a match ``check`` rejected: the first position where a match
    #: ``check`` could accept may start (None: the next character). Without it
    #: ``sk-sk-sk-...`` rescans up to 270 characters at every ``sk-``.
    skip: _Skip | None = None


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


_CHARACTER_CLASSES = (re.compile(r"[0-9]"), re.compile(r"[A-Z]"), re.compile(r"[a-z]"))

#: Characters one search for a character class reads at a time. ``re`` holds
#: the interpreter for a whole search: one over 15 MB without a hit took
#: 60 ms, in a worker thread, and the event loop waited for all of it.
_CLASS_WINDOW = 1 << 18


def _search_class(
    klass: re.Pattern[str], text: str, start: int, end: int | None = None
) -> re.Match[str] | None:
    """``klass.search(text, start, end)`` for a pattern of one character (a
    match cannot straddle two windows), :data:`_CLASS_WINDOW` characters at a
    time so that other threads run between two windows."""
    end = len(text) if end is None else min(end, len(text))
    while start < end:
        stop = min(start + _CLASS_WINDOW, end)
        if (m := klass.search(text, start, stop)) is not None:
            return m
        start = stop
    return None


def _skip_unmixed(longest: int) -> _Skip:
    """The ``skip`` of a :func:`_mixed_token` rule whose matches are at most
    ``longest`` characters long.

    A rejected match lacks a digit, an upper- or a lower-case letter in its
    tail; when it lacks one in its whole span, so does the text up to that
    class's next occurrence, and a match starting ``longest`` characters
    before it or earlier lies inside that text: rejected too.
    """

    def skip(m: re.Match[str], text: str) -> int:
        start, end = m.span()
        far = start + 1
        for klass in _CHARACTER_CLASSES:
            if klass.search(text, start, end) is None:
                after = _search_class(klass, text, end)
                far = max(far, len(text) if after is None else after.start() - longest + 1)
        return far

    return skip


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


RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        re.compile(
            r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"
            r"(?P<body>(?:[A-Za-z0-9+/=:,.()\s]|\\[nrt]|-(?!----))*+)"
            r"(?:-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----)?"
        ),
        check=_pem_body,
        needs="-",
    ),
    Rule(
        "aws_access_key_id",
        _token("A", r"(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])"),
        needs="A",
    ),
    Rule("github_token", _token("gh", r"[pousr]_[A-Za-z0-9]{36,255}+" + _E), needs="_"),
    Rule(
        "github_token",
        _token("github_pat_", r"[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _E),
        needs="_",
    ),
    Rule(
        "gitlab_token",
        _token(
            "gl",
            r"(?:pat|dt|rt|ptt|soat|ft)-[A-Za-z0-9_\-]{20,255}+(?:\.[0-9a-z]{2}\.[a-z0-9]{9})?",
        ),
        needs="-",
    ),
    Rule("slack_token", _token("x", r"(?:ox[abposre]|app)-[A-Za-z0-9\-]{10,255}+"), needs="-"),
    Rule(
        "slack_webhook",
        re.compile(
            r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+\-]{20,}+"
        ),
        needs=":",
    ),
    Rule("stripe_key", _token("sk_", r"(?:live|test)_[A-Za-z0-9]{10,255}+"), needs="_"),
    Rule("stripe_key", _token("rk_", r"(?:live|test)_[A-Za-z0-9]{10,255}+"), needs="_"),
    Rule("stripe_key", _token("whsec_", r"[A-Za-z0-9+/=]{24,}+"), needs="_"),
    Rule("google_api_key", _token("AIza", r"[A-Za-z0-9_\-]{35}" + _E), needs="A"),
    Rule(
        "openai_api_key",
        _token("sk-", r"(?P<ant>ant-)?(?:proj-|svcacct-|admin-)?(?P<tail>[A-Za-z0-9_\-]{20,255}+)"),
        check=_mixed_token,
        variant=("ant", "anthropic_api_key"),
        needs="-",
        skip=_skip_unmixed(len("sk-ant-svcacct-") + 255),
    ),
    Rule(
        "huggingface_token",
        _token("hf_", r"(?P<tail>[A-Za-z0-9]{34})" + _E),
        check=_mixed_token,
        needs="_",
        skip=_skip_unmixed(len("hf_") + 34),
    ),
    Rule(
        "npm_token",
        _token("npm_", r"(?P<tail>[A-Za-z0-9]{36})" + _E),
        check=_mixed_token,
        needs="_",
        skip=_skip_unmixed(len("npm_") + 36),
    ),
    Rule(
        "pypi_token",  # a macaroon whose location is pypi.org or test.pypi.org
        _token("pypi-Ag", r"(?:EIcHlwaS5vcmc|ENdGVzdC5weXBpLm9yZw)[A-Za-z0-9_\-]{50,}+"),
        needs="-",
    ),
    Rule(
        "jwt",
        _token(
            "eyJ",
            r"[A-Za-z0-9_\-]{8,}+\."
            r"(?:eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]*+"
            r"|[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+)"
            r"(?:\.[A-Za-z0-9_\-]++){0,2}",  # a JWE has five segments
        ),
        needs="J",
    ),
    Rule(
        "url_credentials",  # scheme://user:PASSWORD@host
        re.compile(r"://[^\s/:@\"'<>]{0,256}+:(?P<value>[^\s/:@\"'<>]{1,256}+)@"),
        group="value",
        check=_url_password,
        needs="@",
    ),
    Rule(
        "aws_secret_access_key",  # (AWS_)SECRET_ACCESS_KEY, SecretAccessKey, AWS_SECRET_KEY
        re.compile(
            r"(?i:secret_?(?P<access>access_?)?key)\\?[\"']?[ \t]*(?::|=>?)"
            r"[ \t]*\\?[\"']?(?P<value>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"
        ),
        group="value",
        check=_aws_secret,
        triggers=("secret",),
        needs=":=",
    ),
    Rule(
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
    Rule(
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
        triggers=("pass", "pwd", "secret", "token", "credential"),
        variant=("pw", "password_assignment"),
        key_words=("api", "access", "private", "signing", "encryption", "master", "auth"),
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
_CANDIDATE_HEAD = b"a" * ENTROPY_MIN_LENGTH
_CANDIDATE = re.compile(_CANDIDATE_HEAD + b"a*={0,2}")
_PIECES = re.compile(r"[-_/+]")
_NOT_DASH = re.compile(r"[^-]")


def _run_image(text: str) -> bytes:
    """``text`` as the bytes :data:`_CANDIDATE` reads: PEM armor (``-----``)
    blanked, since it ends a run, then each byte mapped by :data:`_RUN_IMAGE`.
    Made :data:`_CLASS_WINDOW` characters at a time (three calls over 15 MB
    held the interpreter 30-45 ms), each piece ending after a character that
    is not ``-``, so that no run of dashes is blanked differently; a piece
    grows to the end of a run of dashes it would cut."""
    pieces = []
    start = 0
    while start < len(text):
        end = min(start + _CLASS_WINDOW, len(text))
        if text[end - 1] == "-":
            after = _search_class(_NOT_DASH, text, end)
            end = len(text) if after is None else after.start()
        raw = text[start:end].encode("latin-1", "replace").replace(b"-----", b"     ")
        pieces.append(raw.translate(_RUN_IMAGE))
        start = end
    return b"".join(pieces)


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


def entropy_spans(text: str, found: list[tuple[int, int, str]]) -> Iterator[tuple[int, int, str]]:
    """The runs of ``text`` that look random, outside the spans already ``found``.

    Where a finding of another rule covers part of a run, only the pieces
    left beside it are judged, each as a run of its own: that is what a scan
    of the redacted text sees, so redacting never exposes a new finding.
    """
    public = [m.span() for m in _PUBLIC_PEM.finditer(text)] if "-----BEGIN" in text else []
    spans = sorted((a, b) for a, b, _ in found)
    starts = [a for a, _ in spans]
    reach = list(itertools.accumulate((b for _, b in spans), max))  # furthest end so far
    image = _run_image(text)
    # The first long enough run starts where its first ENTROPY_MIN_LENGTH "a"s
    # do; bytes.find gets there (or proves there is none) 3x faster than the regex.
    first = image.find(_CANDIDATE_HEAD)
    for run in _CANDIDATE.finditer(image, first) if first != -1 else ():
        start, end = run.span()
        if _search_class(_HAS_DIGIT, text, start, end) is None:  # nor has any piece of it
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
