"""Bad input gets its status and an OpenAI error body, never a 500; the server keeps serving
afterwards."""

from __future__ import annotations

import httpx
import pytest

from .conftest import MAX_MODEL_LEN

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

CASES = [
    # (id, path, json body or raw bytes, status, param)
    ("invalid-json", CHAT, b'{"messages": [', 400, None),
    ("body-not-object", CHAT, [1, 2], 400, None),
    ("missing-messages", CHAT, {"model": None}, 400, "messages"),
    ("malformed-temperature", CHAT, {"messages": USER, "temperature": "hot"}, 400, "temperature"),
    ("malformed-content", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, None),
    (
        "image-part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages",
    ),
    ("unknown-role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("empty-messages", CHAT, {"messages": []}, 400, "messages"),
    ("temperature-low", CHAT, {"messages": USER, "temperature": -0.5}, 400, "temperature"),
    ("temperature-high", CHAT, {"messages": USER, "temperature": 1000}, 400, "temperature"),
    ("top-p-zero", CHAT, {"messages": USER, "top_p": 0}, 400, "top_p"),
    ("top-p-high", CHAT, {"messages": USER, "top_p": 1.5}, 400, "top_p"),
    ("n-zero", CHAT, {"messages": USER, "n": 0}, 400, "n"),
    ("max-tokens-zero", CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
    (
        "max-completion-tokens-negative",
        CHAT,
        {"messages": USER, "max_completion_tokens": -3},
        400,
        "max_completion_tokens",
    ),
    (
        "top-logprobs-21",
        CHAT,
        {"messages": USER, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    (
        "top-logprobs-without-logprobs",
        CHAT,
        {"messages": USER, "top_logprobs": 2},
        400,
        "top_logprobs",
    ),
    ("seed-over-int64", CHAT, {"messages": USER, "seed": 2**63}, 400, "seed"),
    ("seed-under-int64", CHAT, {"messages": USER, "seed": -(2**63) - 1}, 400, "seed"),
    (
        "stream-options-without-stream",
        CHAT,
        {"messages": USER, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ("presence-penalty", CHAT, {"messages": USER, "presence_penalty": 3}, 400, "presence_penalty"),
    (
        "template-kwargs-clash",
        CHAT,
        {"messages": USER, "chat_template_kwargs": {"messages": []}},
        400,
        "chat_template_kwargs",
    ),
    ("unknown-model", CHAT, {"messages": USER, "model": "gpt-9"}, 404, "model"),
    ("completion-bad-prompt", COMPLETIONS, {"prompt": [["a"], 1]}, 400, "prompt"),
    ("completion-missing-prompt", COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    ("completion-empty-prompt", COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    ("completion-token-out-of-vocab", COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    ("completion-logprobs-21", COMPLETIONS, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("completion-unknown-model", COMPLETIONS, {"prompt": "x", "model": "nope"}, 404, "model"),
    ("tokenize-neither", "/tokenize", {}, 400, "prompt"),
    ("detokenize-out-of-vocab", "/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("unknown-route", "/v1/nothing", {}, 404, None),
    # OpenAI's ranges, and the fields of constrained decoding and tool calls
    ("temperature-over-2", CHAT, {"messages": USER, "temperature": 2.5}, 400, "temperature"),
    (
        "completion-temperature-3",
        COMPLETIONS,
        {"prompt": "x", "temperature": 3},
        400,
        "temperature",
    ),
    (
        "frequency-penalty",
        CHAT,
        {"messages": USER, "frequency_penalty": -3},
        400,
        "frequency_penalty",
    ),
    ("n-200", CHAT, {"messages": USER, "n": 200}, 400, "n"),
    ("logit-bias-key", CHAT, {"messages": USER, "logit_bias": {"hi": 1}}, 400, "logit_bias"),
    ("logit-bias-value", CHAT, {"messages": USER, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    (
        "logit-bias-vocab",
        CHAT,
        {"messages": USER, "logit_bias": {"99999999": 1}},
        400,
        "logit_bias",
    ),
    (
        "allowed-ids-empty",
        CHAT,
        {"messages": USER, "allowed_token_ids": []},
        400,
        "allowed_token_ids",
    ),
    (
        "allowed-ids-vocab",
        COMPLETIONS,
        {"prompt": "x", "allowed_token_ids": [10**8]},
        400,
        "allowed_token_ids",
    ),
    ("bad-words-empty", CHAT, {"messages": USER, "bad_words": [""]}, 400, "bad_words"),
    (
        "response-format-type",
        CHAT,
        {"messages": USER, "response_format": {"type": "xml"}},
        400,
        "response_format",
    ),
    (
        "json-schema-missing",
        CHAT,
        {"messages": USER, "response_format": {"type": "json_schema"}},
        400,
        "response_format",
    ),
    (
        "json-schema-invalid",
        COMPLETIONS,
        {
            "prompt": "x",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "strin"}},
            },
        },
        400,
        "response_format",
    ),
    (
        "structured-two-kinds",
        CHAT,
        {"messages": USER, "structured_outputs": {"regex": "a", "choice": ["b"]}},
        400,
        "structured_outputs",
    ),
    (
        "structured-bad-regex",
        CHAT,
        {"messages": USER, "structured_outputs": {"regex": "a("}},
        400,
        "structured_outputs",
    ),
    (
        "structured-bad-grammar",
        CHAT,
        {"messages": USER, "structured_outputs": {"grammar": "start: nothing"}},
        400,
        "structured_outputs",
    ),
    ("guided-choice-empty", CHAT, {"messages": USER, "guided_choice": []}, 400, "guided_choice"),
    ("guided-json-text", COMPLETIONS, {"prompt": "x", "guided_json": "{no"}, 400, "guided_json"),
    (
        "two-constraints",
        CHAT,
        {"messages": USER, "guided_regex": "a", "response_format": {"type": "json_object"}},
        400,
        "guided_regex",
    ),
    (
        "tool-choice-no-tools",
        CHAT,
        {"messages": USER, "tool_choice": "required"},
        400,
        "tool_choice",
    ),
    (
        "tool-choice-word",
        CHAT,
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "always",
        },
        400,
        "tool_choice",
    ),
    (
        "tool-choice-unknown-name",
        CHAT,
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
    ),
    ("tools-malformed", CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools"),
    # a single-model server keeps its model loaded, but a bad keep_alive is still named
    ("keep-alive-word", CHAT, {"messages": USER, "keep_alive": "soon"}, 400, "keep_alive"),
    ("keep-alive-bool", COMPLETIONS, {"prompt": "x", "keep_alive": True}, 400, "keep_alive"),
    (
        "tools-and-json",
        CHAT,
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        400,
        "response_format",
    ),
]


def _check_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"]
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize(
    "path,body,status,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(http, path, body, status, param):
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = http.post(path, json=body)
    _check_error(response, status, param)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_prompt_longer_than_context(http, path):
    text = "hello " * (MAX_MODEL_LEN + 50)
    body = {"messages": [{"role": "user", "content": text}]} if path == CHAT else {"prompt": text}
    message = _check_error(http.post(path, json=body), 400)["message"]
    prompt_tokens = http.post("/tokenize", json={k: v for k, v in body.items()}).json()["count"]
    assert str(prompt_tokens) in message and str(MAX_MODEL_LEN) in message
    # room for the prompt but not for max_tokens: both lengths named too
    short = {"prompt": "hello " * 1000, "max_tokens": 100}
    message = _check_error(http.post(COMPLETIONS, json=short), 400, "max_tokens")["message"]
    assert "100" in message and str(MAX_MODEL_LEN) in message


@pytest.mark.parametrize(
    "path,method",
    [
        (CHAT, "POST"),
        (COMPLETIONS, "POST"),
        ("/v1/models", "GET"),
        ("/tokenize", "POST"),
        ("/detokenize", "POST"),
    ],
)
def test_api_key_required(base_url, path, method):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic test-key-123"}):
        response = httpx.request(method, f"{base_url}{path}", json={"prompt": "x"}, headers=headers)
        _check_error(response, 401)


@pytest.mark.parametrize("path", ["/health", "/version", "/metrics"])
def test_open_endpoints(base_url, path):
    assert httpx.get(f"{base_url}{path}").status_code == 200


def test_server_still_serves_after_bad_input(http):
    for case in CASES[:5]:
        http.post(case[1], json=case[2]) if not isinstance(case[2], bytes) else http.post(
            case[1], content=case[2]
        )
    response = http.post(CHAT, json={"messages": USER, "max_tokens": 3, "temperature": 0})
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] <= 3
    assert http.get("/health").status_code == 200


def test_a_good_keep_alive_is_accepted(http):
    for value in ("5m", 0, -1):
        response = http.post(CHAT, json={"messages": USER, "max_tokens": 2, "keep_alive": value})
        assert response.status_code == 200, response.text
