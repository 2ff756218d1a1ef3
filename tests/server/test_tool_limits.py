"""A request's tools are bounded (engine/sampling/request_limits.py): at most 128 of them and
256 KiB of JSON by default (serve --limit tools=N,tools_bytes=N sets others); past
either, every API that renders tools answers a 400 naming `tools`, in its own error shape, before
the chat template sees them."""

from __future__ import annotations

import pytest

from localchat.engine.sampling.request_limits import DEFAULTS as LIMITS

MODEL = "SmolLM2-135M-Instruct"  # the served model
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def _openai_tool(i: int, description: str = "") -> dict:
    function = {"name": f"tool_{i}", "description": description, "parameters": SCHEMA}
    return {"type": "function", "function": function}


def _body(path: str, count: int, description: str = "") -> dict:
    """A request to `path` with `count` tools, each described by `description`."""
    if path == "/v1/messages":
        tools = [
            {"name": f"tool_{i}", "description": description, "input_schema": SCHEMA}
            for i in range(count)
        ]
        return {"model": MODEL, "messages": ASK, "max_tokens": 4, "tools": tools}
    if path == "/v1/responses":
        tools = [
            {"type": "function", **_openai_tool(i, description)["function"]} for i in range(count)
        ]
        return {"input": "What is the weather in Paris?", "max_output_tokens": 16, "tools": tools}
    tools = [_openai_tool(i, description) for i in range(count)]
    return {"messages": ASK, "max_tokens": 4, "tools": tools}


def _message(response) -> str:
    """The error's message, after checking its status and that it names `tools`."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if response.request.url.path.startswith("/v1/messages"):  # Anthropic's shape
        assert response.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["type"] == "invalid_request_error" and error["param"] == "tools", error
    assert "tools" in error["message"]
    return error["message"]


PATHS = [
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/tokenize",
]


@pytest.mark.parametrize("path", PATHS)
def test_more_tools_than_the_bound_are_a_400_naming_tools(http, path):
    body = _body("/v1/messages" if path.startswith("/v1/messages") else path, LIMITS.tools + 1)
    if path in ("/v1/messages/count_tokens", "/tokenize"):
        body.pop("max_tokens")
    message = _message(http.post(path, json=body))
    assert f"at most {LIMITS.tools} tools, got {LIMITS.tools + 1}" in message


@pytest.mark.parametrize("path", PATHS)
def test_tools_larger_than_the_bound_are_a_400_naming_tools(http, path):
    # two tools whose descriptions take 200 KiB each (under 128 tools, over 256 KiB)
    body = _body("/v1/messages" if path.startswith("/v1/messages") else path, 2, "é" * (100 << 10))
    if path in ("/v1/messages/count_tokens", "/tokenize"):
        body.pop("max_tokens")
    message = _message(http.post(path, json=body))
    assert f"at most {LIMITS.tools_bytes} bytes of JSON, got " in message


def test_the_bound_itself_is_allowed(http):
    """128 tools pass (checked on /tokenize, where no context length applies)."""
    tools = [_openai_tool(i) for i in range(LIMITS.tools)]
    response = http.post("/tokenize", json={"messages": ASK, "tools": tools})
    assert response.status_code == 200, response.text
