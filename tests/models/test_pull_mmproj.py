"""`localchat pull` of a GGUF repo with llama.cpp's image encoders (mmproj files), against the fake
hub: the model's file comes with the mmproj of its precision, else the f16 one (and no other); the
pulled model takes images, its mmproj found beside it; an mmproj is neither listed as a model nor
pulled as one; removing the model removes its mmproj."""

from __future__ import annotations

import pytest

from localchat.models.names import choose_mmproj, is_mmproj
from tests.models.fake_hub import FakeHub, Repo

REPO = "acme/Tiny-VLM-GGUF"
NAME = "tiny-vlm:q4_k_m"
MODEL, OTHER = "tiny-vlm-Q4_K_M.gguf", "tiny-vlm-F32.gguf"
F16, F32 = "mmproj-tiny-vlm-F16.gguf", "mmproj-tiny-vlm-F32.gguf"


@pytest.mark.parametrize(
    ("names", "model", "chosen"),
    [
        ([F16, F32], MODEL, F16),  # no q4_k_m one: f16
        ([F16, F32], OTHER, F32),  # the model's precision
        (["mmproj-x-bf16.gguf", "mmproj-x-f32.gguf"], MODEL, "mmproj-x-bf16.gguf"),
        (["mmproj.gguf"], MODEL, "mmproj.gguf"),  # the only one, whatever its name says
        (["mmproj-a.gguf", "mmproj-b.gguf"], MODEL, None),  # nothing tells them apart
        ([MODEL, OTHER], MODEL, None),
    ],
)
def test_the_mmproj_of_the_models_precision_else_f16(names, model, chosen):
    assert choose_mmproj([*names, model], model) == chosen
    assert is_mmproj("sub/MMPROJ-x.GGUF") and not is_mmproj(MODEL)


@pytest.fixture(scope="module")
def vlm_files(tmp_path_factory) -> dict[str, bytes]:
    """SmolVLM's tiny model as llama.cpp's files (tests/mmproj_models.py), under a GGUF repo's
    names: the model twice (the F32 one never pulled) and its mmproj in f16 and f32."""
    from tests import mmproj_models

    _, _, text, mmproj = mmproj_models.write_pair("smolvlm", tmp_path_factory.mktemp("vlm"))
    data = text.read_bytes()
    return {
        MODEL: data,
        OTHER: b"not pulled" * 2000,
        F16: mmproj.read_bytes(),
        F32: b"not pulled either" * 2000,
        "README.md": b"# tiny vlm\n",
    }


@pytest.fixture
def vlm_hub(vlm_files, monkeypatch):
    with FakeHub({REPO: Repo(dict(vlm_files))}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def test_pull_fetches_the_models_mmproj_and_the_model_takes_images(
    cli, hub_cache, cache_dir, vlm_hub, caplog
):
    result = cli("pull", REPO)
    assert result.exit_code == 0, result.output
    assert f"pulled {NAME}" in result.stdout and f"its image encoder {F16}" in result.stdout
    gets = [r["path"] for r in vlm_hub.requests if r["method"] == "GET"]
    assert any(p.endswith(F16) for p in gets) and any(p.endswith(MODEL) for p in gets)
    assert not any(p.endswith((F32, OTHER)) for p in gets), gets
    listed = cli("list", "--json").stdout
    assert NAME in listed and "mmproj" not in listed.lower()

    from localchat import LLM

    with caplog.at_level("INFO", logger="localchat.engine"):
        llm = LLM(NAME, max_model_len=128, kv_cache_memory="8MiB")
    assert llm.engine.model_info.takes_images
    assert f"image encoder {F16} (found beside the model)" in caplog.text

    assert cli("rm", NAME, "--yes").exit_code == 0
    assert not any(hub_cache.glob("models--acme--Tiny-VLM-GGUF"))  # its mmproj went too


def test_an_mmproj_is_not_pulled_as_a_model(cli, hub_cache, vlm_hub):
    result = cli("pull", f"{REPO}:{F16}")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "is an image encoder (mmproj), pulled with its model" in result.stderr
    result = cli("pull", f"{REPO}:f16")  # no model of that precision; the mmproj is none
    assert result.exit_code == 2 and "no GGUF file for 'f16'" in result.stderr
