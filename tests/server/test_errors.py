"""Bad input gets its status and an OpenAI error body, never a 500; the server keeps serving
afterwards."""

from __future__ import annotations

import httpx
import pytest

from .conftest import MAX_MODEL_LEN

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

F_TOOL = [{"type": "function", "function": {"name": "f"}}]
# a schema nesting 67 objects deep (each level an object and its properties; the limit is 64), in
# a body nesting 71 deep (within the body's limit, 128)
DEEP: dict = {"type": "object"}
for _ in range(33):
    DEEP = {"type": "object", "properties": {"a": DEEP}}


def _chat(case_id: str, param: str, **fields) -> tuple:
    """A case: USER's chat request with `fields`, a 400 naming `param`."""
    return (case_id, CHAT, {"messages": USER, **fields}, 400, param)


def _completion(case_id: str, param: str, **fields) -> tuple:
    """A case: a completion of "x" with `fields` (which may replace the prompt), a 400 naming
    `param`."""
    return (case_id, COMPLETIONS, {"prompt": "x", **fields}, 400, param)


CASES = [
    # (id, path, json body or raw bytes, status, param)
    ("invalid-json", CHAT, b'{"messages": [', 400, None),
    ("body-not-object", CHAT, [1, 2], 400, None),
    ("missing-messages", CHAT, {"model": None}, 400, "messages"),
    _chat("malformed-temperature", "temperature", temperature="hot"),
    ("malformed-content", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, None),
    _chat(
        "image-part",
        "messages[0].content[0].image_url",
        messages=[{"role": "user", "content": [{"type": "image_url"}]}],
    ),
    _chat("unknown-role", "messages", messages=[{"role": "wizard", "content": "x"}]),
    _chat("empty-messages", "messages", messages=[]),
    _chat("temperature-low", "temperature", temperature=-0.5),
    _chat("temperature-high", "temperature", temperature=1000),
    _chat("top-p-zero", "top_p", top_p=0),
    _chat("top-p-high", "top_p", top_p=1.5),
    _chat("n-zero", "n", n=0),
    _chat("max-tokens-zero", "max_tokens", max_tokens=0),
    _chat("max-completion-tokens-negative", "max_completion_tokens", max_completion_tokens=-3),
    _chat("top-logprobs-21", "top_logprobs", logprobs=True, top_logprobs=21),
    _chat("top-logprobs-without-logprobs", "top_logprobs", top_logprobs=2),
    _chat("seed-over-int64", "seed", seed=2**63),
    _chat("seed-under-int64", "seed", seed=-(2**63) - 1),
    _chat(
        "stream-options-without-stream", "stream_options", stream_options={"include_usage": True}
    ),
    _chat("presence-penalty", "presence_penalty", presence_penalty=3),
    _chat("template-kwargs-clash", "chat_template_kwargs", chat_template_kwargs={"messages": []}),
    ("unknown-model", CHAT, {"messages": USER, "model": "gpt-9"}, 404, "model"),
    _completion("completion-bad-prompt", "prompt", prompt=[["a"], 1]),
    ("completion-missing-prompt", COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    _completion("completion-empty-prompt", "prompt", prompt=""),
    _completion("completion-token-out-of-vocab", "prompt", prompt=[10**9]),
    _completion("completion-logprobs-21", "logprobs", logprobs=21),
    ("completion-unknown-model", COMPLETIONS, {"prompt": "x", "model": "nope"}, 404, "model"),
    ("tokenize-neither", "/tokenize", {}, 400, "prompt"),
    ("detokenize-out-of-vocab", "/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("unknown-route", "/v1/nothing", {}, 404, None),
    # OpenAI's ranges, and the fields of constrained decoding and tool calls
    _chat("temperature-over-2", "temperature", temperature=2.5),
    _completion("completion-temperature-3", "temperature", temperature=3),
    _chat("frequency-penalty", "frequency_penalty", frequency_penalty=-3),
    _chat("n-200", "n", n=200),
    _chat("logit-bias-key", "logit_bias", logit_bias={"hi": 1}),
    _chat("logit-bias-value", "logit_bias", logit_bias={"5": 101}),
    _chat("logit-bias-vocab", "logit_bias", logit_bias={"99999999": 1}),
    _chat("logit-bias-superscript-key", "logit_bias", logit_bias={"\u00b2": 1}),
    _chat("logit-bias-too-many", "logit_bias", logit_bias={str(i): 1 for i in range(1025)}),
    (
        "nested-50000-deep",
        CHAT,
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
        b'"function": {"name": "f", "parameters": {"a": ' + b"[" * 50000 + b"]" * 50000 + b"}}}]}",
        400,
        None,
    ),
    _completion(
        "json-schema-67-deep",
        "response_format",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}},
    ),
    # bounded work per request (engine/sampling/request_limits.py)
    _chat("stop-too-many", "stop", stop=[f"s{i}" for i in range(65)]),
    _chat("stop-too-long", "stop", stop=["x" * 1025]),
    _completion("stop-token-ids-too-many", "stop_token_ids", stop_token_ids=list(range(1025))),
    _chat("bad-words-too-many", "bad_words", bad_words=[f"w{i}" for i in range(1025)]),
    _chat("allowed-ids-empty", "allowed_token_ids", allowed_token_ids=[]),
    _completion("allowed-ids-vocab", "allowed_token_ids", allowed_token_ids=[10**8]),
    _chat("bad-words-empty", "bad_words", bad_words=[""]),
    _chat("response-format-type", "response_format", response_format={"type": "xml"}),
    _chat("json-schema-missing", "response_format", response_format={"type": "json_schema"}),
    _completion(
        "json-schema-invalid",
        "response_format",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "strin"}},
        },
    ),
    _chat(
        "structured-two-kinds",
        "structured_outputs",
        structured_outputs={"regex": "a", "choice": ["b"]},
    ),
    _chat("structured-bad-regex", "structured_outputs", structured_outputs={"regex": "a("}),
    _chat(
        "structured-bad-grammar",
        "structured_outputs",
        structured_outputs={"grammar": "start: nothing"},
    ),
    _chat("guided-choice-empty", "guided_choice", guided_choice=[]),
    _completion("guided-json-text", "guided_json", guided_json="{no"),
    _chat(
        "two-constraints", "guided_regex", guided_regex="a", response_format={"type": "json_object"}
    ),
    _chat("tool-choice-no-tools", "tool_choice", tool_choice="required"),
    _chat("tool-choice-word", "tool_choice", tools=F_TOOL, tool_choice="always"),
    _chat(
        "tool-choice-unknown-name",
        "tool_choice",
        tools=F_TOOL,
        tool_choice={"type": "function", "function": {"name": "g"}},
    ),
    _chat("tools-malformed", "tools", tools=[{"type": "function"}]),
    # a single-model server keeps its model loaded, but a bad keep_alive is still named
    _chat("keep-alive-word", "keep_alive", keep_alive="soon"),
    _completion("keep-alive-bool", "keep_alive", keep_alive=True),
    _chat(
        "tools-and-json",
        "response_format",
        tools=F_TOOL,
        tool_choice="required",
        response_format={"type": "json_object"},
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


@pytest.mark.parametrize("path", ["/health", "/version"])
def test_open_endpoints(base_url, path):
    assert httpx.get(f"{base_url}{path}").status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/docs/openapi.json"])
def test_metrics_and_docs_take_the_key(base_url, http, path):
    _check_error(httpx.get(f"{base_url}{path}"), 401)
    assert http.get(path).status_code == 200


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/tokenize", "/v1/messages", "/v1/responses"])
def test_the_openapi_schema_declares_the_error_bodies_sent(base_url, http, path):
    """Each status's body validates against what /docs/openapi.json declares for it (every 400
    was declared as Litestar's `{status_code, detail, extra}`, which no route sends)."""
    import jsonschema

    document = http.get("/docs/openapi.json").json()
    declared = document["paths"][path]["post"]["responses"]
    unknown_model = {
        "model": "none",
        "messages": USER,
        "prompt": "x",
        "input": "x",
        "max_tokens": 1,
    }
    sent = [
        http.post(path, json=[1, 2]),  # 400: not an object
        httpx.post(f"{base_url}{path}", json={}),  # 401: no key
        http.post(path, json=unknown_model),  # 404
    ]
    for response in sent:
        schema = declared[str(response.status_code)]["content"]["application/json"]["schema"]
        jsonschema.validate(response.json(), {**schema, "components": document["components"]})
    assert [r.status_code for r in sent] == [400, 401, 404]


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
