"""gpt-oss's harmony format through a real server: a gpt-oss model (tests/chat_families.py's bigram
model, whose replies the test steers token by token) with a harmony chat template, so the server
picks the harmony parsers itself. Through the openai client, whole and streamed: the analysis
channel is `reasoning_content`, the final channel `content`, a call to a function `tool_calls`;
forced calls and JSON answers come from grammars that leave the thinking free; assistant turns go
back through the template; /v1/completions is untouched; bad input is a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.chat_families import STEER, save_harmony_bigram, token
from tests.serve_process import serve_process

MODEL = "gpt-oss-bigram"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
OK = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = save_harmony_bigram(tmp_path_factory.mktemp("gpt-oss-bigram"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    log = tmp_path_factory.mktemp("harmony") / "serve.log"
    args = [str(directory), "--served-model-name", MODEL, "--max-model-len", "2048"]
    args += ["--kv-cache-memory", "64MiB", "--threads", "1"]
    with serve_process(log, *args, timeout=180) as server:
        yield server, tok


@pytest.fixture(scope="module")
def client(served):
    import openai

    server, _ = served
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def http(served):
    server, _ = served
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def _steer(served, *words: str) -> dict[str, float]:
    """A logit_bias that takes the model's branches to `words`."""
    _, tok = served
    return {str(token(tok, word)): STEER for word in words}


def _streamed(stream) -> dict:
    """The deltas of a streamed choice folded: reasoning, content, calls by index, finish."""
    folded: dict = {"reasoning": "", "content": "", "calls": {}, "finish": [], "chunks": 0}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.model_extra or {}
            folded["reasoning"] += extra.get("reasoning_content") or ""
            folded["content"] += delta.content or ""
            for call in delta.tool_calls or []:
                entry = folded["calls"].setdefault(call.index, {"arguments": ""})
                if call.id is not None:
                    entry.update(id=call.id, name=call.function.name)
                entry["arguments"] += call.function.arguments or ""
            folded["finish"].append(choice.finish_reason)
            folded["chunks"] += 1
    return folded


def _both(client, **kwargs):
    """The same request whole and streamed."""
    body = {"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 40, **kwargs}
    whole = client.chat.completions.create(**body).choices[0]
    return whole, _streamed(client.chat.completions.create(**body, stream=True))


def test_the_final_channel_is_the_content_and_the_reply_stops_at_return(client, served):
    whole, streamed = _both(client, logit_bias=_steer(served, "final", "<|return|>"))
    # <|channel|>final<|message|> hmm<|return|>: the stop token ends it, nothing of it shows
    assert (whole.message.content, whole.finish_reason) == (" hmm", "stop")
    assert not (whole.message.model_extra or {}).get("reasoning_content")
    assert (streamed["content"], streamed["reasoning"]) == (" hmm", "")
    assert [f for f in streamed["finish"] if f] == ["stop"]


def test_thinking_then_a_json_answer(client):
    """A JSON answer is the final message after an analysis message the grammar leaves free."""
    response_format = {"type": "json_schema", "json_schema": {"name": "ok", "schema": OK}}
    whole, streamed = _both(client, response_format=response_format)
    extra = whole.message.model_extra or {}
    assert (extra["reasoning_content"], extra["reasoning"]) == (" hmm", " hmm")
    assert (whole.message.content, whole.finish_reason) == ('{"ok":true}', "stop")
    assert (streamed["reasoning"], streamed["content"]) == (" hmm", '{"ok":true}')
    assert streamed["chunks"] > 3  # streamed as written, not in one piece


def test_an_unforced_call(client, served):
    whole, streamed = _both(
        client, tools=TOOLS, logit_bias=_steer(served, "commentary", '{"city":"')
    )
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    call = whole.message.tool_calls[0]
    assert (call.type, call.function.name) == ("function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert [f for f in streamed["finish"] if f] == ["tool_calls"]
    (streamed_call,) = streamed["calls"].values()
    assert (streamed_call["name"], streamed_call["arguments"]) == (
        "get_weather",
        '{"city":"Paris"}',
    )
    assert streamed["content"] == ""


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_forced_call_may_think_first(client, tool_choice):
    """The grammar forces a well-formed harmony call, after an optional analysis message: the
    model thinks " hmm" (unsteered), then the grammar takes it to the call."""
    whole, streamed = _both(client, tools=TOOLS, tool_choice=tool_choice)
    assert whole.finish_reason == "tool_calls"
    assert (whole.message.model_extra or {})["reasoning_content"] == " hmm"
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        ("get_weather", '{"city":"Paris"}')
    ]
    assert streamed["reasoning"] == " hmm" and len(streamed["calls"]) == 1


def test_turns_go_back_through_the_template(client, http):
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=40
    ).choices[0]
    assistant = first.message.model_dump(exclude_none=True)  # as a client sends it back
    call = first.message.tool_calls[0]
    messages = [
        *ASK,
        assistant,
        {"role": "tool", "tool_call_id": call.id, "content": '{"sunny": true}'},
    ]
    tokens = http.post("/tokenize", json={"messages": messages, "tools": TOOLS}).json()["tokens"]
    prompt = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert prompt.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|> hmm<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        '"{\\"sunny\\": true}"<|end|><|start|>assistant'
    )
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, temperature=0, max_tokens=12
    ).choices[0]
    assert answer.finish_reason == "length"  # it thinks " hmm" over and over
    assert (answer.message.model_extra or {})["reasoning_content"] == " hmm\n hmm"


def test_completions_are_not_parsed(client):
    out = client.completions.create(
        model=MODEL, prompt="<|start|>assistant", temperature=0, max_tokens=5
    ).choices[0]
    # special tokens skipped as for any model; no reasoning split off
    assert out.text == "analysis hmm"
    assert not (out.model_extra or {}).get("reasoning_content")


def test_bad_input_names_the_field(http):
    cases = [
        # harmony's template refuses channel tags in an assistant's text
        ([*ASK, {"role": "assistant", "content": "<|channel|>final<|message|>x"}], "messages"),
        (
            [*ASK, {"role": "assistant", "content": "x", "reasoning_content": 3}],
            "messages[1].reasoning_content",
        ),
        ([{"role": "tool", "content": "no call before"}], "messages"),
    ]
    for messages, param in cases:
        response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["message"], error
