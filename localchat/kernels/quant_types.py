"""The GGUF quantization types the CPU kernels read, one record per type, parsed from the table
the C++ kernels include (kernels/csrc/quant/types.def), so that Python and C++ read the same
numbers from one place. packed_weight.py and engine/loading/gguf_repack.py derive their tables from
it; docs/kernels.md says how to add a type."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).parent / "csrc" / "quant" / "types.def"
FIRST_ARRANGEMENT = 2  # 0: row-major, 1: interleaved; then one per type, in the table's order


@dataclass(frozen=True)
class QuantType:
    """One row of types.def (its header explains the columns)."""

    name: str  # GGML's: Q4_K, ...
    ggml_id: int  # GGMLQuantizationType
    layout: str  # the PackedWeight layout that keeps the file's blocks
    block_weights: int
    block_bytes: int
    bits: int  # of the codes the kernels form from a block
    group_size: int
    zero_point: int  # symmetric types; 0 where the blocks hold mins
    mins: bool
    k_scales: bool
    repacked: str  # u4, u6 or u8
    arrangement: int  # PackedWeight.arrangement of the layout (the C++ Arrangement)


def _parse(text: str) -> tuple[QuantType, ...]:
    types: list[QuantType] = []
    for match in re.finditer(r"^LC_QUANT_TYPE\(([^)]*)\)", text, re.MULTILINE):
        fields = [field.strip() for field in match.group(1).split(",")]
        name, ggml_id, layout, weights, size, bits, group, zero, mins, k_scales, repacked = fields
        types.append(
            QuantType(
                name,
                int(ggml_id),
                layout,
                int(weights),
                int(size),
                int(bits),
                int(group),
                int(zero),
                mins == "1",
                k_scales == "1",
                repacked,
                FIRST_ARRANGEMENT + len(types),
            )
        )
    if not types:
        raise RuntimeError(f"no LC_QUANT_TYPE rows in {TABLE}")
    return tuple(types)


QUANT_TYPES: tuple[QuantType, ...] = _parse(TABLE.read_text())
BY_NAME = {t.name: t for t in QUANT_TYPES}
BY_LAYOUT = {t.layout: t for t in QUANT_TYPES}
