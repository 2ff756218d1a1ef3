"""A several-model server's router in front of /v1/messages and /v1/responses: Anthropic's error
shape and x-api-key on the Messages paths, the stored responses served from the store every
model's app shares (a fake pool: no model)."""

from __future__ import annotations

import httpx

from localchat.errors import ModelNotFoundError
from localchat.server.multimodel.router import ModelRouter
from localchat.server.responses.routes import stored_responses_app
from localchat.server.responses.store import MemoryResponseStore

from .agent_fakes import MODEL

MESSAGES = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}
RESPONSES = {"model": MODEL, "input": "Hi"}


class _Pool:
    """The router's view of an EnginePool that serves nothing."""

    names, loaded, keep_alive, evictions = ["m"], {}, {"m": None}, 0

    async def acquire(self, name, keep_alive):
        raise ModelNotFoundError(f"the model {name!r} does not exist", param="model")


async def test_the_router_routes_both_apis():
    router = ModelRouter(_Pool(), api_key="k", stored=stored_responses_app(MemoryResponseStore()))
    transport = httpx.ASGITransport(app=router)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as http:
        unknown = await http.post(
            "/v1/messages", json={**MESSAGES, "model": "x"}, headers={"x-api-key": "k"}
        )
        refused = await http.post("/v1/messages", json=MESSAGES, headers={"x-api-key": "no"})
        response = await http.post(
            "/v1/responses", json={**RESPONSES, "model": "x"}, headers={"x-api-key": "k"}
        )
        stored = await http.get("/v1/responses/resp_x", headers={"Authorization": "Bearer k"})
    assert unknown.status_code == 404
    assert (
        unknown.json()["error"]["type"] == "not_found_error" and unknown.json()["type"] == "error"
    )
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert response.status_code == 401  # x-api-key is Anthropic's header only
    assert stored.status_code == 404 and stored.json()["error"]["message"]
