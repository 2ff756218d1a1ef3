"""Structured outputs on the default model through a real server: response_format, vLLM's
structured_outputs and guided_* fields, logit_bias and allowed_token_ids."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Describe a city as JSON."}]


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int
    coastal: bool


def test_parse_returns_a_pydantic_object(openai_client):
    completion = openai_client.chat.completions.parse(
        model=MODEL,
        messages=ASK,
        response_format=City,
        max_tokens=80,
        temperature=0,
    )
    city = completion.choices[0].message.parsed
    assert isinstance(city, City), completion
    assert completion.choices[0].finish_reason == "stop"


def test_json_object_and_schema_streamed_equal_whole(openai_client):
    schema = {**City.model_json_schema(), "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    whole = openai_client.chat.completions.create(
        messages=ASK, model=MODEL, response_format=fmt, max_tokens=80, temperature=0
    )
    text = whole.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    stream = openai_client.chat.completions.create(
        messages=ASK, model=MODEL, response_format=fmt, max_tokens=80, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == text
    anything = openai_client.chat.completions.create(
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        model=MODEL,
        response_format={"type": "json_object"},
        max_tokens=150,
        temperature=0,
    )
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_completions_take_response_format_and_guided_fields(http):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    body = {
        "prompt": "A number:",
        "max_tokens": 30,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    jsonschema.validate(json.loads(response.json()["choices"][0]["text"]), schema)
    body = {"prompt": "A number:", "max_tokens": 30, "temperature": 0, "guided_json": schema}
    text = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize(
    "field,check",
    [
        ({"structured_outputs": {"choice": ["red", "green", "blue"]}}, r"red|green|blue"),
        ({"guided_choice": ["yes", "no"]}, r"yes|no"),
        ({"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}}, r"[0-9]{3}-[0-9]{4}"),
        ({"guided_regex": r"[A-Z][a-z]+ [A-Z][a-z]+"}, r"[A-Z][a-z]+ [A-Z][a-z]+"),
        ({"structured_outputs": {"grammar": 'start: "a" ("b" | "c")+ "!"'}}, r"a[bc]+!"),
        ({"structured_outputs": {"grammar": 'root ::= "x" [0-9]+'}}, r"x[0-9]+"),
        ({"structured_outputs": {"json_object": True}}, None),  # JSON: parsed below
    ],
)
def test_structured_outputs_kinds(http, field, check):
    body = {
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 24,
        "temperature": 0.7,
        "seed": 2,
        **field,
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["message"]["content"]
    if check is None:
        assert isinstance(json.loads(text), dict), text
    else:
        assert re.fullmatch(check, text, re.DOTALL), text


def test_logit_bias_and_allowed_token_ids(http):
    token = http.post("/tokenize", json={"prompt": " banana", "add_special_tokens": False}).json()
    banana = token["tokens"][-1]
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "logit_bias": {str(banana): 100},
    }
    reply = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert reply["content"].count("banana") == 3
    body = {"prompt": "x", "max_tokens": 5, "allowed_token_ids": [banana], "ignore_eos": True}
    text = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert text == " banana" * 5


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    "path,field,param",
    [
        (
            "/v1/chat/completions",
            {"structured_outputs": {"grammar": "start: <[99999999]>"}},
            "structured_outputs",
        ),
        ("/v1/completions", {"guided_grammar": "start: <|nonexistent|>"}, "guided_grammar"),
    ],
    ids=["token-range", "unknown-special-token"],
)
def test_a_grammar_that_fails_for_the_tokenizer_is_a_400(http, path, field, param, stream):
    """These pass the tokenizer-free check and fail only in the engine's compile for the model's
    tokenizer: still a 400 naming the field, before any stream begins (was a 200 "abort")."""
    prompt = {"messages": ASK} if path == "/v1/chat/completions" else {"prompt": "A city:"}
    body = {**prompt, "max_tokens": 8, "stream": stream, **field}
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(f"invalid {param}: "), error
    # the server still serves a good grammar
    body = {**prompt, "max_tokens": 8, "structured_outputs": {"grammar": 'start: "ok"'}}
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
