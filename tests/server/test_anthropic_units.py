"""Fast tests of /v1/messages (Anthropic's Messages API) without a model: the app on a scripted
engine (agent_fakes.py), so a reply's thinking, text and tool calls, its end and its errors are
the test's to choose; what a request becomes on the chat path; bad input, a 400 in Anthropic's
shape naming the field, never a 500."""

from __future__ import annotations

import json

import pytest

from localchat.errors import EngineDeadError, QueueFullError

from .agent_fakes import (
    F_SCHEMA,
    MODEL,
    PROMPT,
    THINK_CALL,
    WRONG_VALUES,
    FakeEngine,
    Reply,
    changed,
    client,
    post,
    sse,
    with_field,
)

ASK = [{"role": "user", "content": "Call f"}]
MESSAGES = {"model": MODEL, "max_tokens": 20, "messages": ASK}
ANTHROPIC_TOOLS = [{"name": "f", "description": "does f", "input_schema": F_SCHEMA}]


async def test_a_message_is_thinking_text_and_tool_use_blocks():
    body = {**MESSAGES, "tools": ANTHROPIC_TOOLS}
    response = await post(FakeEngine([THINK_CALL]), "/v1/messages", body, reasoning_parser="qwen3")
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["id"].startswith("msg_") and message["type"] == "message"
    assert (message["role"], message["model"]) == ("assistant", MODEL)
    call_id = message["content"][2]["id"]
    assert message["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": call_id, "name": "f", "input": {"a": 1}},
    ]
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    assert message["usage"] == {
        "input_tokens": len(PROMPT),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": len(THINK_CALL.pieces),
    }


async def test_a_streamed_message_is_anthropics_event_sequence():
    body = {**MESSAGES, "tools": ANTHROPIC_TOOLS, "stream": True}
    engine = FakeEngine([THINK_CALL])
    response = await post(engine, "/v1/messages", body, reasoning_parser="qwen3")
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.text)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    blocks: dict[int, dict] = {}
    for name, data in events:
        if name == "content_block_start":
            assert data["index"] == len(blocks)  # in order, one at a time
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking"}.get(delta["type"])
            if key:
                block[key] += delta[key]
            else:
                assert delta["type"] == "input_json_delta"
                block["json"] = block.get("json", "") + delta["partial_json"]
    assert [b["type"] for b in blocks.values()] == ["thinking", "text", "tool_use"]
    assert (blocks[0]["thinking"], blocks[1]["text"]) == ("hmm", "Sure.")
    assert json.loads(blocks[2]["json"]) == {"a": 1} and blocks[2]["input"] == {}
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert stops == [0, 1, 2]
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == len(THINK_CALL.pieces)
    assert engine.streams[0].closed


@pytest.mark.parametrize(
    "reply, stop_reason, stop_sequence",
    [
        (Reply(["Hi"], "stop", "END"), "stop_sequence", "END"),
        (Reply(["Hi"], "stop", 0), "end_turn", None),  # the EOS token
        (Reply(["Hi"], "length"), "max_tokens", None),
    ],
)
async def test_stop_reasons(reply, stop_reason, stop_sequence):
    body = {**MESSAGES, "stop_sequences": ["END"]}
    message = (await post(FakeEngine([reply]), "/v1/messages", body)).json()
    assert (message["stop_reason"], message["stop_sequence"]) == (stop_reason, stop_sequence)
    events = sse((await post(FakeEngine([reply]), "/v1/messages", {**body, "stream": True})).text)
    assert events[-2][1]["delta"] == {"stop_reason": stop_reason, "stop_sequence": stop_sequence}


async def test_cached_tokens_are_cache_reads():
    reply = Reply(["Hi"], cached=3)
    usage = (await post(FakeEngine([reply]), "/v1/messages", MESSAGES)).json()["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (len(PROMPT) - 3, 3)
    async with client(FakeEngine([reply])) as http:
        counted = await http.post("/v1/messages/count_tokens", json=MESSAGES)
    assert counted.json() == {"input_tokens": usage["input_tokens"] + 3}


async def test_a_request_becomes_the_chat_completion_it_asks_for():
    engine = FakeEngine()
    body = {
        **MESSAGES,
        "max_tokens": 10_000,  # beyond the context: a ceiling, not a refusal
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Call f", "cache_control": {}}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "x"},
                    {"type": "text", "text": "Sure."},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "2"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "3"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "metadata": {"user_id": "u"},
    }
    async with client(engine) as http:
        response = await http.post(
            "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}
        )
    assert response.status_code == 200, response.text
    messages, options = engine.rendered[0]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "Be brief.\nBe kind."),
        ("user", "Call f"),
        ("assistant", "Sure."),
        ("tool", "2"),
        ("tool", "3"),
        ("user", "Thanks"),
    ]
    assistant = messages[2]
    assert assistant["reasoning_content"] == "hmm"
    call = assistant["tool_calls"][0]
    assert (call["id"], call["function"]) == ("t1", {"name": "f", "arguments": {"a": 1}})
    assert [m.get("tool_call_id") for m in messages[3:5]] == ["t1", "t2"]
    assert options["chat_template_kwargs"] == {"enable_thinking": False}
    assert options["tools"][0]["function"] == {
        "name": "f",
        "parameters": F_SCHEMA,
        "description": "does f",
    }
    params = engine.params[0]
    assert params.max_tokens is None  # the rest of the context
    assert (params.stop, params.temperature, params.top_p, params.top_k) == (["END"], 0.5, 0.9, 5)
    assert params.grammar is not None  # the named tool is forced


async def test_a_final_assistant_message_is_continued():
    engine = FakeEngine()
    body = {**MESSAGES, "messages": [*ASK, {"role": "assistant", "content": "The answer is"}]}
    await post(engine, "/v1/messages", body)
    options = engine.rendered[0][1]
    assert (options["add_generation_prompt"], options["continue_final_message"]) == (False, True)


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"x-api-key": "k"}, 200),
        ({"Authorization": "Bearer k"}, 200),
        ({"x-api-key": "wrong"}, 401),
        ({}, 401),
    ],
)
async def test_the_api_key_in_either_header(headers, status):
    async with client(FakeEngine(), api_key="k") as http:
        response = await http.post("/v1/messages", json=MESSAGES, headers=headers)
        counted = await http.post("/v1/messages/count_tokens", json=MESSAGES, headers=headers)
    assert (response.status_code, counted.status_code) == (status, status)
    if status == 401:
        assert response.json()["error"]["type"] == "authentication_error"


async def test_engine_errors_in_anthropics_shape():
    dead = Reply(["Hi"], error=EngineDeadError("the engine stopped after an error: boom"))
    response = await post(FakeEngine([dead]), "/v1/messages", MESSAGES)
    assert response.status_code == 503
    assert response.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "the engine stopped after an error: boom"},
    }
    events = sse(
        (await post(FakeEngine([dead]), "/v1/messages", {**MESSAGES, "stream": True})).text
    )
    assert events[-1] == ("error", response.json())
    assert [name for name, _ in events][:3] == ["message_start", "ping", "content_block_start"]


async def test_a_full_queue_is_overloaded():
    class Full(FakeEngine):
        async def add_request(self, prompt, params, request_id):
            raise QueueFullError("too many requests are waiting")

    response = await post(Full(), "/v1/messages", MESSAGES)
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["type"] == "overloaded_error"


# --- bad input ------------------------------------------------------------------------------------
MESSAGE_CASES = [
    # (id, body changes, field the message must name)
    ("missing-max-tokens", {"max_tokens": None}, "max_tokens"),
    ("missing-messages", {"messages": None}, "messages"),
    ("missing-model", {"model": None}, "model"),
    ("max-tokens-zero", {"max_tokens": 0}, "max_tokens"),
    ("max-tokens-text", {"max_tokens": "many"}, "max_tokens"),
    ("empty-messages", {"messages": []}, "messages"),
    ("messages-not-list", {"messages": "hi"}, "messages"),
    ("role", {"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ("content-number", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        "block-type",
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "messages[0].content[0].type",
    ),
    (
        "text-missing",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0].text",
    ),
    (
        "image",
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "messages[0].content[0]",
    ),
    (
        "image-in-tool-result",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}
                    ],
                }
            ]
        },
        "messages[0].content[0].content[0]",
    ),
    (
        "tool-use-input",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                }
            ]
        },
        "messages[0].content[0].input",
    ),
    (
        "tool-result-in-assistant",
        {
            "messages": [
                *ASK,
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ]
        },
        "messages[1].content[0]",
    ),
    ("system-number", {"system": 3}, "system"),
    ("temperature-high", {"temperature": 1.5}, "temperature"),
    ("top-p-zero", {"top_p": 0}, "top_p"),
    ("top-k-zero", {"top_k": 0}, "top_k"),
    ("stop-sequences-text", {"stop_sequences": "END"}, "stop_sequences"),
    ("stop-sequence-empty", {"stop_sequences": [""]}, "stop_sequences[0]"),
    ("tools-not-list", {"tools": {"name": "f"}}, "tools"),
    ("tool-name-missing", {"tools": [{"input_schema": F_SCHEMA}]}, "tools[0].name"),
    ("tool-schema-missing", {"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ("tool-schema-text", {"tools": [{"name": "f", "input_schema": "x"}]}, "tools[0].input_schema"),
    ("server-tool", {"tools": [{"type": "web_search_20250305", "name": "w"}]}, "tools[0].type"),
    ("tool-choice-word", {"tool_choice": "any"}, "tool_choice"),
    ("tool-choice-type", {"tool_choice": {"type": "always"}}, "tool_choice.type"),
    ("tool-choice-without-tools", {"tool_choice": {"type": "any"}}, "tool_choice"),
    (
        "tool-choice-tool-unnamed",
        {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool"}},
        "tool_choice.name",
    ),
    (
        "tool-choice-unknown-tool",
        {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "g"}},
        "tool_choice",
    ),
    ("thinking-type", {"thinking": {"type": "sometimes"}}, "thinking.type"),
    ("thinking-no-budget", {"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    (
        "thinking-budget-small",
        {"thinking": {"type": "enabled", "budget_tokens": 10}},
        "thinking.budget_tokens",
    ),
    (
        "thinking-budget-over-max",
        {"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}},
        "thinking.budget_tokens",
    ),
    ("stream-text", {"stream": "yes please"}, "stream"),
    ("metadata-list", {"metadata": []}, "metadata"),
]


@pytest.mark.parametrize(
    "changes, field", [c[1:] for c in MESSAGE_CASES], ids=[c[0] for c in MESSAGE_CASES]
)
async def test_bad_messages_are_400s_in_anthropics_shape(changes, field):
    async with client(FakeEngine()) as http:
        response = await http.post("/v1/messages", json=changed(MESSAGES, changes))
        counted = await http.post("/v1/messages/count_tokens", json=changed(MESSAGES, changes))
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "invalid_request_error"
    assert field in body["error"]["message"], body
    # count_tokens reads the conversation the same way (sampling fields are not its own)
    assert counted.status_code in (200, 400), counted.text


MESSAGE_FIELDS = [
    "model",
    "max_tokens",
    "messages",
    "messages.0.role",
    "messages.0.content",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tools.0.name",
    "tools.0.input_schema",
    "tool_choice",
    "thinking",
    "metadata",
    "stream",
]


@pytest.mark.parametrize("wrong", WRONG_VALUES, ids=repr)
async def test_every_field_takes_any_json_without_a_500(wrong):
    """Each field set to each kind of JSON value: a 200, or a 4xx in Anthropic's shape."""
    async with client(FakeEngine()) as http:
        for field in MESSAGE_FIELDS:
            body = with_field({**MESSAGES, "tools": ANTHROPIC_TOOLS}, field, wrong)
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                response = await http.post(path, json=body)
                assert response.status_code < 500, (path, field, response.text)
                if response.status_code >= 400:
                    error = response.json()
                    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
                    assert error["error"]["message"], (path, field, error)
