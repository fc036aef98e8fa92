"""The server's HTTP refusal, as every test checks it.

A refused request gets the OpenAI error envelope: ``{"error": {"type":
"invalid_request_error", "code", "param", "message"}}`` with its status.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["assert_refused"]


def assert_refused(
    reply: httpx.Response, code: str, param: str | None, *, status: int = 400
) -> dict[str, Any]:
    """Assert that ``reply`` is a refusal with ``status``, ``code`` and ``param``,
    typed ``invalid_request_error`` and with a message; return its ``error``."""
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert error["message"]
    return error
