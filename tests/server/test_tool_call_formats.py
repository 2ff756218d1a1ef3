"""The llama3_json and mistral tool-call formats on a real server (the default model, its format
forced by --tool-call-parser and the grammar): a call whole and streamed token by token, through
the openai client (parallel calls in these formats: test_tool_parsers)."""

from __future__ import annotations

import json

import pytest

from tests.serve_process import serve_process

from .test_tool_calls import (
    ASK,
    MODEL,
    TOOLS,
    _check_calls,
    _check_streamed,
    _streamed_calls,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["llama3_json", "mistral"])
def formatted(request, default_gguf, tmp_path_factory):
    import openai

    log = tmp_path_factory.mktemp(request.param) / "serve.log"
    args = ["--tool-call-parser", request.param, "--max-model-len", "1024", "--threads", "1"]
    args += ["--kv-cache-memory", "128MiB"]
    with serve_process(log, *args, timeout=180) as server:
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)


def test_calls_whole_and_streamed(formatted):
    kwargs = dict(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, seed=2
    )
    whole = formatted.chat.completions.create(**kwargs, parallel_tool_calls=False, temperature=0)
    assert whole.choices[0].finish_reason == "tool_calls"
    _check_calls(whole.choices[0].message.tool_calls)
    stream = formatted.chat.completions.create(
        **kwargs, parallel_tool_calls=False, temperature=0, stream=True
    )
    calls, reasons = _streamed_calls(stream)
    assert [r for r in reasons if r] == ["tool_calls"]
    _check_streamed(calls)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments))
        for c in whole.choices[0].message.tool_calls
    ]
