"""The TLS context the upstream clients of this process share.

Building one (``httpx.create_ssl_context``: the CA bundle read and parsed)
costs 30-40 ms of CPU, and every backend keeps two clients (one that keeps
connections, one for the retry on a fresh one), so each server start paid it
twice per backend. An :class:`ssl.SSLContext` holds settings and the trust
store, no connection's state, and is safe to share between clients and
connections: it is built once, on first use, as httpx builds its default
(``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` are read then).

It is for clients that speak HTTP/1.1 and present no certificate of their
own: a client that needs HTTP/2 or a client certificate would change the
context for every backend (``load_cert_chain``, ALPN), so it makes its own.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["client_context"]


@functools.cache
def client_context() -> ssl.SSLContext:
    """The process's one context for verifying upstream servers."""
    return httpx.create_ssl_context()
