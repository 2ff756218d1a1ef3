"""The Hugging Face transformers peer: `generate` on the same model, dtype and requests.

Requests go in order, `batch_size` at a time, left-padded (pad = the tokenizer's pad token, else
EOS); each batch runs greedy to its longest requested output (min_new_tokens = max_new_tokens, so
EOS never ends it early) and only each request's own requested tokens count. A streamer timestamps
every decoding step, which gives every request its first-token and per-token times.
"""

from __future__ import annotations

import time

from localchat.bench.gguf_parsing import shared_gguf_parsing
from localchat.bench.offline import Advance, ModelTarget, _noop
from localchat.bench.records import RequestRecord, RunResult
from localchat.bench.workloads import BenchRequest


class _StepClock:
    """A transformers streamer that only records when each decoding step's tokens came out."""

    def __init__(self, on_step=None) -> None:
        self.times: list[float] = []
        self._prompt_seen = False
        self._on_step = on_step

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        if self._on_step is not None:
            self._on_step(len(self.times))

    def end(self) -> None:
        pass


class HFPeer:
    def __init__(self, target: ModelTarget):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.target = target
        self.torch = torch
        directory = str(target.directory)
        if target.load_format == "dummy":
            config = AutoConfig.from_pretrained(directory)
            model = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
        elif target.gguf_path is not None:  # transformers dequantizes the GGUF file itself
            gguf = target.gguf_path
            with shared_gguf_parsing():
                model = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, dtype=target.dtype
                )
        else:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=target.dtype)
        self.model = model.to(target.device).eval()
        self.label = f"HF transformers generate ({str(target.dtype).removeprefix('torch.')})"

    def _generate(self, prompts: list[list[int]], new_tokens: int, clock: _StepClock) -> None:
        from transformers import GenerationConfig

        torch, pad = self.torch, self.target.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor(
            [[pad] * (width - len(p)) + p for p in prompts], device=self.target.device
        )
        attention_mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.target.device
        )
        config = GenerationConfig(
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=list(self.target.eos_token_ids) or None,
        )
        with torch.inference_mode():
            self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                streamer=clock,
            )

    def warm_up(self) -> None:
        self._generate([[self.target.pad_token_id] * 4], 2, _StepClock())

    def run(
        self, requests: list[BenchRequest], batch_size: int, advance: Advance = _noop
    ) -> RunResult:
        """Offline: every request arrives at the start; batches run one after another."""
        records = [RequestRecord(len(r.prompt_token_ids), r.output_len) for r in requests]
        start = time.perf_counter()
        for first in range(0, len(requests), batch_size):
            batch = requests[first : first + batch_size]
            lengths = [r.output_len for r in batch]

            def on_step(step: int, lengths=lengths) -> None:
                advance(sum(1 for n in lengths if n >= step))

            clock = _StepClock(on_step)
            self._generate([r.prompt_token_ids for r in batch], max(lengths), clock)
            for offset, request in enumerate(batch):
                record = records[first + offset]
                record.start = start
                record.token_times = clock.times[: request.output_len]
        duration = time.perf_counter() - start
        return RunResult(
            "hf", f"{self.label}, batch {min(batch_size, len(requests))}", records, duration
        )

    def run_chat(
        self, prompts: list[list[int]], reply_len: int, advance: Advance = _noop
    ) -> RunResult:
        """One turn at a time, each re-reading the whole history (no cache kept between turns)."""
        records = []
        start = time.perf_counter()
        for prompt in prompts:
            record = RequestRecord(len(prompt), reply_len, start=time.perf_counter())
            clock = _StepClock(lambda _: advance(1))
            self._generate([prompt], reply_len, clock)
            record.token_times = clock.times[:reply_len]
            records.append(record)
        return RunResult("hf", self.label, records, time.perf_counter() - start)
