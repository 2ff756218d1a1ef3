"""The model's generation_config.json fills what a request leaves unset; explicit values win."""

from __future__ import annotations

import json

import pytest

from localchat.models.generation_defaults import GenerationDefaults, read_generation_defaults
from tests.models.conftest import GENERATION, ST_NAME, ST_REPO
from tests.models.test_registry import _hand_made_cache

CLI_FALLBACK = {"temperature": 0.7, "top_p": 0.95}


def test_reading_generation_config(tmp_path):
    file = tmp_path / "generation_config.json"
    assert read_generation_defaults(file) == GenerationDefaults()  # no file: no defaults
    file.write_text(json.dumps({"temperature": 0.7, "top_k": 20.0, "top_p": True, "eos": 2}))
    assert read_generation_defaults(file).as_dict() == {"temperature": 0.7, "top_k": 20}
    file.write_text("{not json")
    assert read_generation_defaults(file) == GenerationDefaults()


def test_explicit_values_win_then_the_model_then_the_fallback():
    model = GenerationDefaults(temperature=0.6, top_k=20)
    chosen = model.resolve({"temperature": None, "top_p": None}, fallback=CLI_FALLBACK)
    assert chosen == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    chosen = model.resolve({"temperature": 0.0, "top_p": 0.5}, fallback=CLI_FALLBACK)
    assert chosen == {"temperature": 0.0, "top_p": 0.5, "top_k": 20}
    assert GenerationDefaults().resolve({"temperature": None}, fallback={}) == {}


@pytest.fixture
def tiny_llama(hub_cache, tiny_llama_files):
    _hand_made_cache(hub_cache, ST_REPO, tiny_llama_files)
    return ST_NAME


def test_an_api_request_takes_the_models_defaults_for_unset_fields(tiny_llama):
    from localchat import LLM
    from localchat.server.protocol import ChatCompletionRequest
    from localchat.server.sampling import chat_sampling_params

    info = LLM(tiny_llama, kv_cache_memory="16MiB", max_model_len=128).engine.model_info
    defaults = info.generation_defaults
    assert defaults.as_dict() == GENERATION
    request = ChatCompletionRequest(messages=[], top_p=0.5)
    params = chat_sampling_params(defaults.fill_request(request))
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.5, 20)
    assert params.repetition_penalty == pytest.approx(1.1)
    explicit = ChatCompletionRequest(messages=[], temperature=0.0, top_k=0, repetition_penalty=1.0)
    params = chat_sampling_params(defaults.fill_request(explicit))
    assert (params.temperature, params.top_k, params.repetition_penalty) == (0.0, 0, 1.0)


def test_generate_uses_the_models_defaults_unless_flags_say_otherwise(cli, tiny_llama, monkeypatch):
    from localchat.engine.core.llm_engine import LLMEngine

    seen = []
    real = LLMEngine.add_request

    def spy(self, request_id, prompt, params, *args, **kwargs):
        seen.append(params)
        return real(self, request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "add_request", spy)
    engine = ["-m", tiny_llama, "-n", "2", "--kv-cache-memory", "16MiB", "--max-model-len", "128"]
    assert cli("generate", "Hi", *engine).exit_code == 0
    assert cli("generate", "Hi", *engine, "-t", "0.2", "--top-p", "0.3").exit_code == 0
    assert cli("generate", "Hi", "-n", "2").exit_code == 0  # the default model has none
    first, flagged, default = seen
    assert (first.temperature, first.top_p, first.top_k) == (0.6, 0.9, 20)
    assert first.repetition_penalty == pytest.approx(1.1)
    assert (flagged.temperature, flagged.top_p, flagged.top_k) == (0.2, 0.3, 20)
    assert (default.temperature, default.top_p, default.top_k) == (0.7, 0.95, 0)


def test_the_server_fills_unset_fields_from_generation_config(
    hub_cache, tiny_llama_files, tmp_path
):
    """A model whose generation_config.json says temperature 0 answers greedily when a request
    sets no temperature (any seed), and samples when the request asks for temperature 1."""
    import httpx

    from tests.serve_process import serve_process

    files = {**tiny_llama_files, "generation_config.json": b'{"temperature": 0.0}'}
    snapshot = _hand_made_cache(hub_cache, ST_REPO, files)
    engine = ["--kv-cache-memory", "16MiB", "--max-model-len", "128", "--threads", "1"]
    with serve_process(tmp_path / "serve.log", str(snapshot), *engine) as server:

        def text(endpoint: str, **fields) -> str:
            body = {"max_tokens": 8, "ignore_eos": True, **fields}
            if endpoint == "chat/completions":
                body["messages"] = [{"role": "user", "content": "Hi"}]
            else:
                body["prompt"] = "Once upon a time"
            reply = httpx.post(f"{server.base_url}/v1/{endpoint}", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            choice = reply.json()["choices"][0]
            return choice["message"]["content"] if "message" in choice else choice["text"]

        for endpoint in ("chat/completions", "completions"):
            greedy = text(endpoint, temperature=0)
            assert text(endpoint, seed=1) == text(endpoint, seed=2) == greedy
            sampled = {text(endpoint, temperature=1.0, seed=s) for s in (1, 2, 3)}
            assert len(sampled) > 1  # the request's own temperature wins
