"""Decode CUDA graphs with several KV groups (Gemma 3's full and sliding groups), without a GPU:
the DecodeGraphs' static buffers (a slot mapping and block tables per group, padding rows) are
filled as a replay would read them, and the Triton kernels (under the interpreter) run the captured
forward on them again instead of replaying a graph. The tokens equal transformers' greedy ones,
with sliding blocks given back (-1 in the buffers' tables) while the graphs serve the decodes."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.modeling.cuda_graphs import DecodeGraphs
from localchat.kernels import dispatch
from tests.family_models import VOCAB, save
from tests.kernels.conftest import DEVICE

pytestmark = pytest.mark.skipif(
    DEVICE != "cpu", reason="the interpreter run; on a GPU the graphs are captured for real"
)


class _Replay:
    """A captured graph's stand-in: runs the forward it was captured with on the same static
    buffers, into the graph's output."""

    def __init__(self, graphs: DecodeGraphs, size: int, max_seq_len: int):
        self.graphs, self.size = graphs, size
        self.md = graphs._metadata(size, max_seq_len)
        self.count = 0

    def replay(self) -> None:
        self.count += 1
        self.graphs.outputs[self.size] = self.graphs._forward(self.size, self.md)


class ReplayedGraphs(DecodeGraphs):
    def _capture_all(self, max_seq_len: int) -> None:
        for size in self.sizes:
            self.graphs[size] = _Replay(self, size, max_seq_len)  # type: ignore[assignment]


@pytest.mark.slow  # about 25 s: the full run's
def test_decode_graphs_serve_every_kv_group(tmp_path, monkeypatch):
    hf = save("gemma3", tmp_path)
    hf.generation_config.eos_token_id = None
    generator = torch.Generator().manual_seed(8)
    # three decodes: a padded batch of four (a padding row in every group's buffers); all but
    # the first past the window, so the sliding groups give blocks back while decoding
    prompts = [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (9, 30, 50)]
    num_tokens = 12
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=num_tokens, do_sample=False)[0, len(p) :]
            for p in prompts
        ]
    monkeypatch.setenv("LOCALCHAT_TRITON_ON_CPU", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch._triton_on_cpu.cache_clear()
    try:
        llm = LLM(str(tmp_path), max_model_len=96, kv_cache_memory="1MiB", max_num_seqs=4)
        runner = llm.engine.runner
        assert len(runner.kv_layout.groups) == 3
        graphs = runner.graphs = ReplayedGraphs(runner, 4, -(-96 // 16))
        params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
        outputs = llm.generate(prompts, params)
    finally:
        dispatch._triton_on_cpu.cache_clear()
    assert [o.token_ids for o in outputs] == [e.tolist() for e in expected]
    replays = {size: graph.count for size, graph in graphs.graphs.items()}
    assert replays[4] > 0  # the three decodes, padded to four
    sliding = graphs.block_tables[1][:3]
    assert (sliding[2, :2] == -1).all()  # the longest prompt's first blocks were given back
