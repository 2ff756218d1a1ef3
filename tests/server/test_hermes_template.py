"""A server on the default model with a Hermes-style template that also has a <think> block
(tests/data/templates/hermes_think.jinja): tool results round-trip through the template, and the
reasoning parser (picked from the template) splits <think> text from the answer, which alone a
schema or a forced tool call constrains."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.serve_process import serve_process

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).parent.parent / "data" / "templates" / "hermes_think.jinja"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def hermes(default_gguf, tmp_path_factory):
    log = tmp_path_factory.mktemp("hermes") / "serve.log"
    args = ["--chat-template", str(TEMPLATE), "--max-model-len", "1024", "--threads", "1"]
    args += ["--kv-cache-memory", "128MiB"]
    with (
        serve_process(log, *args, timeout=180) as server,
        httpx.Client(base_url=server.base_url, timeout=120) as client,
    ):
        yield client


def _chat(client, **body):
    response = client.post("/v1/chat/completions", json={"max_tokens": 80, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def _prompt_text(client, messages, **kwargs) -> str:
    tokens = client.post("/tokenize", json={"messages": messages, **kwargs}).json()["tokens"]
    return client.post("/detokenize", json={"tokens": tokens}).json()["prompt"]


def test_tool_result_round_trips_through_the_template(hermes):
    choice = _chat(hermes, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0)
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    arguments = json.loads(call["function"]["arguments"])
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature_c": 21}'},
    ]
    prompt = _prompt_text(hermes, messages, tools=TOOLS)
    # the arguments reach the template as an object, rendered back as the model wrote them
    expected = json.dumps({"name": "get_weather", "arguments": arguments})
    assert f"<tool_call>\n{expected}\n</tool_call>" in prompt
    assert '<tool_response>\n{"temperature_c": 21}\n</tool_response>' in prompt
    assert '"name": "get_weather"' in prompt.split("<|im_end|>")[0]  # tools in the system prompt
    answer = _chat(hermes, messages=messages, tools=TOOLS, temperature=0, max_tokens=16)
    assert answer["message"]["content"] and not answer["message"].get("tool_calls")


# A conversation that shows the model how to answer: think, then JSON. The 135M model copies it.
SHOT = '<think>\nI add two and two.\n</think>\n\n{"answer": 4}'
QUESTION = {"role": "user", "content": "What is two plus two?"}
FEW_SHOT = [*[QUESTION, {"role": "assistant", "content": SHOT}] * 3, QUESTION]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
AS_JSON = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


def _streamed(client, body) -> tuple[str, str, dict[int, str]]:
    reasoning = content = ""
    arguments: dict[int, str] = {}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                for piece in delta.get("tool_calls") or []:
                    index = piece["index"]
                    arguments[index] = arguments.get(index, "") + piece["function"]["arguments"]
    return reasoning, content, arguments


@pytest.mark.parametrize("opened", [False, True], ids=["model-opens", "prompt-opens"])
def test_schema_applies_after_the_thinking(hermes, opened):
    """The reasoning parser is on (the template has <think>): the schema constrains the answer,
    not the thinking, which is free text (the model's own words, not JSON)."""
    body = {"messages": FEW_SHOT, "response_format": AS_JSON, "temperature": 0}
    if opened:
        body["chat_template_kwargs"] = {"open_think": True}
    message = _chat(hermes, **body)["message"]
    assert message["reasoning_content"].strip() == "I add two and two."
    assert message["reasoning"] == message["reasoning_content"]
    jsonschema.validate(json.loads(message["content"]), ANSWER)
    assert "think" not in message["content"]
    free = _chat(hermes, **{**body, "response_format": None})["message"]
    assert free["reasoning_content"] == message["reasoning_content"]  # the same, unconstrained
    assert _streamed(hermes, body)[:2] == (message["reasoning_content"], message["content"])


def test_forced_tool_call_after_the_thinking(hermes):
    body = {"messages": FEW_SHOT, "tools": TOOLS, "tool_choice": "required", "temperature": 0}
    choice = _chat(hermes, **body)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"].strip() == "I add two and two."
    assert not choice["message"]["content"]
    calls = choice["message"]["tool_calls"]
    for call in calls:
        jsonschema.validate(
            json.loads(call["function"]["arguments"]), TOOLS[0]["function"]["parameters"]
        )
    reasoning, content, arguments = _streamed(hermes, body)
    assert reasoning == choice["message"]["reasoning_content"] and not content
    assert list(arguments.values()) == [call["function"]["arguments"] for call in calls]


def test_prompt_that_closes_think_and_enable_thinking(hermes):
    body = {"messages": ASK, "response_format": AS_JSON, "temperature": 0}
    body["chat_template_kwargs"] = {"enable_thinking": False}
    message = _chat(hermes, **body)["message"]  # the prompt closed the block: JSON at once
    assert message["reasoning_content"] is None
    jsonschema.validate(json.loads(message["content"]), ANSWER)
    closed = _prompt_text(hermes, ASK, chat_template_kwargs={"enable_thinking": False})
    assert closed.endswith("<think>\n\n</think>\n\n")
    assert not _prompt_text(hermes, ASK).endswith("</think>\n\n")
