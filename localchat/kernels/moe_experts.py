"""The stacked experts both mixture-of-experts paths read (the torch reference in moe.py, the Triton
kernels in triton_moe.py): dense [E, N, K] tensors or PackedExperts, and the shape check they
share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from localchat.kernels.packed_weight import PackedWeight


@dataclass(frozen=True)
class PackedExperts:
    """E experts' [N, K] weights quantized in one form, stacked: the form the GPU's kernels read
    (kernels/triton_quant_linear.py), row-major with float16 scales. ``qweight`` uint8
    [E, N, K // 2] (u4) or [E, N, K] (u8), ``scales`` float16 [E, N, K // group_size], ``mins``
    likewise or None (symmetric around ``zero_point``)."""

    layout: str  # "u4" or "u8"
    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    group_size: int
    zero_point: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        experts, rows, columns = self.qweight.shape
        return experts, rows, columns * 2 if self.layout == "u4" else columns

    @staticmethod
    def stack(weights: Sequence[PackedWeight]) -> PackedExperts | None:
        """The experts' weights in the GPU's form, stacked (a copy); None where they do not share
        one u4 or u8 form (layout, group size, mins or zero point, shape)."""
        forms = [w.with_float16_scales().with_byte_codes() for w in weights]
        first = forms[0]

        def key(w: PackedWeight) -> tuple:
            return (w.layout, w.group_size, w.mins is None, w.zero_point, w.shape, w.device)

        if first.layout not in ("u4", "u8") or any(key(w) != key(first) for w in forms):
            return None
        mins = None if first.mins is None else torch.stack([w.mins for w in forms])  # type: ignore[misc]
        return PackedExperts(
            first.layout,
            torch.stack([w.qweight for w in forms]),
            torch.stack([w.scales for w in forms]),
            mins,
            first.group_size,
            first.zero_point,
        )

    def expert(self, index: int) -> PackedWeight:
        """Expert `index`'s weight: views into the stacks."""
        return PackedWeight(
            self.layout,
            self.qweight[index],
            self.scales[index],
            None if self.mins is None else self.mins[index],
            self.group_size,
            self.zero_point,
        )

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """[E, N, K] dense, for the reference."""
        return torch.stack(
            [self.expert(i).dequantize(dtype=dtype) for i in range(self.qweight.shape[0])]
        )


Experts = torch.Tensor | PackedExperts


def check_moe_shapes(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: Experts,
    w2: Experts,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
) -> None:
    """Raise ValueError unless the shapes fit: hidden [T, H], weights and ids [T, k], w13
    [E, 2W, H], w2 [E, H, W], b13 [E, 2W], b2 [E, H]."""
    if hidden.dim() != 2 or len(w13.shape) != 3 or len(w2.shape) != 3:
        raise ValueError("hidden must be [T, H], w13 [E, 2W, H] and w2 [E, H, W]")
    tokens, size = hidden.shape
    experts, width = w13.shape[0], w2.shape[2]
    if tuple(ids.shape) != tuple(weights.shape) or ids.dim() != 2 or ids.shape[0] != tokens:
        raise ValueError(
            f"weights and ids must be [{tokens}, k], got {tuple(weights.shape)} and "
            f"{tuple(ids.shape)}"
        )
    if tuple(w13.shape) != (experts, 2 * width, size) or tuple(w2.shape) != (experts, size, width):
        raise ValueError(
            f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit hidden size {size}"
        )
    if b13 is not None and tuple(b13.shape) != (experts, 2 * width):
        raise ValueError(f"b13 must be [{experts}, {2 * width}], got {tuple(b13.shape)}")
    if b2 is not None and tuple(b2.shape) != (experts, size):
        raise ValueError(f"b2 must be [{experts}, {size}], got {tuple(b2.shape)}")
