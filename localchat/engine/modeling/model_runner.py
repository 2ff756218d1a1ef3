"""ModelRunner: turns a scheduled batch into flat tensors, runs the model once, and samples.

Decodes (one query token) are placed before prefills, as the attention kernels expect; the sampled
tokens are handed back in the scheduler's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from localchat.engine.core.kv_groups import KVLayout, kv_layout
from localchat.engine.core.memory import PrefaultedMemory, resident_zeros
from localchat.engine.core.multimodal import EncoderCache, StepImages, step_images
from localchat.engine.core.scheduler import ScheduledBatch
from localchat.engine.core.sequence import Request, Sequence, TokenLogprob
from localchat.engine.distributed.parallel_layers import TensorParallelDecoder
from localchat.engine.modeling.cuda_graphs import DecodeGraphs
from localchat.engine.modeling.decoder import Attention, DecoderForCausalLM
from localchat.engine.modeling.forward_context import ForwardContext, forward_context
from localchat.engine.modeling.rotary import RotaryTables
from localchat.engine.sampling.guided_decoding import GrammarCompiler
from localchat.engine.sampling.logits_processors import apply_constraints
from localchat.engine.sampling.prompt_logprobs import fill_prompt_logprobs
from localchat.engine.sampling.sampler import Sampler, SamplerOutput, SamplingBatch
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.dispatch import triton_available
from localchat.kernels.kv_quant import kv_row_bytes, kv_row_width


@dataclass(slots=True)
class Verification:
    """A speculative sequence's step: the token sampled after its own tokens (where its drafts
    begin), and the raw logits after each drafted token ([drafts, vocab]), which the engine samples
    from in turn while the drafts hold (ModelRunner.sample)."""

    token_id: int
    logprob: TokenLogprob | None
    later_logits: torch.Tensor


class ModelRunner:
    """Owns the model, the KV pool and the rotary tables on one device."""

    def __init__(
        self,
        model: DecoderForCausalLM,
        hf_config,
        *,
        device: torch.device,
        dtype: torch.dtype,
        kv_cache_dtype: torch.dtype | None = None,
        block_size: int,
        max_model_len: int,
        eos_token_ids: set[int],
        max_num_seqs: int = 256,
    ):
        self.model = model
        self.spec = model.spec
        self.device = device
        self.dtype = dtype
        self.kv_cache_dtype = kv_cache_dtype or dtype  # the pool's; attention computes in `dtype`
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.rotary = RotaryTables(hf_config, self.spec.head_dim, max_model_len, device)
        self.max_num_seqs = max_num_seqs
        self.sampler = Sampler()
        self.grammar_compiler: GrammarCompiler | None = None  # set by the engine with a tokenizer
        self.kv_cache: torch.Tensor | None = None
        self.graphs: DecodeGraphs | None = None
        # which layers share blocks (engine/core/kv_groups.py); one group under tensor parallelism,
        # whose ranks are sent one block table per sequence
        windows = [self.spec.layer(i).sliding_window for i in range(self.spec.num_layers)]
        self.kv_layout: KVLayout = kv_layout(
            windows, hybrid=not isinstance(model, TensorParallelDecoder)
        )
        self._rope_lengths: torch.Tensor | None = None  # set by _prepare, read by _forward
        # a vision-language model's image encoder behind its cache (set by the engine), whether
        # its image tokens attend both ways, and the step's image rows (_prepare to _forward)
        self.encoder_cache: EncoderCache | None = None
        self.bidirectional_images = False
        self._step_images: StepImages | None = None

    # --- KV pool ----------------------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        """The pool's bytes per block: every slot's keys and values (a q8_0 row counts its scales:
        34 bytes per 32 values, kernels/kv_quant.py)."""
        spec = self.spec
        rows = 2 * self.kv_layout.slots * self.block_size * spec.num_kv_heads
        return rows * kv_row_bytes(self.kv_cache_dtype, spec.head_dim)

    def allocate_kv_cache(self, num_blocks: int, memory: PrefaultedMemory | None = None) -> None:
        """One pool [2, slots, blocks, block_size, kv_heads, head_dim]; each layer gets views of
        its slot (a model of one KV group: slot i for layer i). A q8_0 pool's rows are head_dim /
        32 blocks of 34 bytes instead (kernels/kv_quant.py). On the CPU it is carved from
        `memory` where that is given and large enough."""
        spec = self.spec
        slots = self.kv_layout.slots
        row = kv_row_width(self.kv_cache_dtype, spec.head_dim)
        shape = (2, slots, num_blocks, self.block_size, spec.num_kv_heads, row)
        # Zeroed up front on the CPU too, so every page of the pool is resident from the start: the
        # memory the server reports at ready is what it keeps, instead of growing by the pool's size
        # as blocks are first used (llama.cpp clears its cache at start-up too).
        if self.device.type == "cpu":
            dtype = self.kv_cache_dtype
            pool = memory.take(shape, dtype) if memory is not None else None
            self._bind_kv_cache(pool if pool is not None else resident_zeros(shape, dtype))
        else:
            self._bind_kv_cache(torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device))

    def _bind_kv_cache(self, pool: torch.Tensor | None) -> None:
        """Make `pool` the KV pool and give each layer its views and KV group (None releases the
        pool)."""
        self.kv_cache = pool
        placement = self.kv_layout.placement()
        for index, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            assert isinstance(attn, Attention)  # nn.Module attributes are typed Tensor | Module
            empty = torch.empty(0)
            attn.kv_group, slot = placement[index]
            attn.k_cache = empty if pool is None else pool[0, slot]
            attn.v_cache = empty if pool is None else pool[1, slot]

    def capture_cuda_graphs(self) -> DecodeGraphs | None:
        """Capture decode graphs (CUDA with Triton only; the reference kernels synchronize); None
        where they are not used."""
        if self.device.type != "cuda" or not triton_available() or self.rotary.depends_on_length:
            return None
        max_blocks = -(-self.max_model_len // self.block_size)
        self.graphs = DecodeGraphs(self, min(self.max_num_seqs, 512), max_blocks)
        return self.graphs

    @torch.inference_mode()
    def profile_peak_memory(self, num_tokens: int) -> int:
        """Peak bytes allocated by a forward pass over `num_tokens` prompt tokens plus sampling
        `max_num_seqs` rows, using a temporary KV pool just large enough (CUDA)."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        num_tokens = min(num_tokens, self.max_model_len)
        num_blocks = -(-num_tokens // self.block_size)
        self.allocate_kv_cache(num_blocks)
        seq = Request("profile", [0] * num_tokens, SamplingParams(max_tokens=1)).seqs[0]
        # every group in the same blocks: their keys are not read back for anything but the time
        seq.block_tables = [list(range(num_blocks))] * len(self.kv_layout.groups)
        hidden = self._forward(*self._prepare([seq], [num_tokens])[:3])
        rows = hidden[-1:].expand(min(self.max_num_seqs, num_tokens), -1)
        self.model.compute_logits(rows).float().softmax(dim=-1)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        self._bind_kv_cache(None)
        del hidden, rows
        torch.cuda.empty_cache()
        return peak

    # --- other processes --------------------------------------------------------------------------
    # Every runner has these; a tensor-parallel one (distributed/tp_runner.py) fills them in, so the
    # engine calls them without asking whether they exist.
    def check_health(self) -> None:
        """Raise EngineDeadError when a part of the runner in another process has died (the engine
        calls this every second while idle); one process has none."""

    def close(self) -> None:
        """Release what the runner holds in other processes (a tensor-parallel group's ranks)."""

    # --- one step ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(
        self, batch: ScheduledBatch
    ) -> list[tuple[int, TokenLogprob | None] | Verification | None]:
        """Compute the batch; per scheduled sequence (scheduler order) its (token, logprob), a
        Verification where it has drafted tokens, or None when it does not sample this step (a
        prefill chunk short of the prompt's end)."""
        order = sorted(range(len(batch.seqs)), key=lambda i: batch.num_new_tokens[i] != 1)
        seqs = [batch.seqs[i] for i in order]
        num_new = [batch.num_new_tokens[i] for i in order]
        input_ids, positions, md, sample_rows = self._prepare(seqs, num_new)
        sample_rows = [row for row in sample_rows if seqs[row].request.pooling is None]
        sampling_seqs = [seqs[row] for row in sample_rows]
        if (
            self.graphs is not None
            and self._step_images is None  # image rows are embedded outside the graphs
            and md.num_decodes == len(seqs) <= self.graphs.max_batch_size
        ):
            hidden = self.graphs.replay(input_ids, positions, md)
        else:
            hidden = self._forward(input_ids, positions, md)
        for row, seq in enumerate(seqs):
            chunk = hidden[md.query_start_loc_cpu[row] : md.query_start_loc_cpu[row + 1]]
            if seq.prompt_logprobs is not None:
                fill_prompt_logprobs(seq, chunk, seq.num_computed_tokens, self.model.compute_logits)
            if seq.request.pooling is not None:  # an embedding: pooled, never sampled
                pool_chunk(seq, chunk)
        results: list = [None] * len(batch.seqs)
        if not sample_rows:
            return results
        # the position after each sampling sequence's own tokens; then, for a speculative one, the
        # position after each of its drafted tokens (one projection for all)
        drafts = [len(seqs[row].draft_token_ids) for row in sample_rows]
        ends = [md.query_start_loc_cpu[row + 1] for row in sample_rows]
        rows = [end - 1 - d for end, d in zip(ends, drafts, strict=True)]
        for end, d in zip(ends, drafts, strict=True):
            rows.extend(range(end - d, end))
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        sampled = self._sample(logits[: len(ends)], sampling_seqs)
        later = len(ends)
        for row, d, token, logprob in zip(
            sample_rows, drafts, sampled.token_ids, sampled.logprobs, strict=True
        ):
            results[order[row]] = (token, logprob)
            if d:  # sampled from where its drafts begin; the rest once the engine has compared
                results[order[row]] = Verification(token, logprob, logits[later : later + d])
                later += d
        return results

    @torch.inference_mode()
    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> list[tuple[int, TokenLogprob | None]]:
        """Sample one token per row of `logits` ([len(seqs), vocab], raw) for `seqs` as they are
        now (their penalties, grammar state and counts): a speculative step's later positions."""
        sampled = self._sample(logits.clone(), seqs)
        return list(zip(sampled.token_ids, sampled.logprobs, strict=True))

    @torch.inference_mode()
    def prompt_logits(self, seq: Sequence) -> torch.Tensor:
        """Logits at every position of a sequence whose blocks are allocated (for parity checks)."""
        input_ids, positions, md, _ = self._prepare(
            [seq], [seq.num_tokens - seq.num_computed_tokens]
        )
        return self.model.compute_logits(self._forward(input_ids, positions, md)).float()

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states of every token, run eagerly."""
        lengths, self._rope_lengths = self._rope_lengths, None
        images, self._step_images = self._step_images, None
        if lengths is None and self.rotary.depends_on_length:  # a batch _prepare did not plan
            counts = np.diff(np.asarray(md.query_start_loc_cpu))
            lengths = torch.from_numpy(np.repeat(np.asarray(md.seq_lens_cpu), counts))
        with forward_context(ForwardContext(md, self.rotary.lookup(positions, lengths), images)):
            return self.model(input_ids)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        sampling = SamplingBatch.from_seqs(
            seqs, self.spec.vocab_size, self.eos_token_ids, self.device
        )
        logits = apply_constraints(logits, seqs, self.grammar_compiler)
        return self.sampler(logits, sampling)

    def _prepare(self, seqs: list[Sequence], num_new: list[int]):
        """Flat input ids, positions and attention metadata for the ordered batch."""
        block_size = self.block_size
        starts = [seq.num_computed_tokens for seq in seqs]
        seq_lens = [start + n for start, n in zip(starts, num_new, strict=True)]
        input_ids: list[int] = []
        for seq, start, end in zip(seqs, starts, seq_lens, strict=True):
            input_ids.extend(seq.token_ids[start:end])
            if end > seq.num_tokens:  # a speculative step's drafted tokens follow its own
                input_ids.extend(seq.draft_token_ids[: end - seq.num_tokens])
        query_start_loc = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(num_new, out=query_start_loc[1:])
        seq_index = np.repeat(np.arange(len(seqs)), num_new)
        positions = np.arange(len(input_ids)) - np.repeat(
            query_start_loc[:-1] - np.asarray(starts), num_new
        )
        # [groups, seqs, blocks]: each KV group's tables (a sequence's are all as long)
        max_blocks = max(len(seq.block_tables[0]) for seq in seqs)
        num_groups = len(seqs[0].block_tables)
        block_tables = np.full((num_groups, len(seqs), max_blocks), -1, dtype=np.int32)
        for row, seq in enumerate(seqs):
            for group, table in enumerate(seq.block_tables):
                block_tables[group, row, : len(table)] = table
        # C order: fancy indexing after a slice lays the groups out innermost
        slot_mapping = np.ascontiguousarray(
            block_tables[:, seq_index, positions // block_size].astype(np.int64) * block_size
            + positions % block_size
        )
        if self.rotary.depends_on_length:
            # a length-dependent rotary table (longrope, dynamic NTK) reads each token's sequence
            # length as a whole (prompt and outputs so far), as transformers' one pass over it does
            lengths = np.repeat(np.asarray([seq.num_tokens for seq in seqs]), num_new)
            self._rope_lengths = torch.from_numpy(lengths)
        if self.encoder_cache is not None and any(seq.request.images for seq in seqs):
            chunks = [
                (seq.request.images, start, end, int(query_start_loc[row]))
                for row, (seq, start, end) in enumerate(zip(seqs, starts, seq_lens, strict=True))
            ]
            self._step_images = step_images(
                chunks, self.encoder_cache, self.bidirectional_images, self.device
            )
        num_decodes = sum(1 for n in num_new if n == 1)
        sample_rows = [
            row
            for row, seq in enumerate(seqs)
            if seq_lens[row] == seq.num_tokens + len(seq.draft_token_ids)
        ]
        to_device = self._to_device
        md = AttentionMetadata(
            slot_mapping=to_device(slot_mapping[0]),
            query_start_loc=to_device(query_start_loc.astype(np.int32)),
            seq_lens=to_device(np.asarray(seq_lens, dtype=np.int32)),
            block_tables=to_device(block_tables[0]),
            num_decodes=num_decodes,
            max_query_len=max(num_new),
            max_seq_len=max(seq_lens),
            seq_lens_cpu=seq_lens,
            query_start_loc_cpu=query_start_loc.tolist(),
        )
        md.group_views = tuple(
            md.with_tables(to_device(slot_mapping[g]), to_device(block_tables[g]))
            for g in range(1, num_groups)
        )
        return (
            to_device(np.asarray(input_ids, dtype=np.int64)),
            to_device(positions),
            md,
            sample_rows,
        )

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cpu":
            return tensor
        # through pinned memory (torch caches those buffers), so the copy is asynchronous
        return tensor.pin_memory().to(self.device, non_blocking=True)


def pool_chunk(seq: Sequence, chunk: torch.Tensor) -> None:
    """Fold the final hidden states of an embedding's prefill chunk (starting at
    `seq.num_computed_tokens`) into `seq.pooled`: their float32 sum (mean pooling; the engine
    divides), or the last token's state once the chunk reaches the prompt's end (last pooling)."""
    if seq.request.pooling == "mean":
        total = chunk.float().sum(dim=0)
        start = seq.num_computed_tokens
        seq.pooled = total if start == 0 or seq.pooled is None else seq.pooled + total
    elif seq.num_computed_tokens + len(chunk) == seq.num_tokens:
        seq.pooled = chunk[-1].float()
