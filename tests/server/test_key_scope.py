"""With an API key set, /metrics and /docs (the OpenAPI pages and schema) take it too, unless
--metrics-without-key opens /metrics; the key can come from --api-key-file (a fake engine: no
model)."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from localchat.cli import app as cli_app
from localchat.errors import InvalidParameterError
from localchat.server.multimodel.router import ModelRouter

from .agent_fakes import FakeEngine, client

KEY = {"Authorization": "Bearer k"}


async def _statuses(http, headers=None) -> dict[str, int]:
    paths = ("/metrics", "/docs", "/docs/openapi.json", "/docs/swagger", "/health")
    return {p: (await http.get(p, headers=headers)).status_code for p in paths}


async def test_metrics_and_docs_take_the_key():
    async with client(FakeEngine(), api_key="k") as http:
        refused = await _statuses(http)
        allowed = await _statuses(http, KEY)
        wrong = await http.get("/docs/openapi.json", headers={"Authorization": "Bearer x"})
    assert refused == {
        "/metrics": 401,
        "/docs": 401,
        "/docs/openapi.json": 401,
        "/docs/swagger": 401,
        "/health": 200,
    }
    assert allowed["/metrics"] == 200 and allowed["/docs/openapi.json"] == 200
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"


async def test_metrics_without_key_opens_metrics_alone():
    async with client(FakeEngine(), api_key="k", metrics_without_key=True) as http:
        statuses = await _statuses(http)
    assert statuses["/metrics"] == 200 and statuses["/docs/openapi.json"] == 401


async def test_without_a_key_everything_is_open():
    async with client(FakeEngine()) as http:
        statuses = await _statuses(http)
    assert statuses["/metrics"] == 200 and statuses["/docs/openapi.json"] == 200


class _Pool:
    names, loaded, keep_alive, evictions = ["m"], {}, {"m": None}, 0


async def test_the_routers_metrics_flag():
    for flag, expected in ((False, 401), (True, 200)):
        router = ModelRouter(_Pool(), api_key="k", metrics_without_key=flag)  # type: ignore[arg-type]
        transport = httpx.ASGITransport(app=router)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as http:
            assert (await http.get("/metrics")).status_code == expected
            assert (await http.get("/v1/models")).status_code == 401


def test_the_key_file(tmp_path):
    from localchat.server.cli import _api_key

    path = tmp_path / "key"
    path.write_text("  s3cret  \nignored\n")
    assert _api_key(None, path) == "s3cret"
    assert _api_key("given", None) == "given" and _api_key("", None) is None
    with pytest.raises(InvalidParameterError, match="not both"):
        _api_key("given", path)
    path.write_text("\n")
    with pytest.raises(InvalidParameterError, match="no key"):
        _api_key(None, path)
    with pytest.raises(InvalidParameterError, match="cannot read"):
        _api_key(None, tmp_path / "missing")


def test_serve_refuses_an_unreadable_key_file_before_loading(tmp_path):
    result = CliRunner().invoke(
        cli_app, ["serve", "--port", "0", "--api-key-file", str(tmp_path / "missing")]
    )
    assert result.exit_code != 0 and "cannot read --api-key-file" in result.output, result.output
