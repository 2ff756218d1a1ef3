"""What the C++ decode stack's tests share: small random Q4_K_M models, and a forward pass of a few
sequences' last tokens run on the stack and op by op from the same KV pool (test_decode_layer.py,
test_decode_stack_rows.py, test_moe_decode.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from localchat import LLM, SamplingParams
from localchat.bench.gguf_shapes import ModelShape
from localchat.bench.random_gguf import write_random_gguf
from localchat.engine.core.sequence import Request, Sequence
from localchat.kernels.kv_quant import dequantize_q8_0, is_q8_0

SHAPES = {
    # a Q4_K_M file: q/k Q4_K and v Q6_K, one projection of parts
    "llama-q4_k_m": ModelShape("tiny-llama", "llama", 256, 8, 4, 2, 512),
    # a down projection of 2048 inputs: one activation code there, two in the rest of the layer
    "llama-wide-mlp": ModelShape("tiny-wide-mlp", "llama", 256, 2, 4, 2, 2048),
    # Qwen3's per-head q/k norms
    "qwen3-q4_k_m": ModelShape(
        "tiny-qwen3", "qwen3", 256, 4, 4, 2, 512, head_dim=64, explicit_head_dim=True
    ),
}

# (cached tokens, new tokens) per sequence, the decodes first as the model runner orders them: two
# decodes, a sequence's first token, six tokens on a context of three blocks (speculative
# decoding's verification of five drafted tokens) and a new prompt of three tokens
MIXED = ((37, 1), (5, 1), (0, 1), (45, 6), (0, 3))


def random_llm(directory: Path, name: str, kv_cache_dtype: str) -> LLM:
    """An LLM on a random Q4_K_M file of SHAPES[name], its KV pool of kv_cache_dtype (auto: a GGUF
    file's float16) and small (run_both copies it)."""
    path = directory / f"{name}.gguf"
    write_random_gguf(path, SHAPES[name], "q4_k_m", std=0.05)
    return LLM(str(path), max_model_len=512, kv_cache_dtype=kv_cache_dtype, kv_cache_memory="32MiB")


@dataclass
class Outcome:
    hidden: torch.Tensor  # [tokens, hidden] final-normed hidden states
    stored: torch.Tensor  # [2, layers, tokens, kv_heads, D]: each layer's keys/values of the tokens
    pool: torch.Tensor  # the whole KV pool after the pass
    slots: torch.Tensor  # the new tokens' slots


def _sequences(llm: LLM, shape=MIXED, seed: int = 0) -> tuple[list[Sequence], list[int]]:
    """Sequences of random tokens in blocks of their own, each with its cached context computed
    (op by op)."""
    runner = llm.engine.runner
    generator = torch.Generator().manual_seed(seed)
    vocab = runner.spec.vocab_size
    seqs, block = [], 0
    for cached, new in shape:
        tokens = torch.randint(3, vocab, (cached + new,), generator=generator).tolist()
        seq = Request("rows", tokens, SamplingParams(max_tokens=1)).seqs[0]
        blocks = -(-(cached + new) // runner.block_size)
        seq.block_tables = [list(range(block, block + blocks))]
        block += blocks
        if cached:
            runner._forward(*runner._prepare([seq], [cached])[:3])
            seq.num_computed_tokens = cached
        seqs.append(seq)
    return seqs, [new for _, new in shape]


@torch.inference_mode()
def run_both(llm: LLM, shape=MIXED, poison: float | None = None) -> tuple[Outcome, Outcome]:
    """The pass of `shape`'s new tokens on the stack and op by op, each from the same pool. With
    `poison`, the new tokens' slots hold that value before the stack's pass (the op-by-op path
    stores each layer's keys before it attends, so what it finds there does not matter)."""
    runner = llm.engine.runner
    model = runner.model
    stack = model.cpu_decode
    assert stack is not None and sum(new for _, new in shape) <= stack.max_tokens
    model.cpu_decode = None
    try:
        seqs, news = _sequences(llm, shape)
        batch = runner._prepare(seqs, news)[:3]
        slots = batch[2].slot_mapping
        pool = runner.kv_cache
        before = pool.clone()
        ops_hidden = runner._forward(*batch)
        ops = Outcome(ops_hidden, _stored(pool, slots), pool.clone(), slots)
        pool.copy_(before)
        if poison is not None:
            _poison(pool, slots, poison)
        calls = []
        forward = stack.forward
        stack.forward = lambda *args: calls.append(1) or forward(*args)
        model.cpu_decode = stack
        fused_hidden = runner._forward(*batch)
        del stack.forward
        assert calls == [1], "the stack did not take the batch"
        fused = Outcome(fused_hidden, _stored(pool, slots), pool.clone(), slots)
        pool.copy_(before)
    finally:
        model.cpu_decode = stack
    return fused, ops


@torch.inference_mode()
def run_singly(llm: LLM, shape=MIXED) -> Outcome:
    """`shape`'s new tokens on the stack one at a time (a sequence's in turn), each pass's keys and
    values stored before the next; the hidden states in run_both's order."""
    runner = llm.engine.runner
    model = runner.model
    stack = model.cpu_decode
    model.cpu_decode = None
    try:
        seqs, news = _sequences(llm, shape)
    finally:
        model.cpu_decode = stack
    pool = runner.kv_cache
    before = pool.clone()
    slots = runner._prepare(seqs, news)[2].slot_mapping
    hidden = []
    for seq, new in zip(seqs, news, strict=True):
        for _ in range(new):
            hidden.append(runner._forward(*runner._prepare([seq], [1])[:3]))
            seq.num_computed_tokens += 1
    outcome = Outcome(torch.cat(hidden), _stored(pool, slots), pool.clone(), slots)
    pool.copy_(before)
    return outcome


def _poison(pool: torch.Tensor, slots: torch.Tensor, value: float) -> None:
    """Every value of the slots' keys and values `value` (q8_0: NaN, the blocks' scale)."""
    if not is_q8_0(pool):
        slots_view(pool)[:, :, slots] = value
        return
    assert value != value, "a q8_0 pool is poisoned with NaN"
    block = torch.tensor([0, 126] + [1] * 32, dtype=torch.int8)  # float16 NaN, then codes
    slots_view(pool)[:, :, slots] = block.repeat(pool.shape[-1] // block.numel())


def slots_view(pool: torch.Tensor) -> torch.Tensor:
    """[2, layers, blocks * block_size, kv_heads, D]: the pool by slot."""
    return pool.flatten(2, 3)


def _stored(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    rows = slots_view(pool)[:, :, slots]
    return dequantize_q8_0(rows) if is_q8_0(pool) else rows.float()
