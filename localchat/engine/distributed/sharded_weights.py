"""Cut a projection weight (dense, a PackedWeight, or a tuple of PackedWeights whose rows stack)
by output rows (column-parallel) or by input columns (row-parallel).

A quantized weight's input dimension is cut only on group boundaries, so each shard keeps the
file's codes, scales and mins unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from localchat.errors import InvalidParameterError
from localchat.kernels.packed_weight import GROUPS_PER_SUPER, U6_CHUNK, PackedWeight

Weight = torch.Tensor | PackedWeight | tuple[PackedWeight, ...]


def take_rows(weight: Weight, rows: torch.Tensor) -> Weight:
    """The output rows `rows` (increasing) of the weight."""
    if isinstance(weight, torch.Tensor):
        return weight.detach()[rows].contiguous()
    if isinstance(weight, PackedWeight):
        return weight.select_rows(rows)
    parts: list[PackedWeight] = []
    offset = 0
    for part in weight:
        count = part.shape[0]
        inside = rows[(rows >= offset) & (rows < offset + count)] - offset
        if inside.numel():
            parts.append(part.select_rows(inside))
        offset += count
    return parts[0] if len(parts) == 1 else tuple(parts)


def take_columns(weight: Weight, start: int, end: int) -> Weight:
    """Input columns [start, end) of the weight."""
    if isinstance(weight, torch.Tensor):
        return weight.detach()[:, start:end].contiguous()
    if isinstance(weight, tuple):
        return tuple(_packed_columns(part, start, end) for part in weight)
    return _packed_columns(weight, start, end)


def _u6_columns(weight: PackedWeight, start: int, end: int) -> PackedWeight:
    """Columns of a u6 weight: both planes cut where the cut falls on its 128-weight chunks, else
    the codes a byte each (u8)."""
    if start % U6_CHUNK or end % U6_CHUNK:
        return _packed_columns(weight.with_byte_codes(), start, end)
    weight = weight.row_major()
    q, half = weight.qweight, weight.in_features // 2
    planes = (q[:, start // 2 : end // 2], q[:, half + start // 4 : half + end // 4])
    return replace(
        weight,
        qweight=torch.cat(planes, dim=1),
        scales=weight.scales[:, start // weight.group_size : end // weight.group_size].contiguous(),
    )


def _packed_columns(weight: PackedWeight, start: int, end: int) -> PackedWeight:
    weight = weight.repacked().row_major()  # (the file's blocks are cut as u6 or u4)
    group = weight.group_size
    if start % group or end % group:
        raise InvalidParameterError(
            f"a tensor-parallel shard of a quantized weight must start and end on its groups of "
            f"{group} inputs; columns [{start}, {end}) do not (use fewer ranks)",
            param="tensor_parallel_size",
        )
    if weight.layout == "u6":
        return _u6_columns(weight, start, end)
    per_byte = 2 if weight.layout == "u4" else 1
    super_columns = group * GROUPS_PER_SUPER
    if weight.super_scales is not None and (start % super_columns or end % super_columns):
        # K-quant scales are per super-block: a cut inside one takes the per-group float16 form
        weight = weight.with_float16_scales()

    supers = weight.super_scales

    def cut(tensor: torch.Tensor, per_column: int) -> torch.Tensor:
        return tensor[:, start // per_column : end // per_column].contiguous()

    return PackedWeight(
        weight.layout,
        cut(weight.qweight, per_byte),
        cut(weight.scales, group),
        # K-quant mins are the sub-scales' top bits, two groups a byte
        None if weight.mins is None else cut(weight.mins, group * (1 if supers is None else 2)),
        group,
        weight.zero_point,
        weight.source_type,
        super_scales=None if supers is None else cut(supers, super_columns // 2),
    )
