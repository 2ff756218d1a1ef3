"""--kv-cache-dtype q8_0: the engine's KV pool in llama.cpp's Q8_0 blocks (kernels/kv_quant.py).
Its bytes are 0.53x of float16's and count so in the block budget; it is refused where no kernel
reads it; the default model's greedy replies follow the float16 pool's; and chunked prefill, prefix
caching, preemption, sliding windows (KV groups), the whole-layer decode stack and tensor
parallelism run on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.errors import InvalidParameterError
from localchat.kernels.kv_quant import Q8_0, check_pool_dtype

TINY_LLAMA = {  # head_dim 64: two q8_0 blocks a row
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    def make(**overrides) -> str:
        path = tmp_path_factory.mktemp("tiny")
        (path / "config.json").write_text(json.dumps({**TINY_LLAMA, **overrides}))
        return str(path)

    return make


def _tiny(directory: str, kv_cache_dtype: str) -> LLM:
    return LLM(
        directory,
        load_format="dummy",
        max_model_len=256,
        kv_cache_memory="4MiB",
        kv_cache_dtype=kv_cache_dtype,
    )


def test_the_pool_counts_its_real_bytes(tiny_dir):
    directory = tiny_dir()
    q8, f16 = _tiny(directory, "q8_0"), _tiny(directory, "float16")
    q8_runner, f16_runner = q8.engine.runner, f16.engine.runner
    pool = q8_runner.kv_cache
    assert pool is not None and pool.dtype == torch.int8 and pool.shape[-1] == 2 * 34
    # what the budget counted is what the pool holds: 34 bytes per 32 values, scales included
    blocks = q8.engine.block_manager.num_blocks
    assert pool.numel() == q8_runner.bytes_per_block() * blocks
    assert q8_runner.bytes_per_block() / f16_runner.bytes_per_block() == 34 / 64
    # the same pool of the same blocks: at most 0.55x of float16's bytes
    f16_blocks = f16.engine.block_manager.num_blocks
    f16_pool = f16_runner.kv_cache
    assert f16_pool is not None
    per_block_q8 = pool.nbytes / blocks
    assert per_block_q8 * f16_blocks <= 0.55 * f16_pool.nbytes
    # so the same --kv-cache-memory holds 1.88x the blocks
    assert blocks == (4 << 20) // q8_runner.bytes_per_block() and blocks >= 1.8 * f16_blocks
    # and it runs: prefill and decodes over its blocks
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    (out,) = q8.generate([[5, 17, 300, 3, 42] * 9], params)
    assert len(out.outputs[0].token_ids) == 8


def test_it_is_refused_where_no_kernel_reads_it(tiny_dir):
    with pytest.raises(
        InvalidParameterError, match="q8_0 needs a head_dim that is a multiple of 32"
    ):
        _tiny(tiny_dir(hidden_size=320), "q8_0")  # head_dim 80
    with pytest.raises(InvalidParameterError, match="fp8 needs a CUDA GPU") as refused:
        _tiny(tiny_dir(), "fp8")
    assert refused.value.param == "kv_cache_dtype"
    with pytest.raises(InvalidParameterError, match="q8_0 runs on the CPU only, not on cuda"):
        check_pool_dtype(Q8_0, torch.device("cuda"), 64)


def test_the_cli_says_so_in_one_line(tiny_dir):
    command = [sys.executable, "-m", "localchat", "generate", "-m", tiny_dir(hidden_size=320)]
    command += ["--load-format", "dummy", "--kv-cache-dtype", "q8_0", "hi"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if "q8_0" in line]
    assert len(lines) == 1 and "head_dim" in lines[0] and "80" in lines[0], run.stderr


def test_sliding_window_groups_give_back_q8_0_blocks(tmp_path, monkeypatch):
    """Gemma 2's local and global layers (two KV groups, a window of 24) with head_dim 32: a
    budget of one sequence, whose windows' blocks are given back, chunks of 11 tokens and a batch
    that preempts give a roomy run's replies; its decodes read the window in C++."""
    from tests import family_models
    from tests.engine.core.test_sliding_window_cache import Run

    config_class, model_class, overrides = family_models.FAMILIES["gemma2"]
    wide = (config_class, model_class, {**overrides, "head_dim": 32})
    monkeypatch.setitem(family_models.FAMILIES, "gemma2-head-dim-32", wide)
    family_models.save("gemma2-head-dim-32", tmp_path)
    window = family_models.WINDOW
    prompts = family_models.random_prompts([2 * window + 5, 70, 3 * window + 9], seed=2)
    options = dict(max_model_len=128, kv_cache_dtype="q8_0", max_num_seqs=4)
    roomy = LLM(str(tmp_path), kv_cache_memory="16MiB", enable_prefix_caching=False, **options)
    runner = roomy.engine.runner
    assert len(runner.kv_layout.groups) > 1 and runner.kv_cache.dtype == torch.int8
    expected = Run(roomy).greedy(prompts, 40)
    budget = runner.bytes_per_block() * runner.kv_layout.blocks_per_sequence(128, 16, 11)
    tight = LLM(str(tmp_path), kv_cache_memory=budget, max_num_batched_tokens=11, **options)
    assert Run(tight).greedy(prompts, 40) == expected
    assert tight.engine.scheduler.num_preemptions > 0


# --- the default model (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64) -------------------

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "Der schnelle braune Fuchs springt",
    "Explain gravity in one sentence. " * 20,
]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def q8_llm(default_gguf):
    return LLM(kv_cache_dtype="q8_0", kv_cache_memory="64MiB", max_model_len=1024)


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


def test_greedy_replies_follow_the_float16_pool(q8_llm, llm):
    """The default engine's float16 pool and the q8_0 one: the same replies, or nearly (a
    quantized key moves a score by about 1%), on the whole-layer decode stack."""
    runner = q8_llm.engine.runner
    assert runner.kv_cache is not None and runner.kv_cache.dtype == torch.int8
    assert runner.model.cpu_decode is not None  # the C++ stack reads the int8 codes
    assert runner.bytes_per_block() <= 0.55 * llm.engine.runner.bytes_per_block()
    q8, f16 = _tokens(q8_llm, PROMPTS), _tokens(llm, PROMPTS)
    equal = sum(a == b for x, y in zip(q8, f16, strict=True) for a, b in zip(x, y, strict=True))
    assert equal >= 0.9 * sum(len(x) for x in f16), (q8, f16)
    # the layer-by-layer path (C++ decode attention per layer, the per-op store and attention
    # for prefills) continues as the stack does
    model = runner.model
    saved, model.cpu_decode = model.cpu_decode, None
    try:
        assert _tokens(q8_llm, PROMPTS[:2]) == q8[:2]
    finally:
        model.cpu_decode = saved


def _assert_same_up_to_near_ties(llm: LLM, prompts, got, expected) -> None:
    """Equal replies, but where a reply parts from the expected one: there the expected run's two
    tokens were tied to float rounding. A step's tokens run on the whole-layer decode stack or layer
    by layer depending on the batch (at most 16 tokens: the stack), and the two differ by a float
    rounding, which can move a q8_0 code by a step and so choose the other of two tied tokens."""
    for prompt, reply, reference in zip(prompts, got, expected, strict=True):
        if reply == reference:
            continue
        at = next(i for i, (a, b) in enumerate(zip(reply, reference, strict=True)) if a != b)
        ids = llm.engine.tokenize(prompt) + reference[:at]
        logprobs = llm.engine.prompt_logits(ids)[-1].log_softmax(-1)
        gap = (logprobs[reference[at]] - logprobs[reply[at]]).abs().item()
        assert gap < 1e-2, f"{prompt!r} parts at token {at} from a choice {gap:.4f} apart"


def test_chunks_prefix_hits_and_preemption_keep_the_replies(q8_llm):
    """A budget that preempts, prefills in chunks of 64 and a shared prefix served from the cache
    give the replies of a roomy run (the same codes stored, read in other splits), up to tokens
    tied to a float rounding."""
    prefix = "You are a helpful assistant. Answer every question in one short sentence. " * 3
    prompts = [prefix + "What is the capital of France?", prefix + "Why is the sky blue?"]
    prompts += PROMPTS[2:]
    expected = _tokens(q8_llm, prompts)
    tight = LLM(
        kv_cache_dtype="q8_0",
        kv_cache_memory=20 * 2 * 30 * 16 * 3 * 68,  # 20 blocks: 30 layers' 16 rows of 3 heads
        max_model_len=256,
        max_num_batched_tokens=64,
    )
    assert tight.engine.block_manager.num_blocks == 20
    _assert_same_up_to_near_ties(q8_llm, prompts, _tokens(tight, prompts), expected)
    stats = tight.engine.stats()
    assert tight.engine.scheduler.num_preemptions > 0 and stats.prefix_cache_hits > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensor_parallel_ranks_share_a_q8_0_pool(q8_llm):
    """Three ranks, a KV head each, each with its q8_0 shard of the pool."""
    from tests.engine.distributed.test_tensor_parallel import _close

    expected = _tokens(q8_llm, PROMPTS[:3])
    llm = LLM(tensor_parallel_size=3, kv_cache_dtype="q8_0", kv_cache_memory="64MiB",
              max_model_len=1024)  # fmt: skip
    try:
        assert llm.engine.runner.kv_cache.dtype == torch.int8
        assert _tokens(llm, PROMPTS[:3]) == expected
    finally:
        _close(llm)
