"""Fast tests of /v1/responses (OpenAI's Responses API) without a model: the app on a scripted
engine (agent_fakes.py), so a reply's reasoning, text and function calls, its end and its errors
are the test's to choose; what a request becomes on the chat path; stored responses
(previous_response_id, GET, DELETE, input_items) and the bounded stores; bad input, a 400 naming
the field, never a 500."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localchat.errors import EngineDeadError
from localchat.server.responses.store import MemoryResponseStore, SqliteResponseStore

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

RESPONSES = {"model": MODEL, "input": "Call f"}
RESPONSES_TOOLS = [{"type": "function", "name": "f", "parameters": F_SCHEMA}]


async def test_a_response_is_reasoning_message_and_function_call_items():
    body = {**RESPONSES, "tools": RESPONSES_TOOLS, "metadata": {"k": "v"}}
    response = await post(FakeEngine([THINK_CALL]), "/v1/responses", body, reasoning_parser="qwen3")
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["id"].startswith("resp_") and data["object"] == "response"
    assert (data["status"], data["incomplete_details"], data["error"]) == ("completed", None, None)
    assert (data["model"], data["metadata"], data["store"]) == (MODEL, {"k": "v"}, True)
    reasoning, message, call = data["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert message["type"] == "message" and message["id"].startswith("msg_")
    assert (message["role"], message["status"]) == ("assistant", "completed")
    assert message["content"] == [
        {"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []}
    ]
    assert call["type"] == "function_call" and call["id"].startswith("fc_")
    assert (call["name"], json.loads(call["arguments"])) == ("f", {"a": 1})
    assert call["call_id"].startswith("call_")
    assert data["usage"] == {
        "input_tokens": len(PROMPT),
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": len(THINK_CALL.pieces),
        # "<think>" showed nothing, then "hmm" was reasoning; "</think>" went with the answer
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": len(PROMPT) + len(THINK_CALL.pieces),
    }


async def test_a_streamed_response_is_the_event_sequence():
    body = {**RESPONSES, "tools": RESPONSES_TOOLS, "stream": True}
    response = await post(FakeEngine([THINK_CALL]), "/v1/responses", body, reasoning_parser="qwen3")
    events = sse(response.text)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(data["type"] == name for name, data in events)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert events[0][1]["response"]["status"] == "in_progress"
    assert [n for n in names if n.endswith(("item.added", "item.done"))] == [
        "response.output_item.added",
        "response.output_item.done",
    ] * 3
    texts = {"reasoning": "", "text": "", "arguments": ""}
    for name, data in events:
        if name == "response.reasoning_text.delta":
            texts["reasoning"] += data["delta"]
        elif name == "response.output_text.delta":
            texts["text"] += data["delta"]
        elif name == "response.function_call_arguments.delta":
            texts["arguments"] += data["delta"]
    assert texts == {"reasoning": "hmm", "text": "Sure.", "arguments": '{"a": 1}'}
    final = events[-1][1]["response"]
    assert names[-1] == "response.completed" and final["status"] == "completed"
    done = [data["item"] for name, data in events if name == "response.output_item.done"]
    assert done == final["output"]
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}


async def test_max_output_tokens_leaves_it_incomplete():
    cut = Reply(["Hi", " there"], finish="length")
    body = {**RESPONSES, "max_output_tokens": 2}
    data = (await post(FakeEngine([cut]), "/v1/responses", body)).json()
    assert data["status"] == "incomplete"
    assert data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["output"][0]["status"] == "incomplete"
    streamed = sse((await post(FakeEngine([cut]), "/v1/responses", {**body, "stream": True})).text)
    assert streamed[-1][0] == "response.incomplete"


async def test_an_error_mid_stream_fails_the_response():
    dead = Reply(["Hi"], error=EngineDeadError("the engine stopped after an error: boom"))
    events = sse(
        (await post(FakeEngine([dead]), "/v1/responses", {**RESPONSES, "stream": True})).text
    )
    (error_name, error), (failed_name, failed) = events[-2:]
    assert (error_name, error["code"], error["message"]) == (
        "error",
        "service_unavailable",
        "the engine stopped after an error: boom",
    )
    assert failed_name == "response.failed" and failed["response"]["status"] == "failed"


async def test_stored_responses_continue_and_are_listed():
    engine = FakeEngine([THINK_CALL, Reply(["It is 2."])])
    async with client(engine, reasoning_parser="qwen3") as http:
        first = (
            await http.post(
                "/v1/responses",
                json={**RESPONSES, "tools": RESPONSES_TOOLS, "instructions": "Be brief."},
            )
        ).json()
        call_id = first["output"][2]["call_id"]
        output = {"type": "function_call_output", "call_id": call_id, "output": "2"}
        second = await http.post(
            "/v1/responses",
            json={**RESPONSES, "input": [output], "previous_response_id": first["id"]},
        )
        assert second.status_code == 200, second.text
        second_id = second.json()["id"]
        assert (await http.get(f"/v1/responses/{first['id']}")).json() == first
        items = (await http.get(f"/v1/responses/{second_id}/input_items")).json()
        first_items = await http.get(
            f"/v1/responses/{first['id']}/input_items", params={"order": "asc", "limit": 1}
        )
        deleted = await http.delete(f"/v1/responses/{first['id']}")
        gone = await http.get(f"/v1/responses/{first['id']}")
        still = await http.get(f"/v1/responses/{second_id}")
    messages = engine.rendered[1][0]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]  # no instructions
    assistant = messages[1]
    assert (assistant["content"], assistant["reasoning_content"]) == ("Sure.", "hmm")
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert (messages[2]["tool_call_id"], messages[2]["content"]) == (call_id, "2")
    assert engine.rendered[0][0][0] == {"role": "system", "content": "Be brief."}
    assert items["object"] == "list" and items["has_more"] is False
    assert [i["type"] for i in items["data"]] == ["function_call_output"]
    assert items["first_id"] == items["data"][0]["id"]
    page = first_items.json()
    assert [i["role"] for i in page["data"]] == ["user"] and page["has_more"] is False
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
    assert still.status_code == 200  # a response keeps its whole conversation


async def test_unstored_and_unknown_responses_are_404():
    async with client(FakeEngine()) as http:
        unstored = (await http.post("/v1/responses", json={**RESPONSES, "store": False})).json()
        missing = await http.get(f"/v1/responses/{unstored['id']}")
        previous = await http.post(
            "/v1/responses", json={**RESPONSES, "previous_response_id": "resp_nope"}
        )
        items = await http.get("/v1/responses/resp_nope/input_items")
        deleted = await http.delete("/v1/responses/resp_nope")
    for response in (missing, previous, items, deleted):
        assert response.status_code == 404, response.text
        assert "resp_" in response.json()["error"]["message"]
    assert previous.json()["error"]["param"] == "previous_response_id"


async def test_a_responses_request_becomes_the_chat_completion_it_asks_for():
    engine = FakeEngine()
    body = {
        **RESPONSES,
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "r"}],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "2"},
            {"role": "user", "content": "c"},
        ],
        "tools": [{**RESPONSES_TOOLS[0], "strict": False, "description": "does f"}],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
        "max_output_tokens": 10_000,
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning": {"effort": "minimal", "summary": "auto"},
    }
    response = await post(engine, "/v1/responses", body)
    assert response.status_code == 200, response.text
    messages, options = engine.rendered[0]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "Be brief.\n\nUse tools."),
        ("user", "a"),
        ("assistant", "b"),
        ("tool", "2"),
        ("user", "c"),
    ]
    assert messages[2]["reasoning_content"] == "r"
    assert messages[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert options["chat_template_kwargs"] == {"enable_thinking": False, "reasoning_effort": "low"}
    params = engine.params[0]
    assert (params.max_tokens, params.temperature, params.top_p) == (None, 0.5, 0.9)
    assert params.grammar is not None
    echo = response.json()
    assert echo["tool_choice"] == {"type": "function", "name": "f"}
    assert echo["reasoning"] == {"effort": "minimal", "summary": "auto"}
    assert echo["parallel_tool_calls"] is False and echo["instructions"] == "Be brief."


@pytest.mark.parametrize(
    "text_format",
    [{"type": "json_object"}, {"type": "json_schema", "name": "x", "schema": F_SCHEMA}],
)
async def test_text_format_is_a_grammar(text_format):
    engine = FakeEngine([Reply(['{"a": 1}'])])
    data = (
        await post(engine, "/v1/responses", {**RESPONSES, "text": {"format": text_format}})
    ).json()
    assert engine.params[0].grammar is not None
    assert data["text"]["format"]["type"] == text_format["type"]
    assert data["output"][0]["content"][0]["text"] == '{"a": 1}'


# --- bad input ------------------------------------------------------------------------------------
RESPONSE_CASES = [
    ("missing-input", {"input": None}, "input"),
    ("input-number", {"input": 5}, "input"),
    ("empty-input", {"input": []}, "input"),
    ("item-not-object", {"input": ["hi"]}, "input[0]"),
    ("item-type", {"input": [{"type": "web_search_call"}]}, "input[0].type"),
    ("item-role", {"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ("item-content", {"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    (
        "part-type",
        {"input": [{"role": "user", "content": [{"type": "audio"}]}]},
        "input[0].content[0].type",
    ),
    (
        "image",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0]",
    ),
    (
        "call-without-id",
        {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        "input[0].call_id",
    ),
    (
        "output-without-id",
        {"input": [{"type": "function_call_output", "output": "x"}]},
        "input[0].call_id",
    ),
    ("only-system", {"input": [{"role": "system", "content": "x"}]}, "input"),
    ("instructions-number", {"instructions": 3}, "instructions"),
    ("max-output-tokens-zero", {"max_output_tokens": 0}, "max_output_tokens"),
    ("temperature-high", {"temperature": 3}, "temperature"),
    ("top-p-zero", {"top_p": 0}, "top_p"),
    ("tools-not-list", {"tools": "f"}, "tools"),
    ("tool-type", {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("tool-unnamed", {"tools": [{"type": "function"}]}, "tools[0].name"),
    (
        "tool-parameters-text",
        {"tools": [{"type": "function", "name": "f", "parameters": "x"}]},
        "tools[0].parameters",
    ),
    (
        "tool-strict-open",
        {
            "tools": [
                {"type": "function", "name": "f", "strict": True, "parameters": {"type": "string"}}
            ]
        },
        "tools",
    ),
    ("tool-choice-word", {"tool_choice": "always"}, "tool_choice"),
    ("tool-choice-without-tools", {"tool_choice": "required"}, "tool_choice"),
    (
        "tool-choice-object",
        {"tools": RESPONSES_TOOLS, "tool_choice": {"type": "mcp"}},
        "tool_choice",
    ),
    (
        "tool-choice-unknown",
        {"tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "g"}},
        "tool_choice",
    ),
    ("parallel-text", {"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("format-type", {"text": {"format": {"type": "xml"}}}, "text.format.type"),
    (
        "format-schema-missing",
        {"text": {"format": {"type": "json_schema", "name": "x"}}},
        "text.format.schema",
    ),
    (
        "format-schema-invalid",
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}},
        "text.format",
    ),
    (
        "format-strict-open",
        {
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {}}},
                }
            }
        },
        "text.format",
    ),
    (
        "format-with-forced-tool",
        {
            "tools": RESPONSES_TOOLS,
            "tool_choice": "required",
            "text": {"format": {"type": "json_object"}},
        },
        "text.format",
    ),
    ("effort", {"reasoning": {"effort": "maximal"}}, "reasoning.effort"),
    ("store-text", {"store": "no"}, "store"),
    ("previous-number", {"previous_response_id": 5}, "previous_response_id"),
    ("metadata-values", {"metadata": {"k": 1}}, "metadata[...]"),
    ("metadata-too-many", {"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ("background", {"background": True}, "background"),
    ("model-unknown", {"model": "gpt-9"}, "model"),
]


@pytest.mark.parametrize(
    "changes, field", [c[1:] for c in RESPONSE_CASES], ids=[c[0] for c in RESPONSE_CASES]
)
async def test_bad_responses_requests_are_400s_naming_the_field(changes, field):
    response = await post(FakeEngine(), "/v1/responses", changed(RESPONSES, changes))
    status = 404 if field == "model" else 400
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["param"] == field, error
    assert field.split("[")[0].split(".")[0] in error["message"] or field == "model", error


RESPONSE_FIELDS = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tools.0.parameters",
    "tools.0.strict",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "store",
    "previous_response_id",
    "stream",
    "metadata",
]


@pytest.mark.parametrize("wrong", WRONG_VALUES, ids=repr)
async def test_every_field_takes_any_json_without_a_500(wrong):
    """Each field set to each kind of JSON value: a 200, or a 4xx in OpenAI's error shape."""
    async with client(FakeEngine()) as http:
        for field in RESPONSE_FIELDS:
            body = with_field({**RESPONSES, "tools": RESPONSES_TOOLS}, field, wrong)
            response = await http.post("/v1/responses", json=body)
            assert response.status_code < 500, (field, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"]


# --- the store ------------------------------------------------------------------------------------
def _record(size: int) -> dict:
    return {"response": {"pad": "x" * size}, "input_items": [], "history": []}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_store_is_bounded_least_recently_used_first(kind, tmp_path):
    def store(**bounds):
        if kind == "memory":
            return MemoryResponseStore(**bounds)
        return SqliteResponseStore(tmp_path / f"{len(list(tmp_path.iterdir()))}.db", **bounds)

    by_count = store(max_responses=2)
    by_count.put("a", _record(1))
    by_count.put("b", _record(1))
    assert by_count.get("a") is not None  # a is now more recent than b
    by_count.put("c", _record(1))
    assert [by_count.get(k) is not None for k in "abc"] == [True, False, True]
    size = len(json.dumps(_record(1000), separators=(",", ":")))
    by_bytes = store(max_bytes=2 * size + 10)
    for key in "abc":
        by_bytes.put(key, _record(1000))
    assert [by_bytes.get(k) is not None for k in "abc"] == [False, True, True]
    by_bytes.put("big", _record(10 * size))  # larger than the whole store: not kept
    assert by_bytes.get("big") is None
    assert by_bytes.delete("c") and not by_bytes.delete("c") and by_bytes.get("c") is None


def test_the_sqlite_store_outlives_its_process(tmp_path):
    path = tmp_path / "responses.db"
    store = SqliteResponseStore(path, max_responses=2)
    store.put("a", _record(1))
    store.put("b", _record(1))
    store.get("a")
    store.close()
    again = SqliteResponseStore(path, max_responses=2)
    assert again.get("b") == _record(1)
    again.put("c", _record(1))  # a was used before b was read again here
    assert [again.get(k) is not None for k in "abc"] == [False, True, True]


def test_a_store_that_cannot_open_is_refused_before_loading(tmp_path):
    store = tmp_path / "no such folder" / "responses.db"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "localchat",
            "serve",
            "--port",
            "0",
            "--responses-store",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "cannot open --responses-store" in result.stderr and "loading" not in result.stderr
