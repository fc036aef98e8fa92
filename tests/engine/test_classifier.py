"""The secret classifier against a corpus of secrets and of ordinary agent text.

No provider-shaped secret appears literally in this file: each is assembled
at import time from the provider's public prefix and characters drawn from a
seeded generator. So the values have the right shape, and no secret scanner
mistakes this file for a leak. Speed is measured outside the tests; the one
test here about time guards against quadratic blow-up, not a figure.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import string
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longresponse.engine import classifier
from longresponse.engine.classifier import KINDS, Finding, Policy, redact, scan
from longresponse.engine.secret_rules import RULES

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
B64URL = B62 + "-_"
UPPER_DIGITS = string.ascii_uppercase + string.digits


def fake(alphabet: str, n: int, seed: int) -> str:
    """``n`` characters of ``alphabet``, the same on every run."""
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def pem(label: str, seed: int, lines: int = 6, sep: str = "\n") -> str:
    body = sep.join(fake(B64, 64, seed + i) for i in range(lines))
    return f"-----BEGIN {label}-----{sep}{body}{sep}-----END {label}-----"


AWS_ID = "AKIA" + fake(UPPER_DIGITS, 16, 1)
AWS_STS_ID = "ASIA" + "Z" * 16
AWS_SECRET = fake(B64, 40, 2)
GITHUB_PAT = "ghp_" + fake(B62, 36, 3)
GITHUB_FINE = "github_pat_" + fake(B62, 22, 4) + "_" + fake(B62, 59, 5)
GITLAB = "glpat-" + fake(B64URL, 20, 6)
SLACK_BOT = "xoxb-" + fake(string.digits, 12, 7) + "-" + fake(string.digits, 13, 8) + "-"
SLACK_BOT += fake(B62, 24, 9)
SLACK_HOOK = "https://hooks.slack.com/services/T" + fake(UPPER_DIGITS, 8, 10) + "/B"
SLACK_HOOK += fake(UPPER_DIGITS, 10, 11) + "/" + fake(B62, 24, 12)
STRIPE = "sk_live_" + fake(B62, 24, 13)
STRIPE_RESTRICTED = "rk_live_" + fake(B62, 24, 14)
GOOGLE = "AIza" + fake(B64URL, 35, 15)
OPENAI = "sk-" + fake(B62, 48, 16)
OPENAI_PROJECT = "sk-proj-" + fake(B64URL, 120, 17)
ANTHROPIC = "sk-ant-api03-" + fake(B64URL, 80, 18)
HUGGINGFACE = "hf_" + fake(B62, 34, 19)
NPM = "npm_" + fake(B62, 36, 20)
PYPI = "pypi-AgEIcHlwaS5vcmc" + fake(B64URL, 80, 21)
JWT = ".".join(
    (
        b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()),
        b64url(json.dumps({"sub": "1234567890", "name": "Test User", "iat": 1516239022}).encode()),
        b64url(random.Random(22).randbytes(32)),
    )
)
RANDOM_B62 = fake(B62, 40, 23)
RANDOM_B64 = base64.b64encode(random.Random(24).randbytes(30)).decode()
FERNET = base64.urlsafe_b64encode(random.Random(25).randbytes(32)).decode()  # 44, "=" padded
HEX_SECRET = random.Random(26).randbytes(32).hex()
RSA_KEY = pem("RSA PRIVATE KEY", 100)
EC_KEY = pem("EC PRIVATE KEY", 200, lines=3)
OPENSSH_KEY = pem("OPENSSH PRIVATE KEY", 300)
PKCS8_KEY = pem("PRIVATE KEY", 400)
ENCRYPTED_KEY = pem("ENCRYPTED PRIVATE KEY", 500)
PGP_KEY = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
    + "\n".join(fake(B64, 64, 600 + i) for i in range(5))
    + "\n="
    + fake(B64, 4, 650)
    + "\n-----END PGP PRIVATE KEY BLOCK-----"
)


# (kind, text, the secret inside it); the one finding must be exactly the secret.
POSITIVES: list[tuple[str, str, str]] = [
    ("private_key", f"Here is the key:\n{RSA_KEY}\nkeep it safe", RSA_KEY),
    ("private_key", f"$ cat id_ecdsa\n{EC_KEY}\n$ ", EC_KEY),
    ("private_key", f"{OPENSSH_KEY}\n", OPENSSH_KEY),
    ("private_key", f"key.pem:\n{PKCS8_KEY}", PKCS8_KEY),
    ("private_key", f"{ENCRYPTED_KEY} (encrypted)", ENCRYPTED_KEY),
    ("private_key", f"gpg --export-secret-keys -a\n{PGP_KEY}\n", PGP_KEY),
    (
        "private_key",  # a service-account JSON: the PEM is escaped inside a string
        '{"type": "service_account", "private_key": "'
        + pem("PRIVATE KEY", 700, sep="\\n")
        + '\\n", "client_email": "bot@example.iam.gserviceaccount.com"}',
        pem("PRIVATE KEY", 700, sep="\\n"),
    ),
    (
        "private_key",  # cut off by an output limit: no END line
        "-----BEGIN RSA PRIVATE KEY-----\n" + fake(B64, 64, 800) + "\n" + fake(B64, 30, 801),
        "-----BEGIN RSA PRIVATE KEY-----\n" + fake(B64, 64, 800) + "\n" + fake(B64, 30, 801),
    ),
    ("aws_access_key_id", f"export AWS_ACCESS_KEY_ID={AWS_ID}", AWS_ID),
    ("aws_access_key_id", f"temporary creds {AWS_STS_ID} expire soon", AWS_STS_ID),
    (
        "aws_secret_access_key",
        f"[default]\naws_secret_access_key = {AWS_SECRET}\nregion = us-east-1",
        AWS_SECRET,
    ),
    ("aws_secret_access_key", f'"SecretAccessKey": "{AWS_SECRET}",', AWS_SECRET),
    ("aws_secret_access_key", f"AWS_SECRET_KEY={AWS_SECRET}", AWS_SECRET),
    ("github_token", f"git clone https://x:{GITHUB_PAT}@github.com/o/r", GITHUB_PAT),
    ("github_token", f"token {GITHUB_FINE}.", GITHUB_FINE),
    ("github_token", "gho_" + fake(B62, 36, 30), "gho_" + fake(B62, 36, 30)),
    ("github_token", "(ghs_" + fake(B62, 36, 31) + ")", "ghs_" + fake(B62, 36, 31)),
    ("gitlab_token", f"PRIVATE-TOKEN: {GITLAB}", GITLAB),
    ("slack_token", f"SLACK_BOT={SLACK_BOT}", SLACK_BOT),
    ("slack_webhook", f"curl -X POST {SLACK_HOOK} -d @msg.json", SLACK_HOOK),
    ("stripe_key", f"stripe.api_key = '{STRIPE}'", STRIPE),
    ("stripe_key", f"restricted: {STRIPE_RESTRICTED}", STRIPE_RESTRICTED),
    ("google_api_key", f"https://maps.googleapis.com/maps/api/js?key={GOOGLE}&v=3", GOOGLE),
    ("openai_api_key", f"OPENAI_API_KEY={OPENAI}", OPENAI),
    ("openai_api_key", f'client = OpenAI(api_key="{OPENAI_PROJECT}")', OPENAI_PROJECT),
    ("anthropic_api_key", f"ANTHROPIC_API_KEY={ANTHROPIC}", ANTHROPIC),
    ("huggingface_token", f"huggingface-cli login --token {HUGGINGFACE}", HUGGINGFACE),
    ("npm_token", f"//registry.npmjs.org/:_authToken={NPM}", NPM),
    ("pypi_token", f"password = {PYPI}", PYPI),
    ("jwt", f'{{"id_token": "{JWT}"}}', JWT),
    ("authorization_header", f"-H 'Authorization: Bearer {RANDOM_B62}'", RANDOM_B62),
    ("authorization_header", "Authorization: Basic dXNlcjpodW50ZXIy\r\n", "dXNlcjpodW50ZXIy"),
    ("authorization_header", '"authorization": "token abcdef123456"', "abcdef123456"),
    ("url_credentials", "DATABASE_URL=postgres://app:s3cr3t-Pw@db.internal:5432/app", "s3cr3t-Pw"),
    ("url_credentials", "redis://:hunter2@cache:6379/0", "hunter2"),
    ("password_assignment", 'password = "hunter2"', "hunter2"),
    ("password_assignment", "DB_PASSWORD=s3cr3t!x", "s3cr3t!x"),
    (
        "password_assignment",
        '{"username": "admin", "password": "correct-horse-9"}',
        "correct-horse-9",
    ),
    ("password_assignment", "database:\n  passwd: Tr0ub4dor&3\n", "Tr0ub4dor&3"),
    ("password_assignment", "mysql --user root --password hunter22 db", "hunter22"),
    ("password_assignment", "PGPASSWORD=swordfish psql -h db", "swordfish"),
    ("password_assignment", 'admin_password: str = "hunter22"', "hunter22"),
    ("password_assignment", "login(user='bob', password='p4ssw0rd')", "p4ssw0rd"),
    ("password_assignment", '{\\"password\\": \\"hunter22\\"}', "hunter22"),
    ("password_assignment", "pin_password=83921176", "83921176"),
    ("password_assignment", "The password: hunter2.", "hunter2"),
    ("password_assignment", "İstanbul, Straße: password=hunter22", "hunter22"),
    ("secret_assignment", f'SECRET_KEY = "{HEX_SECRET}"', HEX_SECRET),
    ("secret_assignment", "client_secret: x9VkT2mLq8Rw", "x9VkT2mLq8Rw"),
    ("secret_assignment", "GET /feed?token=abc123def456&page=2", "abc123def456"),
    (
        "secret_assignment",
        "export DEPLOY_TOKEN='correct-horse-battery-staple'",
        "correct-horse-battery-staple",
    ),
    ("secret_assignment", "api-key: 0123456789abcdef", "0123456789abcdef"),
    ("secret_assignment", "credentials => 'u7Hh3kLp'", "u7Hh3kLp"),
    ("high_entropy_string", f"the value is {RANDOM_B62} ok", RANDOM_B62),
    ("high_entropy_string", f"blob: {RANDOM_B64}\n", RANDOM_B64),
    ("high_entropy_string", f"FERNET_KEY={FERNET}", FERNET),
    ("high_entropy_string", f"[{fake(B62, 24, 40)}]", fake(B62, 24, 40)),
]


@pytest.mark.parametrize(("kind", "text", "secret"), POSITIVES)
def test_finds_each_kind_at_exact_offsets(kind: str, text: str, secret: str) -> None:
    start = text.index(secret)
    assert scan(text) == [Finding(kind, start, start + len(secret))]


def test_every_kind_has_a_positive() -> None:
    assert {kind for kind, _, _ in POSITIVES} == set(KINDS)


def test_several_secrets_in_one_text_come_back_sorted_and_apart() -> None:
    text = f"a={AWS_ID}\nb: {GITHUB_PAT}\npassword = 'hunter22'\n{JWT}"
    assert scan(text) == [
        Finding("aws_access_key_id", 2, 22),
        Finding("github_token", 26, 66),
        Finding("password_assignment", 79, 87),
        Finding("jwt", 89, 89 + len(JWT)),
    ]


# Ordinary text of an agent rollout: none of it is a secret.
NEGATIVES: list[str] = [
    # prose
    "The quick brown fox jumps over the lazy dog. Rollouts stream tokens to the client, "
    "and the server keeps a rendered-token cache so that a continuation costs nothing.",
    "Enter your password: it must be at least 8 characters long. The secret: 42 is the answer.",
    "Tokens: the smallest unit the model sees. Pass: the test suite ran green.",
    "Use a bearer token in the Authorization header; never commit the API key.",
    # code that handles secrets without containing one
    "password = getpass.getpass()\ntoken = tokens[i]\nsecret = os.environ['SECRET']\n",
    "def check_password(password: str) -> bool:\n    return hmac.compare_digest(password, pw)\n",
    'api_key = os.environ["OPENAI_API_KEY"]\nclient = OpenAI(api_key=api_key)\n',
    "resp = client.responses.create(model=m, max_tokens=4096, token_budget=512)\n",
    "self.secret = secret\ncredentials=s3_credentials\nprivate_key: Ed25519PrivateKey\n",
    "token = next_token()\npassword = self.password\npasswd=None\nsecret_key = keys[0]\n",
    "if pem.startswith('-----BEGIN RSA PRIVATE KEY-----'):\n    raise ValueError(pem)\n",
    "PWD=/work/main\nOLDPWD=/root\nHOME=/root\nPATH=/usr/local/bin:/usr/bin\n",
    # placeholders
    'password = "<your-password>"\nAPI_KEY=${API_KEY}\ntoken: "YOUR_TOKEN_HERE"\n',
    'password: "********"\nsecret = "xxxxxxxxxxxx"\ncurl -H "Authorization: Bearer $TOKEN"\n',
    "postgres://user:password@localhost:5432/db and redis://[[username]:[password]]@host",
    # identifiers, paths, URLs, numbers
    "test_forks_after_in_place_continuation test_bad_input_gets_protocol_error",
    "CPyBytesWriter_WriteF64LE HTTP_414_REQUEST_URI_TOO_LONG PBESv2SHA256AndAES256CBC",
    "MLKEM768X25519PrivateKey gpt-4o-mini-transcribe-2025-12-15 x86_64-linux-gnu",
    "/usr/local/lib/python3.11/site-packages/longresponse/classifier.py",
    "C:\\Users\\runner\\AppData\\Local\\Temp\\pytest-of-runner\\pytest-0\\test_x0",
    "https://github.com/python-hyper/h11/blob/master/h11/_connection.py#L120",
    "https://example.com/search?q=python3+regex+lookbehind&page=2 and https://bob@example.com/",
    "1234567890123456789012345 3.14159265358979323846 2025-01-15T10:20:30.123456Z +1-555-0100",
    # hashes and ids
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8\nAuthor: A <a@example.com>",
    "e83c5163316f89bfbde7d9ab23ca2e25604af290 refs/heads/main",
    "sha256:" + random.Random(50).randbytes(32).hex(),
    "digest: "
    + random.Random(51).randbytes(32).hex()
    + " md5 "
    + random.Random(52).randbytes(16).hex(),
    '"integrity": "sha512-' + base64.b64encode(random.Random(53).randbytes(64)).decode() + '"',
    "golang.org/x/text v0.3.7 h1:" + base64.b64encode(random.Random(54).randbytes(32)).decode(),
    f"request {uuid.UUID(int=random.Random(55).getrandbits(128), version=4)} done",
    "123e4567-e89b-12d3-a456-426614174000 0x7FF8_0000_0000_0001 0xDEADBEEFCAFEBABE0123456789",
    '{"type": "function_call", "call_id": "call_' + fake(B62, 24, 56) + '"}',
    '{"id": "resp_' + random.Random(57).randbytes(24).hex() + '", "object": "response"}',
    "toolu_01" + fake(B62, 22, 58) + " msg_01" + fake(B62, 22, 59),
    # encoded text and public material
    base64.b64encode(b"The quick brown fox jumps over the lazy dog, twice over.").decode(),
    base64.b64encode(b'{"alg": "none", "typ": "text", "note": "hello world"}').decode(),
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk",
    pem("CERTIFICATE", 900),
    pem("PUBLIC KEY", 910),
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + fake(B64, 43, 920) + " me@host",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ" + fake(B64, 300, 921) + " me@host",
    # punycode, k8s names, versions, other scripts
    "xn--bcher-kva.example web-7d4b9c8f6d-x2v9k python3.11.7-1+deb12u1",
    "Die Straße ist gesperrt. İstanbul'da hava güzel. 日本語のテキストです。パスワードは秘密です。",
]


@pytest.mark.parametrize("text", NEGATIVES)
def test_ordinary_text_has_no_secret(text: str) -> None:
    assert scan(text) == []


def test_hex_is_never_high_entropy_but_is_a_secret_when_assigned() -> None:
    assert scan(f"sha {HEX_SECRET}") == []
    assert [f.kind for f in scan(f"TOKEN={HEX_SECRET}")] == ["secret_assignment"]


def test_overlapping_matches_merge_and_entropy_keeps_out_of_findings() -> None:
    # "api_key" assigns an OpenAI key: both rules match the same span.
    text = f'api_key = "{OPENAI}"'
    start = text.index(OPENAI)
    assert scan(text) == [Finding("openai_api_key", start, start + len(OPENAI))]
    # A random run glued to a key id: the rule's finding is exact, and the
    # rest of the run is judged on its own, as it would be once redacted.
    glued = AWS_ID + "/" + RANDOM_B62
    assert scan(glued) == [
        Finding("aws_access_key_id", 0, 20),
        Finding("high_entropy_string", 20, len(glued)),
    ]
    assert scan(AWS_ID + "/abc12") == [Finding("aws_access_key_id", 0, 20)]


def test_a_value_that_is_a_secret_once_its_neighbour_is_redacted_is_found() -> None:
    # "hunter2.x<random>" reads as attribute access, "hunter2." as a password.
    name_like = "x" + fake(B62, 24, 41)
    text = "password: hunter2." + name_like
    assert scan(text) == [
        Finding("password_assignment", 10, 17),
        Finding("high_entropy_string", 18, 18 + len(name_like)),
    ]


def test_redact_replaces_each_span_with_its_kind() -> None:
    text = f"id={AWS_ID} password: 'hunter22' end"
    assert redact(text, scan(text)) == (
        "id=[REDACTED:aws_access_key_id] password: '[REDACTED:password_assignment]' end"
    )
    assert redact(text, []) == text


def test_redact_accepts_findings_in_any_order() -> None:
    findings = [Finding("b", 4, 6), Finding("a", 0, 2)]
    assert redact("abcdefg", findings) == "[REDACTED:a]cd[REDACTED:b]g"


@pytest.mark.parametrize(
    "findings",
    [
        [Finding("a", 0, 3), Finding("b", 2, 4)],  # overlap
        [Finding("a", 5, 9)],  # past the end
        [Finding("a", 2, 2)],  # empty
        [Finding("a", -1, 2)],
    ],
)
def test_redact_refuses_spans_that_are_not_disjoint_spans_of_the_text(
    findings: list[Finding],
) -> None:
    with pytest.raises(ValueError, match="finding"):
        redact("abcdef", findings)


def test_public_api() -> None:
    assert set(classifier.__all__) >= {"Finding", "Policy", "scan", "redact", "KINDS"}
    for name in classifier.__all__:
        assert hasattr(classifier, name)
    assert [p.value for p in Policy] == ["flag", "redact", "refuse"]
    assert Policy("redact") is Policy.REDACT
    finding = Finding("jwt", 1, 2)
    with pytest.raises(AttributeError):
        finding.kind = "x"  # type: ignore[misc]
    assert not hasattr(finding, "__dict__")


ADVERSARIAL = [
    "eyJ",
    "password=",
    "token: a1",
    "sk-",
    "AKIA",
    "://a:b@",
    "-----BEGIN PRIVATE KEY-----",
    "-----BEGIN CERTIFICATE-----\nAAAA",
    "Authorization: Bearer ",
    "a" * 19 + " ",
    "A1b2" * 5 + "-",
    "İ",
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("unit", ADVERSARIAL)
def test_adversarial_repetition_scans_in_linear_time(unit: str) -> None:
    # 200 KB of one repeated unit. Linear scanning takes milliseconds;
    # a pattern that backtracks quadratically would take hours.
    text = unit * (200_000 // len(unit))
    check_well_formed(text, scan(text))


# --- properties ---------------------------------------------------------------

SECRETS = [secret for _, _, secret in POSITIVES]
FRAGMENTS = [
    *SECRETS,
    *(text for _, text, _ in POSITIVES),
    *NEGATIVES,
    *(s[: len(s) // 2] for s in SECRETS),
    "password",
    "PASSWORD",
    "api_key",
    "token",
    "secret",
    "Authorization: Bearer ",
    "bearer ",
    "://",
    "postgres://",
    "user",
    "?token=",
    "&",
    "--password ",
    "@",
    ":",
    "=",
    " = ",
    ": ",
    '"',
    "'",
    "\\",
    "\n",
    " ",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "[REDACTED:jwt]",
    "hunter2",
    "İ",
    "é",
    "日本",
]
texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=12).map("".join)


def check_well_formed(text: str, findings: list[Finding]) -> None:
    end = 0
    for f in findings:
        assert f.kind in KINDS
        assert end <= f.start < f.end <= len(text)
        end = f.end


@given(st.text())
def test_scan_accepts_any_text(text: str) -> None:
    check_well_formed(text, scan(text))


@given(texts)
def test_scan_of_mixed_fragments_is_well_formed(text: str) -> None:
    check_well_formed(text, scan(text))


@given(texts)
def test_redacted_text_has_no_secret_left(text: str) -> None:
    assert scan(redact(text, scan(text))) == []


words = st.text(alphabet=string.ascii_letters + " .,;!?()", max_size=30)


@given(words, st.sampled_from(POSITIVES), words)
def test_a_secret_is_covered_in_any_prose(
    before: str, positive: tuple[str, str, str], after: str
) -> None:
    # Covered, not exact: a PEM cut short takes in the base64-like words after it.
    kind, text, secret = positive
    text = f"{before} {text} {after}"
    start = text.index(secret)
    end = start + len(secret)
    assert any(f.kind == kind and f.start <= start and end <= f.end for f in scan(text))


def _needs_hold(text: str) -> None:
    """Every match a rule accepts, searched for anywhere (no shortcut), holds one
    of the characters the rule ``needs``: so skipping the rule on a text without
    them (the classifier's prefilter) can never lose a finding."""
    for rule in RULES:
        if not rule.needs:
            continue
        for m in rule.pattern.finditer(text):
            if rule.check is None or rule.check(m, text):
                assert any(c in m.group() for c in rule.needs), (rule.kind, m.group())


@pytest.mark.parametrize(("kind", "text", "secret"), POSITIVES)
def test_every_positive_holds_a_character_its_rule_needs(kind: str, text: str, secret: str) -> None:
    _needs_hold(text)


@given(texts)
def test_the_needs_prefilter_loses_nothing(text: str) -> None:
    _needs_hold(text)


# --- adversarial text (issue 20) ------------------------------------------------

_PIECES = ["sk-", "ant-", "proj-", "hf_", "npm_", "a", "B", "7", "-", "_", " ", "xyzw" * 20]


def scan_with(rules: tuple[Any, ...], text: str) -> list[Finding]:
    original = classifier.RULES
    classifier.RULES = rules  # type: ignore[misc]
    try:
        return scan(text)
    finally:
        classifier.RULES = original  # type: ignore[misc]


@given(st.lists(st.sampled_from(_PIECES), max_size=400))
def test_skipping_rejected_tokens_finds_what_a_rescan_finds(pieces: list[str]) -> None:
    """``Rule.skip`` only jumps over matches ``check`` would reject: the scan
    finds exactly what trying every later position finds."""
    text = "".join(pieces)
    slow_rules = tuple(dataclasses.replace(rule, skip=None) for rule in RULES)
    assert scan(text) == scan_with(slow_rules, text)


def test_a_run_of_token_prefixes_is_scanned_once() -> None:
    """15 MB of ``sk-sk-...`` took 16 s (each ``sk-`` rescanned 255 characters
    and was rejected); with ``skip`` it is one pass. Counted, not timed: the
    rule rejects a window's worth of matches (those whose 270 characters end
    just short of the key), not one per ``sk-``."""
    [rule] = [r for r in RULES if r.kind == "openai_api_key"]
    text = "sk-" * 100_000 + "sk-proj-" + "aB3" * 10
    calls = 0
    skip = rule.skip
    assert skip is not None

    def counted(m: Any, text: str) -> int:
        nonlocal calls
        calls += 1
        return skip(m, text)

    patched = tuple(dataclasses.replace(r, skip=counted) if r is rule else r for r in RULES)
    [found] = scan_with(patched, text)
    assert found.kind == "openai_api_key"
    assert found.end > text.index("aB3")  # the token's window reaches its random part
    assert calls <= 270 // len("sk-")  # the last window before the key, not one per sk-
    slow_rules = tuple(dataclasses.replace(r, skip=None) for r in RULES)
    assert scan_with(slow_rules, text) == [found]
