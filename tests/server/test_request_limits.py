"""What one request may carry is bounded (engine/sampling/request_limits.py) and each bound is
configurable: `serve --limit NAME=VALUE` or LOCALCHAT_LIMITS. A real server started with small
bounds answers each excess with a 400 naming the field (and the bound), and serves a request at the
bound; a bad --limit or LOCALCHAT_LIMITS stops serve at start-up in one line; docs/security.md
lists every bound with its default."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from localchat.engine.sampling import request_limits
from localchat.engine.sampling.request_limits import DEFAULTS, NAMES, limits, parse_limits
from localchat.errors import InvalidParameterError
from tests.serve_process import serve_process

USER = [{"role": "user", "content": "Hi"}]
BOUNDS = [
    "stop_strings=2,prompts=2",
    "embedding_tokens=12",
    "json_depth=8,schema_depth=3",
    "grammar_bytes=4096,logit_bias=2,tools=1",
]
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}  # nests 3 deep
DEEPER = {"type": "object", "properties": {"a": SCHEMA}}  # 5 deep


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def http(default_gguf, tmp_path_factory):
    log = tmp_path_factory.mktemp("limits") / "serve.log"
    args = ["--max-model-len", "512", "--kv-cache-memory", "64MiB", "--threads", "1"]
    for bound in BOUNDS:
        args += ["--limit", bound]
    with (
        serve_process(log, *args) as server,
        httpx.Client(base_url=server.base_url, timeout=120) as client,
    ):
        yield client


def _chat(**fields) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": USER, "max_tokens": 1, **fields}


def _completion(**fields) -> tuple[str, dict]:
    return "/v1/completions", {"prompt": "x", "max_tokens": 1, **fields}


OVER = [
    # (id, (path, body), param, the bound the message names)
    ("stop", _chat(stop=["a", "b", "c"]), "stop", "stop_strings"),
    ("prompts", _completion(prompt=["a", "b", "c"]), "prompt", "prompts"),
    ("embedding-tokens", ("/v1/embeddings", {"input": ["one two three " * 3] * 2}), "input", None),
    ("schema-depth", _chat(response_format=_json_schema(DEEPER)), "response_format", None),
    (
        "grammar-bytes",
        _completion(structured_outputs={"regex": "|".join(f"w{i}" for i in range(1000))}),
        "structured_outputs",
        "grammar_bytes",
    ),
    ("logit-bias", _chat(logit_bias={"1": 1, "2": 1, "3": 1}), "logit_bias", "logit_bias"),
    ("tools", _chat(tools=[_tool("f"), _tool("g")]), "tools", None),
]
AT = [
    ("stop", _chat(stop=["a", "b"])),
    ("prompts", _completion(prompt=["a", "b"])),
    ("embedding-tokens", ("/v1/embeddings", {"input": ["one two", "three"]})),
    ("schema-depth", _chat(response_format=_json_schema(SCHEMA))),
    ("grammar-bytes", _completion(structured_outputs={"regex": "w1|w2"})),
    ("logit-bias", _chat(logit_bias={"1": 1, "2": 1})),
    ("tools", _chat(tools=[_tool("f")])),
]


@pytest.mark.parametrize(
    ("request_", "param", "bound"), [c[1:] for c in OVER], ids=[c[0] for c in OVER]
)
def test_past_a_bound_is_a_400_naming_the_field(http, request_, param, bound):
    path, body = request_
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    if bound is not None:
        assert f"--limit {bound}" in error["message"], error


@pytest.mark.parametrize("request_", [c[1] for c in AT], ids=[c[0] for c in AT])
def test_at_a_bound_the_request_is_served(http, request_):
    path, body = request_
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text


def test_a_body_nesting_past_json_depth_is_refused_before_decoding(http):
    def body(levels: int) -> bytes:  # the chat's own 3 levels, then `levels` more in `user`
        return (
            b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "user": '
            + b"[" * levels
            + b"]" * levels
            + b"}"
        )

    headers = {"Content-Type": "application/json"}
    deep = http.post("/v1/chat/completions", content=body(8), headers=headers)
    assert deep.status_code == 400 and "--limit json_depth" in deep.text, deep.text
    # at the bound the body is decoded (and then refused for its `user`, which is not a string)
    shallow = http.post("/v1/chat/completions", content=body(7), headers=headers)
    assert shallow.status_code == 400 and "json_depth" not in shallow.text, shallow.text
    # brackets inside strings do not count
    quoted = http.post("/v1/chat/completions", json=_chat(user="[" * 100 + '\\"' + "{" * 100)[1])
    assert quoted.status_code == 200, quoted.text


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--limit", "nope=1"], "", "--limit 'nope=1': expected NAME=VALUE with NAME one of"),
        (["--limit", "stop_strings=-1"], "", "--limit stop_strings='-1': expected a count >= 0"),
        (["--limit", "json_depth=9999"], "", "json_depth='9999': at most 512"),
        ([], "grammar_seconds=0", "LOCALCHAT_LIMITS: grammar_seconds='0': expected seconds > 0"),
    ],
)
def test_a_bad_bound_stops_serve_before_it_loads(tmp_path, args, env, message):
    command = [sys.executable, "-m", "localchat", "serve", str(tmp_path / "none"), *args]
    environment = {**os.environ, "LOCALCHAT_LIMITS": env}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def test_the_bounds_are_a_setting(monkeypatch):
    monkeypatch.delenv("LOCALCHAT_LIMITS", raising=False)
    assert limits() == DEFAULTS
    monkeypatch.setenv("LOCALCHAT_LIMITS", "stop_strings=4, grammar-seconds=2.5,")
    assert (limits().stop_strings, limits().grammar_seconds, limits().tools) == (4, 2.5, 128)
    assert request_limits.as_setting(limits()) == "stop_strings=4,grammar_seconds=2.5"
    assert parse_limits(["tools=0"], limits()).tools == 0
    monkeypatch.setenv("LOCALCHAT_LIMITS", "tools=many")
    with pytest.raises(ValueError, match="LOCALCHAT_LIMITS: tools='many': expected a count"):
        limits()


def test_a_grammar_past_its_validation_time_is_a_400(monkeypatch):
    """The server's tokenizer-free check of a grammar waits at most grammar_seconds (the engine's
    compile for the tokenizer has its own test in tests/engine/core/test_async_engine.py)."""
    from localchat.server import structured
    from localchat.server.protocol import CompletionRequest

    release = threading.Event()
    monkeypatch.setattr(structured, "validate_grammar", lambda grammar, param: release.wait(30))
    monkeypatch.setenv("LOCALCHAT_LIMITS", "grammar_seconds=0.2")
    request = CompletionRequest(prompt="x", structured_outputs={"regex": "a+"})

    async def check():
        try:
            await structured.checked_grammar(request)
        finally:  # before asyncio.run waits for its executor's threads: the stuck check's too
            release.set()

    with pytest.raises(InvalidParameterError) as error:
        asyncio.run(check())
    assert error.value.param == "structured_outputs"
    assert "did not compile within 0.2 s" in error.value.message


def test_the_docs_list_every_bound_with_its_default():
    security = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", security, re.MULTILINE))
    assert {name: float(rows.get(name, "nan")) for name in NAMES} == {
        name: float(getattr(DEFAULTS, name)) for name in NAMES
    }
