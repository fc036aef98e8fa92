"""The upstream clients of a process share one TLS context
(``longresponse/backends/tls.py``): building one reads the CA bundle (30-40 ms
of CPU), and every backend keeps two clients."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from longresponse.backends import tls
from longresponse.backends.chat import ChatBackend
from longresponse.backends.responses_http import ResponsesBackend
from longresponse.config import BackendConfig


@pytest.fixture
def contexts_built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ssl.SSLContext]]:
    """Every SSL context made while the test runs, with the shared one forgotten."""
    built: list[ssl.SSLContext] = []
    make = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = make(*args, **kwargs)
        built.append(context)
        return context

    monkeypatch.setattr(ssl, "create_default_context", counted)
    tls.client_context.cache_clear()
    yield built
    tls.client_context.cache_clear()


async def test_backends_build_one_context_between_them(
    contexts_built: list[ssl.SSLContext],
) -> None:
    backends = [
        ChatBackend(BackendConfig(name=f"chat-{i}", kind="chat", base_url="https://a.test/v1"))
        for i in range(3)
    ] + [
        ResponsesBackend(
            BackendConfig(name=f"resp-{i}", kind="responses", base_url="https://b.test/v1")
        )
        for i in range(2)
    ]
    try:
        assert len(contexts_built) == 1  # not two for each of the five backends
        assert contexts_built[0] is tls.client_context()
        assert contexts_built[0].verify_mode == ssl.CERT_REQUIRED  # still verifying
    finally:
        for backend in backends:
            await backend.aclose()
