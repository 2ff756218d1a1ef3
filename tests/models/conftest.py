"""Fixtures for the model commands: a fake hub (HF_ENDPOINT), an empty hub cache per test, and the
repos it serves (the default GGUF under another name, a tiny safetensors llama)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localchat.cli import app
from tests.models.fake_hub import FakeHub, Repo
from tests.tiny_models import TINY_SIZES

GGUF_REPO = "acme/Tiny-Chat-GGUF"
GGUF_FILE = "tiny-chat.Q4_1.gguf"
GGUF_NAME = "tiny-chat:q4_1"
ST_REPO = "acme/Tiny-Llama"
ST_NAME = "tiny-llama"
GENERATION = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache of this test's own; the hub reachable (not offline)."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return cache


@pytest.fixture(scope="session")
def tiny_llama_files(default_gguf, tmp_path_factory) -> dict[str, bytes]:
    """A tiny random llama as a safetensors repo: config, weights, generation_config.json, and the
    default model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from localchat.engine.loading.model_cache import ensure_converted

    out = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        **TINY_SIZES,
        vocab_size=49152,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({**GENERATION, "do_sample": True, "eos_token_id": 2})
    )
    converted = ensure_converted(default_gguf)
    for file in [*converted.glob("tokenizer*"), *converted.glob("chat_template*")]:
        shutil.copy(file, out / file.name)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    files["README.md"] = b"# tiny llama\n"
    return files


@pytest.fixture
def fake_hub(default_gguf, tiny_llama_files, monkeypatch):
    """The fake hub with both repos, HF_ENDPOINT pointing at it."""
    repos = {
        GGUF_REPO: Repo(
            {
                GGUF_FILE: default_gguf.read_bytes(),
                "tiny-chat.Q8_0.gguf": b"not pulled" * 2000,
                "README.md": b"# tiny chat\n",
            }
        ),
        ST_REPO: Repo(dict(tiny_llama_files), commit="fedcba9876543210fedcba9876543210fedcba98"),
    }
    with FakeHub(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


@pytest.fixture
def cli():
    """Run `localchat ARGS...` in this process; returns the click Result."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), input=input)

    return run


@pytest.fixture
def models_dir(default_gguf, tiny_llama_files, tmp_path) -> Path:
    """DIR with the default GGUF (as smol.gguf) and the tiny llama twice (tiny-a, tiny-b)."""
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "smol.gguf").symlink_to(default_gguf)
    for name in ("tiny-a", "tiny-b"):
        (directory / name).mkdir()
        for file, data in tiny_llama_files.items():
            (directory / name / file).write_bytes(data)
    (directory / "notes.txt").write_text("not a model")
    return directory
