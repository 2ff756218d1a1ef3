"""Tiny random-weight models of every family we run, built with transformers' own classes and
configs, and saved as safetensors: the references the family tests hold our forward pass against.

Weights are drawn wider than transformers' initialisation (norm weights around their identity,
biases and sinks non-zero), so a dropped feature changes the logits. Families with sliding windows
get a window of WINDOW tokens, so prompts longer than it test the window.
"""

from __future__ import annotations

from pathlib import Path

import torch

from localchat import LLM, SamplingParams

WINDOW = 24
NEW_TOKENS = 10  # greedy tokens the family tests compare
VOCAB = 256
_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)

# family -> (transformers config class name, model class name, config overrides)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16, tie_word_embeddings=True)),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=20,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
        ),
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),
    "phi4-mini": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            partial_rotary_factor=0.75,
            original_max_position_embeddings=48,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.1 * i for i in range(6)],
                "long_factor": [2.0 + 0.5 * i for i in range(6)],
                "partial_rotary_factor": 0.75,
            },
        ),
    ),
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            head_dim=16,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_theta": 500000.0,
            },
        ),
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.1,
            logits_scaling=2.5,
        ),
    ),
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(num_hidden_layers=3, no_rope_layers=[1, 1, 0]),
    ),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2-yarn": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 256,
                "rope_theta": 10000.0,
            }
        ),
    ),
    "llama-dynamic": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            max_position_embeddings=48,
            rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
        ),
    ),
    "qwen2-moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(_MOE, shared_expert_intermediate_size=48, num_hidden_layers=3, mlp_only_layers=[1]),
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(_MOE, head_dim=16, norm_topk_prob=True),  # as Qwen3-30B-A3B
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    ),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(_MOE, intermediate_size=32)),
    "gpt-oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=32,
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            swiglu_limit=1.5,  # the random activations reach it
            rope_parameters={
                "rope_type": "yarn",
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 128,
                "rope_theta": 150000.0,
            },
        ),
    ),
}
# families whose layers attend within a sliding window
WINDOWED = ("gemma2", "gemma3", "phi3", "mistral-window", "gpt-oss")


def build(family: str, seed: int = 0, **changes):
    """The family's tiny transformers model (float32, eval), with randomized weights; `changes`
    override config fields."""
    import transformers

    config_class, model_class, overrides = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**_BASE, **overrides, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).to(torch.float32).eval()
    gemma = family.startswith("gemma")  # Gemma's norms multiply by (1 + weight)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0 if gemma else 1.0, 0.3)
            elif name.endswith(("bias", "sinks")):
                param.normal_(0.0, 0.5)
            else:
                param.normal_(0.0, 0.1)
    return model


def save(family: str, directory: Path, seed: int = 0):
    """Build the family's model and save it as a safetensors checkpoint in `directory`."""
    model = build(family, seed)
    model.save_pretrained(directory, safe_serialization=True)
    return model


def random_prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    """Prompts of random token ids (past the special ones) of the given lengths."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(hf, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """transformers' greedy tokens, EOS neither stopping nor banned (as ignore_eos does)."""
    hf.generation_config.eos_token_id = None
    rotary = hf.model.rotary_emb
    if rotary.rope_type == "dynamic":
        # transformers' dynamic NTK keeps the base of the longest sequence it has seen until one is
        # shorter than the original context: each prompt starts from the model's own state here
        rotary.inv_freq = rotary.original_inv_freq.clone()
        rotary.max_seq_len_cached = rotary.original_max_seq_len
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def greedy(llm: LLM, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Our greedy tokens for each prompt, in one batch, EOS ignored."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    return [out.token_ids for out in llm.generate(prompts, params)]
