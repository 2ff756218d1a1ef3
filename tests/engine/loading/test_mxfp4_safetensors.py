"""gpt-oss's released safetensors keep its experts in MXFP4 (`*_blocks` and `*_scales`, with
`quantization_config.quant_method` mxfp4): they load, kept in 4 bits, and the model follows
transformers' own model class with the experts transformers' own `convert_moe_packed_tensors`
dequantizes from the same bytes, token for token."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

from localchat import LLM
from localchat.engine.modeling.weights import checkpoint_names
from localchat.errors import UnsupportedModelError
from localchat.kernels.packed_weight import PackedWeight
from tests.family_models import WINDOW, build, greedy, hf_greedy, random_prompts

STACK = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)$")


def to_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stacked experts' weight [experts, in, out] as MXFP4 in the checkpoints' layout: blocks
    uint8 [experts, out, in / 32, 16] (values 2b and 2b + 1 in byte b's low and high nibbles) and
    E8M0 scales uint8 [experts, out, in / 32], each block's largest value at most 6 x its scale."""
    rows = weight.transpose(1, 2).unflatten(-1, (-1, 32))  # [experts, out, groups, 32]
    top = rows.abs().amax(dim=-1).clamp_min(2.0**-100)
    exponent = torch.ceil(torch.log2(top / 6.0))
    scaled = rows / torch.exp2(exponent).unsqueeze(-1)
    grid = torch.tensor(FP4_VALUES[:8])
    nearest = (scaled.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1)
    codes = (nearest | (scaled < 0).long() << 3).to(torch.uint8)
    blocks = codes[..., 0::2] | codes[..., 1::2] << 4
    return blocks, (exponent + 127).to(torch.uint8)


@pytest.fixture(scope="module")
def mxfp4_gpt_oss(tmp_path_factory):
    """A tiny gpt-oss saved as the released checkpoints are (experts in MXFP4), and transformers'
    model with the experts it dequantizes from those bytes."""
    directory = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    model = build("gpt-oss", 0)
    tensors = {}
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if STACK.match(name):
                blocks, scales = to_mxfp4(value)
                tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
                value.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            else:
                tensors[name] = value.contiguous()
    # the scales before the blocks in the file: either order pairs up
    save_file(dict(sorted(tensors.items(), reverse=True)), str(directory / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory, model


def test_mxfp4_experts_follow_transformers_token_for_token(mxfp4_gpt_oss):
    directory, hf = mxfp4_gpt_oss
    prompts = random_prompts([6, WINDOW + 5, 3 * WINDOW], seed=3)
    expected = [hf_greedy(hf, prompt) for prompt in prompts]
    llm = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB")
    assert greedy(llm, prompts) == expected
    with torch.no_grad():
        reference = hf(torch.tensor([prompts[2]])).logits[0]
    torch.testing.assert_close(
        llm.engine.prompt_logits(prompts[2]), reference, rtol=1e-4, atol=1e-4
    )
    experts = llm.engine.runner.model.layers[0].mlp.experts
    weights = [experts[0].gate_up_weight, experts[0].down_weight]
    parts = [p for w in weights for p in (w if isinstance(w, tuple) else (w,))]
    assert parts and all(isinstance(p, PackedWeight) and p.layout == "mxfp4" for p in parts)


def test_quantization_none_dequantizes_them(mxfp4_gpt_oss):
    directory, hf = mxfp4_gpt_oss
    prompt = random_prompts([WINDOW + 5], seed=3)[0]
    llm = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB", quantization="none")
    with torch.no_grad():
        reference = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(llm.engine.prompt_logits(prompt), reference, rtol=1e-4, atol=1e-4)
    weight = llm.engine.runner.model.layers[0].mlp.experts[0].down_weight
    assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float32


@pytest.mark.parametrize("drop", ["_scales", "_blocks"])
def test_a_stack_missing_its_other_half_is_named(mxfp4_gpt_oss, tmp_path, drop):
    directory, _ = mxfp4_gpt_oss
    from safetensors.torch import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    gone = "model.layers.1.mlp.experts.down_proj" + drop
    del tensors[gone]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(UnsupportedModelError, match=re.escape(gone) + ": missing beside"):
        LLM(str(tmp_path), max_model_len=64, kv_cache_memory="16MiB")


def test_int8_packs_the_rest_and_keeps_the_experts_mxfp4(mxfp4_gpt_oss):
    directory, _ = mxfp4_gpt_oss
    prompt = random_prompts([3 * WINDOW], seed=3)[0]
    kept = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB")
    int8 = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB", quantization="int8")
    layer = int8.engine.runner.model.layers[0]
    assert all(p.layout == "mxfp4" for p in layer.mlp.experts[0].gate_up_weight)
    assert layer.self_attn.qkv_weight.layout == "u8"
    top = [llm.engine.prompt_logits(prompt).argmax(-1) for llm in (kept, int8)]
    assert (top[0] == top[1]).float().mean() >= 0.95


def test_mxfp4_names_outside_gpt_oss_or_malformed_are_refused_by_name():
    name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    blocks = torch.zeros(2, 8, 2, 16, dtype=torch.uint8)
    with pytest.raises(UnsupportedModelError, match=f"{name}: MXFP4 experts are read from gpt-oss"):
        list(checkpoint_names([(name, blocks)], "qwen3_moe"))
    scales = torch.zeros(2, 8, 3, dtype=torch.uint8)  # one group too many
    pair = [(name, blocks), (name.replace("_blocks", "_scales"), scales)]
    with pytest.raises(UnsupportedModelError, match=f"{name}: expected uint8 blocks"):
        list(checkpoint_names(pair, "gpt_oss"))
