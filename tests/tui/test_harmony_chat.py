"""The chat on a gpt-oss model (tests/chat_families.py's harmony bigram model): the in-process
backend splits the harmony reply as the server does, the analysis channel into the thinking block
and the final channel into the answer, and `/json` constrains only the final message."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from localchat.tui.backends import ChatRequest
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.json_mode import parse_json_command
from tests.chat_families import STEER, save_harmony_bigram, token

OK = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Well?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harmony_backend(tmp_path_factory):
    from localchat.config import EngineConfig
    from localchat.engine.core.async_engine import AsyncEngine

    directory = save_harmony_bigram(tmp_path_factory.mktemp("gpt-oss-bigram"))
    engine = AsyncEngine(
        EngineConfig(model=str(directory), max_model_len=1024, kv_cache_memory="32MiB")
    )
    backend = EngineBackend(engine=engine)
    await backend.start()
    yield backend
    await engine.shutdown()


async def _reply(backend: EngineBackend, **fields) -> tuple[str, str, list]:
    sampling = {"temperature": 0.0, "max_tokens": 24, **fields.pop("sampling", {})}
    deltas = [d async for d in backend.stream(ChatRequest(ASK, sampling, **fields))]
    text = "".join(d.text for d in deltas)
    return "".join(d.thinking for d in deltas), text, [d.finish_reason for d in deltas]


@pytest.mark.asyncio(loop_scope="module")
async def test_thinking_and_answer_are_split(harmony_backend, tmp_path):
    assert harmony_backend.reasoning == "harmony"  # picked from the template
    schema = tmp_path / "ok.json"
    schema.write_text(json.dumps(OK))
    thinking, text, reasons = await _reply(
        harmony_backend, json_mode=parse_json_command(str(schema))
    )
    assert (thinking, text) == (" hmm", '{"ok":true}')
    assert [r for r in reasons if r] == ["stop"]


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_without_thinking_stops_at_return(harmony_backend):
    tok = harmony_backend.engine.tokenizer
    bias = {token(tok, "final"): STEER, token(tok, "<|return|>"): STEER}
    thinking, text, reasons = await _reply(harmony_backend, sampling={"logit_bias": bias})
    assert (thinking, text) == ("", " hmm")  # no special token shows, nothing after <|return|>
    assert [r for r in reasons if r] == ["stop"]
    # unsteered it thinks on: all of it goes to the thinking block
    thinking, text, _ = await _reply(harmony_backend, sampling={"max_tokens": 12})
    assert (thinking, text) == (" hmm\n hmm", "")
