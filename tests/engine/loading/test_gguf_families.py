"""Every family llama.cpp has a GGUF layout for, loaded from a file written as llama.cpp's converter
writes it (tests/gguf_writer.py: its names, metadata and conventions): an F32 file gives
transformers' logits and greedy tokens on the same weights; a Q8_0 file follows transformers run on
gguf-py's dequantization of its blocks, and our float path of the same file; experts in K-quants
stay in the file's map; what we cannot run is refused by name; and, where llama-cpp-python is
installed, our logits follow llama.cpp's on the same file."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from localchat import LLM
from localchat.errors import UnsupportedModelError
from tests.family_models import greedy, hf_greedy
from tests.gguf_writer import (
    GGUF_FAMILIES,
    NO_LAYOUT,
    TOKENS,
    build,
    quantized_reference,
    write_gguf,
)

PROMPT_LENGTH = 200  # past every window (24) and every original context (48, 128)
NEW_TOKENS = 6
OPTIONS = dict(max_model_len=256, kv_cache_memory="16MiB")
EXACT = dict(OPTIONS, kv_cache_dtype="float32")  # a GGUF's KV pool is float16 by default


def _prompt(length: int, seed: int = 1) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(len(TOKENS) - 256, len(TOKENS), (length,), generator=generator).tolist()


def _logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0]


def _top1_agreement(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()


@pytest.fixture(scope="module", params=list(GGUF_FAMILIES))
def family(request, tmp_path_factory):
    """(name, transformers model, F32 file, Q8_0 file)."""
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    model = build(name)
    f32 = write_gguf(model, name, directory / f"{name}-f32.gguf", "f32")
    q8_0 = write_gguf(model, name, directory / f"{name}-q8_0.gguf", "q8_0")
    return name, model, f32, q8_0


def test_f32_file_gives_transformers_logits_and_greedy_tokens(family):
    from localchat.engine.modeling.registry import family_name
    from localchat.models.facts import facts_of

    _, model, f32, _ = family
    llm = LLM(str(f32), **EXACT)
    prompt = _prompt(PROMPT_LENGTH)
    torch.testing.assert_close(
        llm.engine.prompt_logits(prompt), _logits(model, prompt), rtol=1e-4, atol=1e-4
    )
    short = _prompt(40, seed=2)  # past the windows, and past longrope's original context
    assert greedy(llm, [short], NEW_TOKENS) == [hf_greedy(model, short, NEW_TOKENS)]
    # the engine, `list` and `show` name the family
    assert llm.engine.model_info.family == family_name(model.config) != ""
    assert facts_of("gguf", f32).family == llm.engine.model_info.family


def test_q8_0_file_follows_its_dequantized_weights_and_our_float_path(family):
    name, model, _, q8_0 = family
    prompt = _prompt(PROMPT_LENGTH)
    reference = _logits(quantized_reference(model, name, "q8_0"), prompt)
    quantized = LLM(str(q8_0), **OPTIONS).engine.prompt_logits(prompt)
    assert _top1_agreement(quantized, reference) >= 0.99
    float_path = LLM(str(q8_0), quantization="none", **OPTIONS).engine.prompt_logits(prompt)
    torch.testing.assert_close(float_path, reference, rtol=1e-4, atol=1e-4)
    assert _top1_agreement(quantized, float_path) >= 0.99


def test_k_quant_experts_stay_in_the_file_map(tmp_path, monkeypatch):
    """A Qwen3-MoE whose rows are 256 long, in llama.cpp's Q4_K_M mix (Q4_K, Q6_K downs and head):
    each expert is its own weight reading its blocks from the file's map, and the model follows
    transformers on the file's dequantized weights."""
    from localchat.kernels import quant_linear
    from localchat.kernels.cpu_extension import cpu_kernels
    from tests.kernels.cpu.test_file_blocks import _mapped_file

    # a small model's gate and up are copied into one weight; a large one's are not: as large
    monkeypatch.setattr(quant_linear, "FUSE_MAX_BYTES", 0)
    sizes = dict(hidden_size=256, moe_intermediate_size=256, intermediate_size=256, head_dim=64)
    model = build("qwen3-moe", **sizes)
    path = write_gguf(model, "qwen3-moe", tmp_path / "qwen3-moe-q4_k_m.gguf", "q4_k_m")
    llm = LLM(str(path), **OPTIONS)
    prompt = _prompt(PROMPT_LENGTH)
    reference = _logits(quantized_reference(model, "qwen3-moe", "q4_k_m"), prompt)
    assert _top1_agreement(llm.engine.prompt_logits(prompt), reference) >= 0.99
    experts = [expert for layer in llm.engine.runner.model.layers for expert in layer.mlp.experts]
    assert len(experts) == 2 * 8
    weights = [e.gate_up_weight for e in experts] + [e.down_weight for e in experts]
    parts = [p for w in weights for p in (w if isinstance(w, tuple) else (w,))]
    assert {p.source_type for p in parts} == {"Q4_K", "Q6_K"}
    ext = cpu_kernels()
    if ext is None or not ext.simd_isa():
        pytest.skip("no vector CPU kernels here: the experts are repacked, not read in place")
    assert {p.layout for p in parts} == {"q4k", "q6k"}
    assert all(_mapped_file(p.qweight.data_ptr()) == str(path) for p in parts)


def test_gemma_and_gpt_oss_end_turns_and_keep_the_files_chat_template(tmp_path):
    """The file's end-of-turn tokens stop a reply (Gemma's <end_of_turn>, gpt-oss's <|return|> and
    <|call|>), besides its EOS; the chat template is the file's."""
    for name, ends in (("gemma", ["<end_of_turn>"]), ("gpt-oss", ["<|return|>", "<|call|>"])):
        llm = LLM(str(write_gguf(build(name), name, tmp_path / f"{name}.gguf")), **OPTIONS)
        expected = {TOKENS.index(t) for t in ["<eos>", *ends]}
        assert expected <= set(llm.engine.eos_token_ids)
        ids = llm.render_chat([{"role": "user", "content": "hi"}])
        text = llm.tokenizer.decode(ids)
        assert text == "<bos>user\nhi<end_of_turn>\n<bos>assistant\n"


def _write_gpt_oss(path, expert_type: GGMLQuantizationType, extra: str | None = None):
    """A gpt-oss file whose first expert stack is of `expert_type` (zero bytes of the right size
    where gguf-py cannot quantize it), with an `extra` tensor llama.cpp's layout has no place
    for."""
    from gguf import GGML_QUANT_SIZES

    from tests import gguf_writer

    model = build("gpt-oss")
    original, original_blocks = gguf_writer.gguf_type, gguf_writer.quantize_blocks

    def types(name, tensor, quant):
        if name == "blk.0.ffn_gate_exps.weight":
            return expert_type
        return original(name, tensor, quant)

    def blocks(rows, qtype):
        if qtype == expert_type and qtype == GGMLQuantizationType.Q8_1:
            values, size = GGML_QUANT_SIZES[qtype]
            return np.zeros((*rows.shape[:-1], rows.shape[-1] // values * size), dtype=np.uint8)
        return original_blocks(rows, qtype)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_writer, "gguf_type", types)
        patch.setattr(gguf_writer, "quantize_blocks", blocks)
        if extra:
            patch.setattr(
                gguf_writer,
                "_extra_tensors",
                lambda config, arch: [(extra, np.zeros(64, dtype=np.float32))],
            )
        return write_gguf(model, "gpt-oss", path, "q8_0")


def test_unknown_types_and_tensors_are_refused_by_name(tmp_path, cache_dir):
    """(gpt-oss's MXFP4 experts load: tests/kernels/cpu/test_mxfp4_experts.py; Q3_K, IQ4_NL,
    IQ4_XS and Q2_K are rewritten at load: test_gguf_transcode.py.) Q8_1 (ggml's activation type,
    never a file's weights) stands for the types we cannot read."""
    path = _write_gpt_oss(tmp_path / "gpt-oss-q8_1.gguf", GGMLQuantizationType.Q8_1)
    with pytest.raises(UnsupportedModelError, match=r"ffn_gate_exps.weight has GGUF type Q8_1"):
        LLM(str(path), **OPTIONS)
    path = _write_gpt_oss(tmp_path / "gpt-oss-extra.gguf", GGMLQuantizationType.Q8_0, "blk.0.x.y")
    with pytest.raises(UnsupportedModelError, match=r"'blk.0.x.y' is not supported"):
        LLM(str(path), **OPTIONS)
    # nothing half-converted left behind (only the conversions' lock files)
    assert not [p for p in (cache_dir / "gguf").iterdir() if p.is_dir()]


def test_the_tables_cover_the_same_families():
    """The loader and `list`/`show` know the same architectures; every family model is tested here
    or has no llama.cpp layout."""
    from localchat.engine.loading.gguf_arches import ARCHES
    from localchat.models.family_names import GGUF_MODEL_TYPES
    from tests.family_models import FAMILIES

    assert set(ARCHES) == set(GGUF_MODEL_TYPES)
    assert set(GGUF_FAMILIES) | set(NO_LAYOUT) == set(FAMILIES)


# llama.cpp runs Phi-3 without its sliding window (llama-model.cpp: "Phi SWA is currently
# disabled"); we keep Hugging Face's
LLAMA_CPP_DIFFERS = {"phi3": "llama.cpp disables Phi-3's sliding window"}


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"
)
def test_logits_follow_llama_cpp_on_the_same_file(family):
    from tests.llama_cpp_peer import llama_cpp, prompt_logits

    name, _, f32, _ = family
    if name in LLAMA_CPP_DIFFERS:
        pytest.skip(LLAMA_CPP_DIFFERS[name])
    prompt = _prompt(PROMPT_LENGTH)
    ours = LLM(str(f32), **EXACT).engine.prompt_logits(prompt)
    theirs = prompt_logits(llama_cpp(f32), prompt)
    assert _top1_agreement(ours, theirs) >= 0.99
