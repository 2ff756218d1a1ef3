"""A server on the default model with a Hermes-style template that also has a <think> block
(tests/data/templates/hermes_think.jinja): tool results round-trip through the template, and the
reasoning parser (picked from the template) splits <think> text from the answer."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
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


FORCED = "<think>\nTwo and two make four[.]\n</think>\n\nFour[.]"  # a regex of one text


def test_reasoning_is_split_from_content(hermes):
    body = {"messages": ASK, "structured_outputs": {"regex": FORCED}, "temperature": 0}
    message = _chat(hermes, **body)["message"]
    assert message["reasoning_content"].strip() == "Two and two make four."
    assert message["reasoning"] == message["reasoning_content"]
    assert message["content"] == "Four."
    reasoning = content = ""
    with hermes.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    assert (reasoning, content) == (message["reasoning_content"], "Four.")


def test_prompt_that_opens_think_and_enable_thinking(hermes):
    body = {
        "messages": ASK,
        "structured_outputs": {"regex": "I count[.]</think>Four[.]"},
        "chat_template_kwargs": {"open_think": True},
    }
    message = _chat(hermes, **body)["message"]
    assert (message["reasoning_content"], message["content"]) == ("I count.", "Four.")
    closed = _prompt_text(hermes, ASK, chat_template_kwargs={"enable_thinking": False})
    assert closed.endswith("<think>\n\n</think>\n\n")
    assert not _prompt_text(hermes, ASK).endswith("</think>\n\n")
