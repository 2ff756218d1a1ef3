"""The llama.cpp peer: llama-cpp-python on the same GGUF file (its own quantized weights), same
requests.

llama-cpp-python's `Llama` runs one sequence at a time, so an offline batch runs request after
request (TTFT counts the wait, as for every system here: all requests arrive at the start). Greedy,
and exactly the requested number of tokens: `Llama.generate` never stops by itself, we stop it.
Between requests it keeps whatever prefix of its KV cache the next prompt shares (which only the
chat workload has).
"""

from __future__ import annotations

import time
from pathlib import Path

from localchat.bench.offline import Advance, ModelTarget, _noop
from localchat.bench.records import RequestRecord, RunResult
from localchat.bench.workloads import BenchRequest
from localchat.errors import LocalchatError

INSTALL_HINT = "pip install 'localchat[llama-cpp]' (or: pip install llama-cpp-python)"


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def gguf_for(target: ModelTarget, gguf: str | None) -> Path:
    path = Path(gguf) if gguf else target.gguf_path
    if path is None:
        raise LocalchatError(
            f"--compare llama-cpp needs a GGUF file: {target.name} is not one; pass --gguf FILE"
        )
    if not path.is_file():
        raise LocalchatError(f"--gguf {path}: no such file")
    return path


class LlamaCppPeer:
    def __init__(self, gguf_path: Path, num_threads: int, n_ctx: int, seed: int = 0):
        try:
            from llama_cpp import Llama
        except ImportError:
            raise LocalchatError(
                f"--compare llama-cpp needs llama-cpp-python, which is not installed: "
                f"{INSTALL_HINT}"
            ) from None
        self.llm = Llama(
            model_path=str(gguf_path),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=num_threads,
            n_threads_batch=num_threads,
            seed=seed,
            verbose=False,
        )
        self.label = f"llama.cpp ({gguf_path.name}, one sequence at a time)"

    def _generate(
        self, prompt: list[int], new_tokens: int, record: RequestRecord, advance: Advance
    ) -> None:
        for token in self.llm.generate(
            prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0
        ):
            del token
            record.token_times.append(time.perf_counter())
            advance(1)
            if len(record.token_times) >= new_tokens:
                break

    def warm_up(self) -> None:
        self._generate([1, 2, 3, 4], 2, RequestRecord(4, 2), _noop)
        self.llm.reset()

    def run(self, requests: list[BenchRequest], advance: Advance = _noop) -> RunResult:
        records = [RequestRecord(len(r.prompt_token_ids), r.output_len) for r in requests]
        start = time.perf_counter()
        for request, record in zip(requests, records, strict=True):
            record.start = start
            self._generate(request.prompt_token_ids, request.output_len, record, advance)
        return RunResult("llama-cpp", self.label, records, time.perf_counter() - start)

    def run_chat(
        self, prompts: list[list[int]], reply_len: int, advance: Advance = _noop
    ) -> RunResult:
        records = []
        start = time.perf_counter()
        for prompt in prompts:
            record = RequestRecord(len(prompt), reply_len, start=time.perf_counter())
            self._generate(prompt, reply_len, record, advance)
            records.append(record)
        return RunResult("llama-cpp", self.label, records, time.perf_counter() - start)
