"""Loading: GGUF vs a safetensors checkpoint of the same weights, our forward passes vs
transformers' for each supported architecture (tiny random models), dummy weights, and clear
errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.config import EngineConfig
from localchat.errors import InvalidParameterError, UnsupportedModelError
from localchat.utils import parse_memory_size
from tests.logits_reference import assert_follows, random_prompts
from tests.tiny_models import TINY_SIZES

# Copies of ../shared/models/*/config.json (the architectures we have no weights for), so a clean
# checkout has them.
SHARED_MODELS = Path(__file__).resolve().parents[2] / "data" / "models"


@pytest.mark.slow
def test_gguf_and_safetensors_checkpoints_give_the_same_logits(float_llm, hf_model, tmp_path):
    """hf_model holds transformers' own dequantization of the GGUF; saved as safetensors, it must
    load into the same logits as our GGUF path (which un-permutes Q/K itself)."""
    from safetensors.torch import save_file

    state = {
        name: t.contiguous()
        for name, t in hf_model.state_dict().items()
        if name != "lm_head.weight"
    }
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = float_llm
    llm.tokenizer.save_pretrained(tmp_path)
    from_safetensors = LLM(str(tmp_path))
    ids = llm.render_chat([{"role": "user", "content": "What is a paged KV cache?"}])
    ours = llm.engine.prompt_logits(ids)
    theirs = from_safetensors.engine.prompt_logits(ids)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    with torch.no_grad():
        reference = hf_model(torch.tensor([ids])).logits[0].float()
    # different matmul libraries (oneDNN here, MKL in transformers): float32 rounding, logits up to
    # ~30
    torch.testing.assert_close(ours, reference, rtol=1e-3, atol=1e-3)


def tiny_config(name: str, **overrides) -> dict:
    config = json.loads((SHARED_MODELS / name / "config.json").read_text())
    config.update(TINY_SIZES, vocab_size=512, max_position_embeddings=2048, torch_dtype="float32")
    if "head_dim" in config:
        config["head_dim"] = 32 if name.startswith("qwen3") else 16
    config.update(overrides)
    return config


ARCHITECTURES = {
    "llama3-rope-scaling": ("llama-3.2-1b", {}),
    "llama-untied": ("llama-3.2-1b", {"tie_word_embeddings": False, "rope_scaling": None}),
    "mistral": (
        "llama-3.2-1b",
        {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "rope_scaling": None,
            "sliding_window": None,
        },
    ),
    "qwen2-qkv-bias": ("qwen2.5-0.5b", {}),
    "qwen3-qk-norm": ("qwen3-0.6b", {}),
}


@pytest.mark.parametrize("variant", list(ARCHITECTURES))
def test_forward_matches_transformers(variant, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    base, overrides = ARCHITECTURES[variant]
    config_dict = tiny_config(base, **overrides)
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(tmp_path), dtype=torch.float32
    ).eval()
    if config_dict.get("attention_bias") or base.startswith("qwen2"):
        with torch.no_grad():  # random biases, so a dropped bias would show
            for layer in hf.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    llm = LLM(str(tmp_path), max_model_len=1024, kv_cache_memory="16MiB")
    assert llm.tokenizer is None
    prompt = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        reference = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(llm.engine.prompt_logits(prompt), reference, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([prompt[:40]]), max_new_tokens=12, min_new_tokens=12, do_sample=False
        )[0, 40:].tolist()
    out = llm.generate(
        [prompt[:40]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )[0]
    assert out.token_ids == expected and out.text == ""


@pytest.mark.slow
def test_dummy_weights_for_a_shared_config():
    llm = LLM(
        str(SHARED_MODELS / "qwen3-0.6b"),
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=256,
        kv_cache_memory="64MiB",
    )
    out = llm.generate(
        [[1, 2, 3, 4, 5]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 4 and all(0 <= t < 151936 for t in out.token_ids)
    with pytest.raises(Exception, match="tokenizer"):
        llm.generate(["text needs a tokenizer"])


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(UnsupportedModelError, match=r"LlamaForCausalLM.*Qwen3ForCausalLM"):
        LLM(str(tmp_path), load_format="dummy")
    # a config saved without `architectures` is known by its model_type, and named by it
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3"}))
    with pytest.raises(UnsupportedModelError, match=r"names none; its model_type is deepseek_v3"):
        LLM(str(tmp_path), load_format="dummy")


def tiny_checkpoint(path: Path, config: dict):
    """A random transformers model of `config`, saved to `path` (safetensors); returned in eval
    mode, float32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    hf.save_pretrained(path, safe_serialization=True)
    return hf.eval()


def hf_greedy(hf, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


def test_a_cpu_engine_carves_its_kv_pool_from_memory_made_resident_while_it_loaded(tmp_path):
    hf = tiny_checkpoint(tmp_path, tiny_config("qwen3-0.6b"))
    budget = 16 * 2**20 + 1000  # not a whole number of blocks
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory=budget)
    pool = llm.engine.runner.kv_cache
    assert pool is not None and pool.untyped_storage().nbytes() == budget  # the whole budget
    assert len(llm.engine.block_manager.blocks) == budget // llm.engine.runner.bytes_per_block()
    # the pool holds what it is given: a reply read back from it is transformers' reply
    prompt = torch.randint(0, 512, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert out[0].token_ids == hf_greedy(hf, prompt, 12)


def test_bfloat16_weights_follow_transformers(tmp_path):
    """--dtype bfloat16 on the CPU: the forward pass in bfloat16 (weights, activations, KV cache)
    follows transformers' float32 one on the same weights to bfloat16's precision, prefill and
    greedy decode."""
    hf = tiny_checkpoint(tmp_path, tiny_config("qwen3-0.6b"))
    llm = LLM(str(tmp_path), dtype="bfloat16", max_model_len=256, kv_cache_memory="16MiB")
    assert llm.engine.runner.kv_cache.dtype == torch.bfloat16

    def reference(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0]

    # bfloat16 keeps 8 bits: 4e-3 of the largest logit measured here (transformers' own bfloat16
    # pass: 4.4e-3); a wrong weight, norm or rotation is off by the logits' own size
    assert_follows(llm, reference, random_prompts(2, 60, vocab=512, seed=4), rtol=2e-2)


def test_kv_cache_too_small_for_one_sequence_says_so(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("qwen3-0.6b")))
    with pytest.raises(InvalidParameterError, match="max_model_len=2048"):
        LLM(str(tmp_path), load_format="dummy", kv_cache_memory="64KiB")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("512MiB", 512 * 2**20),
        ("4GiB", 4 * 2**30),
        ("1.5GB", 1_500_000_000),
        (1024, 1024),
        ("2048", 2048),
    ],
)
def test_memory_sizes(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"kv_cache_memory": "lots"}, "kv_cache_memory"),
        ({"dtype": "float8"}, "dtype"),
        ({"kv_cache_dtype": "int8"}, "kv_cache_dtype"),
        ({"block_size": 7}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
    ],
)
def test_bad_engine_config_names_the_field(kwargs, field):
    with pytest.raises(InvalidParameterError, match=field):
        EngineConfig(**kwargs)
    with pytest.raises(InvalidParameterError, match="unknown engine option"):
        EngineConfig.from_kwargs(colour="blue")
