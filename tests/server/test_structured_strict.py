"""Strict mode through a real server: with `strict: true` every property of every object must be in
its `required` (OpenAI's rule), a schema that breaks it is a 400 naming the param and the place,
and a schema that keeps it gets replies with every property present."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Describe a city as JSON."}]
PLACE = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "where": {
            "type": "object",
            "properties": {
                "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                "lon": {"type": "integer", "minimum": -180, "maximum": 180},
            },
            "required": ["lat", "lon"],
        },
    },
    "required": ["city", "where"],
}


def _without(schema: dict, *path: str, keep: list[str]) -> dict:
    """A deep copy of `schema` whose object at `path` (keys through properties) requires `keep`."""
    copy = json.loads(json.dumps(schema))
    node = copy
    for name in path:
        node = node["properties"][name]
    node["required"] = keep
    return copy


def _error(response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_strict_tool_without_every_property_required_is_a_400(http, stream):
    for parameters, place, missing in [
        (_without(PLACE, keep=["city"]), "tools[0].function.parameters.required", "'where'"),
        (
            _without(PLACE, "where", keep=["lat"]),
            "tools[0].function.parameters.properties.where.required",
            "'lon'",
        ),
    ]:
        function = {"name": "locate", "parameters": parameters, "strict": True}
        body = {
            "model": MODEL,
            "messages": ASK,
            "tools": [{"type": "function", "function": function}],
            "stream": stream,
        }
        error = _error(http.post("/v1/chat/completions", json=body))
        assert error["param"] == "tools" and error["type"] == "invalid_request_error", error
        assert place in error["message"] and missing in error["message"], error
        loose = {**body, "tools": [{"type": "function", "function": {**function, "strict": False}}]}
        assert http.post("/v1/chat/completions", json={**loose, "max_tokens": 4}).is_success


def test_a_strict_response_format_without_every_property_required_is_a_400(http, openai_client):
    schema = _without(PLACE, "where", keep=[])
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    place = "response_format.json_schema.schema.properties.where.required"
    for path, body in [
        ("/v1/chat/completions", {"messages": ASK}),
        ("/v1/completions", {"prompt": "A city as JSON:"}),
    ]:
        error = _error(http.post(path, json={**body, "model": MODEL, "response_format": fmt}))
        assert error["param"] == "response_format" and place in error["message"], error
        assert "'lat', 'lon'" in error["message"], error
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt)
    assert raised.value.status_code == 400 and raised.value.param == "response_format"


def test_strict_replies_have_every_property(openai_client):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PLACE, "strict": True}}
    for seed in range(2):
        reply = openai_client.chat.completions.create(
            model=MODEL, messages=ASK, response_format=fmt, max_tokens=80, temperature=1, seed=seed
        )
        assert reply.choices[0].finish_reason == "stop", reply
        place = json.loads(reply.choices[0].message.content)
        jsonschema.validate(place, {**PLACE, "additionalProperties": False})
        assert set(place) == {"city", "where"} and set(place["where"]) == {"lat", "lon"}


class Town(BaseModel):
    name: str = Field(max_length=16)
    nickname: str | None = None  # optional: the client writes it as required and nullable


def test_parse_with_an_optional_field(openai_client):
    """The openai client's strict schema for a model with a default lists every property in
    `required` (optional ones as nullable), so parse() goes through."""
    completion = openai_client.chat.completions.parse(
        model=MODEL, messages=ASK, response_format=Town, max_tokens=60, temperature=0
    )
    town = completion.choices[0].message.parsed
    assert isinstance(town, Town), completion
    assert "nickname" in json.loads(completion.choices[0].message.content)
