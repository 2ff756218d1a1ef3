"""What a browser page could send to a loopback server: a rebound DNS name in Host (403), a body
not declared JSON (415), a cross-origin read without --cors-origin (no CORS headers). Through httpx
against the app in process, as uvicorn runs it (build_asgi_app)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from localchat.server.app import build_asgi_app
from localchat.server.request_guard import allowed_hosts, host_name, is_loopback
from localchat.server.state import ServerState

from .agent_fakes import MODEL, FakeEngine

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _client(
    bind: str = "127.0.0.1", extra: list[str] | None = None, cors: list[str] | None = None
) -> httpx.AsyncClient:
    app = build_asgi_app(
        ServerState(FakeEngine(), MODEL), cors_origins=cors, hosts=allowed_hosts(bind, extra)
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "127.0.0.1:1", "[::1]:8000", "[::1]", "LocalHost."]
)
async def test_loopback_names_are_answered(host):
    async with _client() as client:
        response = await client.post("/v1/chat/completions", json=CHAT, headers={"Host": host})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.2", "[::2]"]
)
async def test_other_hosts_get_403_on_a_loopback_bind(host):
    async with _client() as client:
        for method, path, body in (
            ("POST", "/v1/chat/completions", CHAT),
            ("GET", "/v1/models", None),
            ("GET", "/metrics", None),
        ):
            response = await client.request(method, path, json=body, headers={"Host": host})
            assert response.status_code == 403
            error = response.json()["error"]
            assert error["code"] == 403 and error["type"] == "permission_error"
            assert "--allowed-hosts" in error["message"]
        response = await client.post("/v1/messages", json=MESSAGES, headers={"Host": host})
    assert response.status_code == 403
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "permission_error"


async def test_allowed_hosts_add_names():
    async with _client(extra=["chat.internal", "Box.Lan:8080"]) as client:
        for host, status in (("chat.internal:8000", 200), ("box.lan", 200), ("evil.example", 403)):
            response = await client.post("/v1/chat/completions", json=CHAT, headers={"Host": host})
            assert response.status_code == status, host


async def test_beyond_loopback_any_host_unless_allowed_hosts_are_given():
    async with _client(bind="0.0.0.0") as client:
        response = await client.get("/v1/models", headers={"Host": "192.168.1.5:8000"})
    assert response.status_code == 200
    async with _client(bind="0.0.0.0", extra=["gpu-box"]) as client:
        assert (await client.get("/v1/models", headers={"Host": "gpu-box"})).status_code == 200
        assert (await client.get("/v1/models", headers={"Host": "other"})).status_code == 403
    async with _client(extra=["*"]) as client:
        assert (await client.get("/v1/models", headers={"Host": "anything"})).status_code == 200


def test_host_rules():
    assert host_name("[::1]:8000") == "::1" and host_name("LOCALHOST:80") == "localhost"
    assert host_name("127.0.0.1") == "127.0.0.1" and host_name("example.com.") == "example.com"
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.com"))
    assert allowed_hosts("0.0.0.0", None) is None and allowed_hosts("127.0.0.1", ["*"]) is None


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
async def test_a_body_not_declared_json_gets_415(path, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = b'{"model": "fake", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}'
    async with _client() as client:
        response = await client.post(path, content=body, headers=headers)
    assert response.status_code == 415
    if path == "/v1/messages":
        assert response.json()["error"]["type"] == "invalid_request_error"
    else:
        error = response.json()["error"]
        assert error["code"] == 415 and "application/json" in error["message"]


async def test_json_with_a_charset_is_accepted():
    async with _client() as client:
        response = await client.post(
            "/v1/chat/completions",
            content=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
    assert response.status_code == 200, response.text


async def test_cors_stays_off_without_cors_origin():
    preflight = {
        "Origin": "https://evil.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    async with _client() as client:
        response = await client.options("/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in response.headers
        response = await client.get("/v1/models", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in response.headers
    async with _client(cors=["https://app.example"]) as client:
        preflight["Origin"] = "https://app.example"
        response = await client.options("/v1/chat/completions", headers=preflight)
    assert response.headers["access-control-allow-origin"] == "https://app.example"


async def test_the_official_sdks_pass_both_checks():
    """openai and anthropic (on httpx2, an httpx of its own) send application/json."""
    import httpx2

    app = build_asgi_app(ServerState(FakeEngine(), MODEL), hosts=allowed_hosts("127.0.0.1", None))
    base = "http://localhost:8000"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base) as http:
        chat = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", http_client=http)
        reply = await chat.chat.completions.create(**CHAT)
    assert reply.choices[0].message.content == "Hi!"
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url=base) as http2:
        messages = anthropic.AsyncAnthropic(base_url=base, api_key="x", http_client=http2)
        message = await messages.messages.create(**MESSAGES)
    assert message.content[0].text == "Hi!"
