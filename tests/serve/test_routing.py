"""Routing answers in the shipped error envelope: 404, then the API key (401), then 405."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import websockets
from websockets.sync.client import connect as ws_connect

from tests.conftest import openai_client

KNOWN = [
    ("GET", "/v1/models"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/responses/input_tokens"),
    ("GET", "/v1/responses/resp_x"),
    ("DELETE", "/v1/responses/resp_x"),
    ("GET", "/v1/responses/resp_x/input_items"),
    ("POST", "/v1/responses/resp_x/cancel"),
]


def envelope(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = reply.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (code, "invalid_request_error", None)
    assert error["message"]
    return error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/nope"),
        ("POST", "/v1/response"),
        ("GET", "/"),
        ("PUT", "/v1/responses/a/b/c"),
        ("GET", "/v1/responses/input_tokens/x"),
    ],
)
def test_unknown_route_is_404(server: Any, method: str, path: str) -> None:
    reply = httpx.request(method, f"{server.http_url}{path}", timeout=10)
    error = envelope(reply, 404, "unknown_url")
    assert error["message"] == f"Invalid URL ({method} {path})."


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/responses", "POST"),
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("PUT", "/v1/responses/resp_x", "DELETE, GET, HEAD"),
        ("POST", "/v1/responses/resp_x/input_items", "GET, HEAD"),
        ("GET", "/v1/responses/resp_x/cancel", "POST"),
    ],
)
def test_known_route_wrong_method_is_405(server: Any, method: str, path: str, allow: str) -> None:
    reply = httpx.request(method, f"{server.http_url}{path}", timeout=10)
    envelope(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == allow
    # The same route with its method works.
    assert httpx.get(f"{server.http_url}/v1/models", timeout=10).status_code == 200


def test_official_sdk_sees_the_envelope(server: Any) -> None:
    client = openai_client(server)
    with pytest.raises(openai.NotFoundError) as missing:
        client.get("/nope", cast_to=object)
    assert missing.value.code == "unknown_url"
    with pytest.raises(openai.APIStatusError) as method:
        client.delete("/models", cast_to=object)
    assert method.value.status_code == 405
    assert method.value.code == "method_not_allowed"


def test_keys_are_checked_before_routing_answers(make_server: Any) -> None:
    keyed = make_server(api_keys=("right",))
    with httpx.Client(base_url=keyed.http_url, timeout=10) as http:
        for method, path in KNOWN:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "right"}):
                envelope(http.request(method, path, headers=headers), 401, "invalid_api_key")
        # An unknown route is 404 whatever the key; a wrong method needs the key first.
        envelope(http.get("/v1/nope"), 404, "unknown_url")
        envelope(http.delete("/v1/models"), 401, "invalid_api_key")
        right = {"authorization": "Bearer right"}
        envelope(http.delete("/v1/models", headers=right), 405, "method_not_allowed")
        assert http.get("/v1/models", headers=right).status_code == 200
        assert http.get("/healthz", headers=right).json()["status"] == "ok"
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, "wrong").models.list()
    assert [m.id for m in openai_client(keyed, "right").models.list()] == ["sim", "sim-alt"]


def test_websocket_upgrade_to_an_unknown_path_is_404(make_server: Any) -> None:
    keyed = make_server(api_keys=("right",))
    base = f"ws://127.0.0.1:{keyed.port}"
    with pytest.raises(websockets.InvalidStatus) as unknown:
        ws_connect(f"{base}/v1/nope", additional_headers={"authorization": "Bearer right"})
    assert unknown.value.response.status_code == 404
    assert b'"unknown_url"' in unknown.value.response.body
    with pytest.raises(websockets.InvalidStatus) as unauthorized:
        ws_connect(f"{base}/v1/responses")
    assert unauthorized.value.response.status_code == 401
    with ws_connect(f"{base}/v1/responses", additional_headers={"authorization": "Bearer right"}):
        pass
