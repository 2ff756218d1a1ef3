"""The hybrid KV cache on the tiny windowed families (window WINDOW = 24 tokens), against
transformers' greedy tokens: the blocks a window has left are given back and reused, so a KV budget
too small for every layer's keys at full length carries a long generation, a batch that preempts,
chunked prefills and prefix-cached follow-ups."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.core.kv_groups import kv_layout
from localchat.engine.modeling.registry import spec_from_config
from tests.family_models import WINDOW, WINDOWED, hf_greedy, random_prompts, save

MAX_MODEL_LEN = 128
BLOCK_SIZE = 16


# gemma2 (local and global layers interleaved, two KV groups) in the fast subset; the other
# windowed families (about 20-60 s each here) in the full run
FAST_FAMILY = "gemma2"


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=() if name == FAST_FAMILY else pytest.mark.slow)
        for name in WINDOWED
    ],
)
def family(request, tmp_path_factory):
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    hf = save(name, directory)
    hf.generation_config.eos_token_id = None
    return name, str(directory), hf


def _budget(hf, num_seqs: int, chunk: int) -> tuple[int, int]:
    """(the KV bytes that hold `num_seqs` sequences of MAX_MODEL_LEN tokens with the windows'
    blocks given back, the bytes of every layer's keys for one such sequence)."""
    spec = spec_from_config(hf.config)
    layout = kv_layout([spec.layer(i).sliding_window for i in range(spec.num_layers)])
    row = 2 * spec.num_kv_heads * spec.head_dim * 4  # float32 keys and values, one layer
    blocks = num_seqs * layout.blocks_per_sequence(MAX_MODEL_LEN, BLOCK_SIZE, chunk)
    return blocks * layout.slots * BLOCK_SIZE * row, spec.num_layers * MAX_MODEL_LEN * row


class Run:
    """Requests stepped to the end (a bounded number of steps), watching the pool."""

    def __init__(self, llm: LLM):
        self.engine = llm.engine
        self.peak_blocks = 0

    def greedy(self, prompts, max_tokens: int, n: int = 1, max_steps: int = 3000):
        engine = self.engine
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, n=n)
        ids = [f"req-{id(self)}-{len(engine.requests)}-{i}" for i in range(len(prompts))]
        tokens: dict[str, list[list[int]]] = {i: [[] for _ in range(n)] for i in ids}
        for request_id, prompt in zip(ids, prompts, strict=True):
            engine.add_request(request_id, prompt, params)
        for _ in range(max_steps):
            if not engine.has_unfinished():
                break
            for output in engine.step():
                for piece in output.outputs:
                    tokens[output.request_id][piece.index] += piece.token_ids
            bm = engine.block_manager
            self.peak_blocks = max(self.peak_blocks, bm.num_blocks - bm.num_free_blocks)
        else:
            raise AssertionError(f"not done in {max_steps} steps")
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks  # every block back once nothing runs
        return [tokens[i] if n > 1 else tokens[i][0] for i in ids]


def test_a_long_generation_fits_a_budget_that_holds_the_windows_only(family):
    """Every layer's keys for 128 tokens would not fit the budget; the full layers' and the
    windows' do."""
    _, directory, hf = family
    chunk = 16
    budget, every_layer = _budget(hf, 1, chunk)
    assert budget < every_layer
    prompt = random_prompts([20], seed=1)[0]
    num_tokens = MAX_MODEL_LEN - len(prompt)
    llm = LLM(
        directory,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory=budget,
        max_num_batched_tokens=chunk,
        max_num_seqs=4,
    )
    run = Run(llm)
    assert run.greedy([prompt], num_tokens) == [hf_greedy(hf, prompt, num_tokens)]
    # not by preempting itself and taking back only its windows from the prefix cache
    assert llm.engine.scheduler.num_preemptions == 0


def test_a_batch_that_preempts_keeps_the_tokens(family):
    _, directory, hf = family
    budget, _ = _budget(hf, 1, 32)  # one full-length sequence: three at once preempt
    prompts = random_prompts([2 * WINDOW + 5, 70, 3 * WINDOW + 9], seed=2)
    expected = [hf_greedy(hf, p, 40) for p in prompts]
    llm = LLM(
        directory,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory=budget,
        max_num_batched_tokens=32,
        max_num_seqs=4,
    )
    assert Run(llm).greedy(prompts, 40) == expected
    assert llm.engine.scheduler.num_preemptions > 0


def test_a_chunked_prefill_gives_back_blocks_within_the_prompt(family):
    """Chunks shorter than the window: each chunk's queries read the window's keys from the
    chunks before, whose older blocks are already given back."""
    _, directory, hf = family
    prompt = random_prompts([4 * WINDOW + 7], seed=3)[0]
    llm = LLM(
        directory,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory="4MiB",
        max_num_batched_tokens=11,
        max_num_seqs=4,
    )
    run = Run(llm)
    assert run.greedy([prompt], 12) == [hf_greedy(hf, prompt, 12)]
    layout = llm.engine.runner.kv_layout
    every_block = len(layout.groups) * -(-(len(prompt) + 12) // BLOCK_SIZE)
    assert run.peak_blocks < every_block


def test_prefix_cached_follow_ups_keep_the_tokens(family):
    """A chat's next turn (its history cached, the sliding groups' last blocks with it), a prompt
    that shares only an early part (served by blocks the windows had given back, found by their
    hashes), and two samples of one prompt sharing it."""
    _, directory, hf = family
    first = random_prompts([50], seed=4)[0]  # and 20 generated: sliding blocks 0 and 1 given back
    llm = LLM(directory, max_model_len=MAX_MODEL_LEN, kv_cache_memory="4MiB")
    run = Run(llm)
    (reply,) = run.greedy([first], 20)
    assert reply == hf_greedy(hf, first, 20)
    bm = llm.engine.block_manager
    turn = first + reply + random_prompts([15], seed=5)[0]
    hits = bm.prefix_cache_hits
    assert run.greedy([turn], 10) == [hf_greedy(hf, turn, 10)]
    assert bm.prefix_cache_hits - hits == (len(first) + len(reply)) // BLOCK_SIZE * BLOCK_SIZE
    early = first[:40] + random_prompts([9], seed=6)[0]  # the cut after 32 tokens reads from 9 on
    hits = bm.prefix_cache_hits
    assert run.greedy([early], 10) == [hf_greedy(hf, early, 10)]
    assert bm.prefix_cache_hits - hits == 32
    twice = random_prompts([3 * WINDOW], seed=7)[0]
    assert run.greedy([twice], 10, n=2) == [[hf_greedy(hf, twice, 10)] * 2]


def test_the_cpu_default_context_counts_the_windows():
    """A Gemma 3 12B-shaped config (8 global layers of 48, local window 1024) with a float16 pool:
    the default 1 GiB KV budget holds one sequence of the CPU's default 8192 tokens, where keeping
    every layer's keys (one group, as under tensor parallelism) held 2720."""
    import transformers

    from localchat.config import EngineConfig
    from localchat.engine.core.runtime import _max_model_len

    config = transformers.Gemma3TextConfig(
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        hidden_size=3840,
        sliding_window=1024,
        max_position_embeddings=131072,
    )
    cpu = torch.device("cpu")
    windows = _max_model_len(EngineConfig(), config, cpu, torch.float16, chunk=512)
    every_layer = _max_model_len(
        EngineConfig(tensor_parallel_size=2), config, cpu, torch.float16, chunk=512
    )
    assert (windows, every_layer) == (8192, 2720)


def test_a_longrope_switch_recomputes_a_windowed_sequence(tmp_path, monkeypatch):
    """Phi-3.5/Phi-4 mini's longrope with a window on every layer: a sequence that outgrows the
    original context (48) is computed again under the long factors, its given-back blocks and
    salt included, and matches transformers; a second one shares nothing across the switch."""
    from tests import family_models

    config_class, model_class, overrides = family_models.FAMILIES["phi4-mini"]
    monkeypatch.setitem(
        family_models.FAMILIES,
        "phi4-mini-window",
        (config_class, model_class, {**overrides, "sliding_window": WINDOW}),
    )
    hf = save("phi4-mini-window", tmp_path)
    hf.generation_config.eos_token_id = None
    assert hf.config.sliding_window == WINDOW
    prompts = random_prompts([40, 44], seed=9)  # past the window, and past 48 while generating
    llm = LLM(str(tmp_path), max_model_len=MAX_MODEL_LEN, kv_cache_memory="4MiB")
    assert llm.engine.block_manager.recompute_on_salt_change
    assert Run(llm).greedy(prompts, 16) == [hf_greedy(hf, p, 16) for p in prompts]
