"""A GGUF tensor kept as the file's own blocks, its rows dequantized as they are looked up.

An untied token embedding is only ever looked up: a decode step reads one of its rows, a prefill
chunk a few hundred. Kept in the file's memory map it needs no repacked copy in memory (a
Llama-3-8B Q4_K_M file's is 282 MiB) and no time at load; each lookup repacks just the rows it
reads, so its values are those of the repacked weight's lookup, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType

from localchat.engine.loading.gguf_repack import repack
from localchat.errors import InvalidParameterError
from localchat.kernels.quant_linear import embedding_rows


@dataclass(frozen=True)
class GgufRows:
    """A quantized [rows, cols] GGUF tensor in the file's blocks (`blocks`: uint8 [rows, row
    bytes], usually the memory map itself), read a row at a time."""

    blocks: np.ndarray
    qtype: GGMLQuantizationType
    shape: tuple[int, int]

    @property
    def source_type(self) -> str:
        return self.qtype.name

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` (any shape) as dense `dtype` [*ids.shape, cols]."""
        flat = ids.reshape(-1).cpu().numpy()
        if flat.size and (flat.min() < 0 or flat.max() >= self.shape[0]):
            raise InvalidParameterError(
                f"token ids must lie in [0, {self.shape[0]}), got {int(flat.min())} to "
                f"{int(flat.max())}",
                param="prompt",
            )
        picked = repack(self.blocks[flat], self.qtype, (flat.size, self.shape[1]))
        out = embedding_rows(picked, torch.arange(flat.size), dtype)
        return out.reshape(*ids.shape, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The whole tensor as float32 [rows, cols] (every row read)."""
        return self.rows(torch.arange(self.shape[0]), torch.float32)
