"""llama.cpp (llama-cpp-python) on a GGUF file, as the GGUF family tests and
benchmarks/converter_families.py hold our logits against it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def llama_cpp(path: Path):
    """llama.cpp's model on `path`: a 256-token context, every position's logits kept, 2 threads."""
    from llama_cpp import Llama

    return Llama(
        model_path=str(path),
        n_ctx=256,
        n_batch=256,
        n_ubatch=256,
        logits_all=True,
        n_threads=2,
        verbose=False,
    )


def prompt_logits(llm, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), vocab] float32 logits of one prompt, from an empty context."""
    llm.reset()
    llm.eval(prompt)
    return torch.from_numpy(np.array(llm.scores[: len(prompt)], dtype=np.float32))
