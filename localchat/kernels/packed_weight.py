"""PackedWeight: a quantized [out, in] projection weight in the layouts our kernels consume.

Every GGUF block type is repacked into one of these layouts, keeping the file's integer codes
(``q6k``, ``q4k``, ``q5k``, ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1`` and ``mxfp4`` keep the
file's blocks as they are):

- ``u4``: 4-bit unsigned codes, two per byte. Within each group of 32 weights along the input
  dimension, byte j (0..15) holds weight j in its low nibble and weight j + 16 in its high nibble
  (ggml's order). ``qweight`` is uint8 [out, in // 2]. Q4_0, Q4_1 and Q4_K land here.
- ``u6``: 6-bit unsigned codes in two planes, ``qweight`` uint8 [out, in // 2 + in // 4]: a row's
  low nibbles first (in // 2 bytes; within each group of 16, byte i holds weight i in its low nibble
  and weight i + 8 in its high one), then its top two bits (in // 4 bytes; see ``pack_u6``). Group
  size 16, ``in`` a multiple of 128: Q6_K lands here, in 6 bits per weight as the file has it.
- ``u8``: 8-bit unsigned codes, one per byte, ``qweight`` uint8 [out, in]. Q8_0, Q5_0, Q5_1, Q5_K
  and MXFP4 land here (5-bit codes are stored in a byte: exact, but larger than the file).
- ``q6k``: Q6_K's own blocks as the GGUF file stores them, ``qweight`` uint8
  [out, in // 256 * 210] (usually the file's memory map itself: nothing is copied), ``scales``
  empty [out, 0] (they are in the blocks). The vector kernels (AVX-512 VNNI, AVX2) read it as
  they read u6 (kernels/csrc/quant_q6k.h), with the same float16 group scales; everything else
  sees it through ``repacked`` (as u6).
- ``q4k`` and ``q5k``: Q4_K's and Q5_K's own blocks likewise, ``qweight`` uint8
  [out, in // 256 * 144] or [out, in // 256 * 176], ``scales`` empty [out, 0], no mins: the
  vector kernels read them as they read a u4 K-quant weight (kernels/csrc/quant_k_blocks.h;
  Q5_K's fifth bit joins the nibbles in registers), with the same scales and mins; ``repacked``
  gives the u4 (Q4_K) or u8 (Q5_K) K-quant weight.
- ``q8_0``: Q8_0's own blocks likewise, ``qweight`` uint8 [out, in // 32 * 34], ``scales`` empty
  [out, 0], zero point 128: the vector kernels read it as they read u8 (kernels/csrc/quant_q8_0.h,
  flipping each int8 code's top bit), with the same scales; ``repacked`` gives that u8 weight.
- ``q4_0`` and ``q4_1``: Q4_0's and Q4_1's own blocks likewise, ``qweight`` uint8
  [out, in // 32 * 18] or [out, in // 32 * 20], ``scales`` empty [out, 0], no mins (Q4_1's are
  in its blocks), zero point 8 (Q4_0) or 0: a block's 16 code bytes are a u4 group's, so the
  vector kernels read them as they read u4 (kernels/csrc/quant_q4_0_q4_1.h), with the same
  scales and mins; ``repacked`` gives that u4 weight.
- ``q5_0`` and ``q5_1``: Q5_0's and Q5_1's own blocks likewise, ``qweight`` uint8
  [out, in // 32 * 22] or [out, in // 32 * 24] (d, and m for Q5_1, then 4 bytes of fifth bits, bit j
  for weight j, then 16 bytes of low nibbles as Q4's), zero point 16 (Q5_0) or 0: the vector kernels
  read the nibbles as u4's and add the fifth bits in registers (kernels/csrc/quant_q4_q5_blocks.h);
  ``repacked`` gives the u8 weight (codes 0-31, the same scales and mins).
- ``mxfp4``: MXFP4's own blocks likewise (gpt-oss's experts), ``qweight`` uint8 [out, in // 32 * 17]
  (an E8M0 exponent byte e, then 16 bytes of 4-bit E2M1 codes in Q4_0's nibble order), zero point
  12: each code is read as its E2M1 value doubled plus 12 (0-24) with the scale 2^(e - 128) as a
  float (kernels/csrc/quant/generic/blocks.h); ``repacked`` gives the u8 weight (those codes, the
  scales in float16: exact for e in 104-143, where real weights lie).

A weight's value is ``scales[n, g] * code + mins[n, g]`` for the group g = k // group_size, or, when
``mins`` is None (symmetric types), ``scales[n, g] * (code - zero_point)``. Scales and mins are
float16 [out, in // group_size]; group_size is 32 (16 for Q6_K).

Q4_K and Q5_K keep their scales as the file has them (``super_scales``): each group has a 6-bit
sub-scale and sub-min, and ``super_scales`` float16 [out, in // 128] holds each super-block's
(d, dmin) pair (one per 8 groups), so a group's scale is d * sub-scale and its min -dmin * sub-min.
The sub-scales and sub-mins take 12 bits a group, as in the file (``pack_k_params``): ``scales``
uint8 [out, groups] holds each group's low four bits of both (sub-scale | sub-min << 4) and
``mins`` uint8 [out, groups // 2] their top two bits, two groups a byte (group 2i in bits 0-3,
its sub-scale's bits in 0-1 and its sub-min's in 2-3; group 2i + 1 in bits 4-7). Nothing is
rounded, and Q4_K reads 4.5 bits per weight, as the file does. Only Q6_K's scale products
(d x 8-bit sub-scale) are rounded to float16.

On the CPU, the weights the C++ kernel multiplies are ``interleaved``: every block of four rows (the
rows one pass of the kernel reads together) is stored 64 bytes of codes at a time, row after row (a
short last piece of t bytes likewise), and its scales and mins 16 groups at a time, so a pass reads
one stream instead of four (K-quant ``mins``, half as wide, 8 bytes at a time). Rows past the
last whole block stay row-major. The tensors keep their shapes; ``codes``, ``dequantize`` and
``select_rows`` read either layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from localchat.kernels.quant_types import BY_LAYOUT, QUANT_TYPES

REPACKED_LAYOUTS = ("u4", "u6", "u8")
LAYOUTS = (*REPACKED_LAYOUTS, *BY_LAYOUT)
# the layouts that are the file's own blocks (quant_types.py, one per GGUF type): (weights, bytes)
# of a block, and the arrangement the C++ kernels know it by
FILE_BLOCKS = {t.layout: (t.block_weights, t.block_bytes, t.arrangement) for t in QUANT_TYPES}
# each such layout's group size and zero point (asymmetric types: 0, their mins are in the blocks)
BLOCK_GROUPS = {t.layout: (t.group_size, t.zero_point) for t in QUANT_TYPES}
Q6K_BYTES = BY_LAYOUT["q6k"].block_bytes
Q4K_BYTES, Q5K_BYTES = BY_LAYOUT["q4k"].block_bytes, BY_LAYOUT["q5k"].block_bytes
Q8_0_BYTES = BY_LAYOUT["q8_0"].block_bytes
U6_CHUNK = 128  # u6 weights whose high bits share one 32-byte piece of the second plane
ROWS_PER_BLOCK = 4  # rows interleaved together (the kernel's rows per pass)
CODE_UNIT = 64  # bytes of a row's codes stored together when interleaved
GROUP_UNIT = 16  # scales (and mins) stored together when interleaved
SUPER_UNIT = 4  # halves of super_scales stored together when interleaved (16 groups' pairs)
GROUPS_PER_SUPER = 8  # K-quant groups sharing one (d, dmin) pair


def interleave_rows(t: torch.Tensor, unit: int, back: bool = False) -> torch.Tensor:
    """A copy of the 2-D `t` with its rows interleaved in blocks of ROWS_PER_BLOCK, `unit`
    elements at a time (or, with `back`, restored to row-major): the torch reference for the C++
    kernel's layout."""
    rows, width = t.shape
    whole = rows // ROWS_PER_BLOCK * ROWS_PER_BLOCK
    full, tail = divmod(width, unit)
    out = t.clone()
    if whole == 0:
        return out
    blocks = whole // ROWS_PER_BLOCK
    if back:
        flat = t[:whole].reshape(blocks, ROWS_PER_BLOCK * width)
        split = ROWS_PER_BLOCK * full * unit
        head = flat[:, :split].reshape(blocks, full, ROWS_PER_BLOCK, unit).transpose(1, 2)
        head = head.reshape(blocks, ROWS_PER_BLOCK, full * unit)
        tails = flat[:, split:].reshape(blocks, ROWS_PER_BLOCK, tail)
        out[:whole] = torch.cat((head, tails), dim=2).reshape(whole, width)
    else:
        grouped = t[:whole].reshape(blocks, ROWS_PER_BLOCK, width)
        head = grouped[:, :, : full * unit].reshape(blocks, ROWS_PER_BLOCK, full, unit)
        head = head.transpose(1, 2).reshape(blocks, -1)
        tails = grouped[:, :, full * unit :].reshape(blocks, -1)
        out[:whole] = torch.cat((head, tails), dim=1).reshape(whole, width)
    return out


def _gather_rows(t: torch.Tensor, rows: torch.Tensor, unit: int) -> torch.Tensor:
    """Rows `rows` (any shape) of an interleaved 2-D tensor, row-major: only the blocks they
    sit in are restored."""
    whole = t.shape[0] // ROWS_PER_BLOCK * ROWS_PER_BLOCK
    flat = rows.reshape(-1).to(torch.long)
    if whole == 0:
        return t[flat].reshape(*rows.shape, t.shape[1])
    inside = flat < whole
    block = torch.where(inside, flat, 0) // ROWS_PER_BLOCK
    width = t.shape[1]
    restored = interleave_rows(
        t[:whole].reshape(-1, ROWS_PER_BLOCK * width)[block].reshape(-1, width), unit, back=True
    ).reshape(-1, ROWS_PER_BLOCK, width)
    picked = restored[torch.arange(flat.numel()), torch.where(inside, flat, 0) % ROWS_PER_BLOCK]
    picked = torch.where(inside.unsqueeze(-1), picked, t[torch.where(inside, 0, flat)])
    return picked.reshape(*rows.shape, width)


@dataclass(frozen=True)
class PackedWeight:
    """A quantized projection weight; see the module docstring for the layouts."""

    layout: str  # one of LAYOUTS
    # uint8 [out, in // 2] (u4), [out, 3 * in // 4] (u6), [out, in] (u8), or the file's blocks
    qweight: torch.Tensor
    scales: torch.Tensor  # float16 [out, in // group_size]
    mins: (
        torch.Tensor | None
    )  # float16 [out, in // group_size], or None: symmetric around zero_point
    group_size: int
    zero_point: int = 0  # used only when mins is None
    source_type: str = ""  # the GGUF type it came from (Q4_K, ...), for reports
    interleaved: bool = False  # in the CPU kernel's interleaved layout (see the module docstring)
    # K-quants: (d, dmin) per 8 groups, float16 [out, in // 128]; scales and mins are then the
    # packed sub-scales and sub-mins (uint8 [out, groups] and [out, groups // 2], pack_k_params)
    super_scales: torch.Tensor | None = None
    # the whole weight dequantized (float32), kept from its first product where no C++ kernel
    # multiplies it (quant_linear.dequantized_once); never set where they do, nor copied by replace
    dense: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out_features, in_features = self.shape
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        params = torch.float16 if self.super_scales is None else torch.uint8
        if self.qweight.dtype != torch.uint8 or self.scales.dtype != params:
            raise ValueError(f"qweight must be uint8 and scales {params}")
        if self.super_scales is not None:
            groups = in_features // self.group_size
            if (
                self.mins is None
                or self.mins.dtype != torch.uint8
                or groups % GROUPS_PER_SUPER
                or tuple(self.mins.shape) != (out_features, groups // 2)
                or self.super_scales.dtype != torch.float16
                or tuple(self.super_scales.shape) != (out_features, groups // 4)
            ):
                raise ValueError(
                    f"K-quant scales need uint8 mins [{out_features}, {groups // 2}] and float16 "
                    f"super_scales [{out_features}, {groups // 4}]"
                )
        if in_features % self.group_size or (self.layout == "u4" and self.group_size != 32):
            raise ValueError(
                f"in_features {in_features} is not a multiple of group_size {self.group_size}"
            )
        if self.layout == "u6" and (
            self.group_size != 16 or in_features % U6_CHUNK or self.qweight.shape[1] % 3
        ):
            raise ValueError(
                f"u6 weights need group_size 16 and in_features a multiple of {U6_CHUNK}"
            )
        if self.layout in FILE_BLOCKS:
            group, zero = BLOCK_GROUPS[self.layout]
            block_bytes = FILE_BLOCKS[self.layout][1]
            if (
                self.group_size != group
                or self.qweight.shape[1] % block_bytes
                or tuple(self.scales.shape) != (out_features, 0)
                or self.mins is not None
                or self.super_scales is not None
                or self.zero_point != zero
                or self.interleaved
            ):
                raise ValueError(
                    f"{self.layout} weights are whole {block_bytes}-byte blocks with empty scales "
                    f"[{out_features}, 0], group_size {group}, zero point {zero}, no mins, "
                    "row-major"
                )
            return
        expected = (out_features, in_features // self.group_size)
        if tuple(self.scales.shape) != expected or (
            self.mins is not None
            and self.super_scales is None
            and tuple(self.mins.shape) != expected
        ):
            raise ValueError(f"scales/mins must have shape {expected}")

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.qweight.shape
        if self.layout in FILE_BLOCKS:
            weights, block_bytes, _ = FILE_BLOCKS[self.layout]
            return rows, cols // block_bytes * weights
        if self.layout == "u6":
            return rows, cols // 3 * 4
        return rows, cols * 2 if self.layout == "u4" else cols

    @property
    def bits(self) -> int:
        """The bits of the codes the kernels read: 4, 6 or 8 for the repacked layouts, the type's
        (quant_types.py) for the file's blocks."""
        if self.layout in BY_LAYOUT:
            return BY_LAYOUT[self.layout].bits
        return int(self.layout[1])

    @property
    def arrangement(self) -> int:
        """How the C++ kernels find the rows (quant/common.h's Arrangement): 0 row-major, 1
        interleaved, from 2 on the file's blocks of a type (FILE_BLOCKS, from quant_types.py)."""
        if self.layout in FILE_BLOCKS:
            return FILE_BLOCKS[self.layout][2]
        return int(self.interleaved)

    def repacked(self) -> PackedWeight:
        """A weight in the file's blocks repacked, row-major: q6k as u6 (the same codes and float16
        scales), q4k as u4 and q5k as u8 (the same codes, sub-scales, sub-mins and (d, dmin)),
        q8_0 as u8 (code + 128, the same scales), q4_0 and q4_1 as u4 (the same codes, scales
        and mins), q5_0 and q5_1 as u8 (codes 0-31, the same scales and mins), mxfp4 as u8
        (codes 0-24 around 12, float16 scales 2^(e - 128)); any other as it is."""
        if self.layout == "q6k":
            qweight, scales = q6k_blocks_to_u6(self.qweight)
            return replace(self, layout="u6", qweight=qweight, scales=scales)
        if self.layout == "q8_0":
            qweight, scales = q8_0_blocks_to_u8(self.qweight)
            return replace(self, layout="u8", qweight=qweight, scales=scales)
        if self.layout in ("q4_0", "q4_1"):
            qweight, scales, mins = q4_blocks_to_u4(self.qweight, self.layout == "q4_1")
            return replace(self, layout="u4", qweight=qweight, scales=scales, mins=mins)
        if self.layout in ("q5_0", "q5_1"):
            qweight, scales, mins = q5_blocks_to_u8(self.qweight, self.layout == "q5_1")
            return replace(self, layout="u8", qweight=qweight, scales=scales, mins=mins)
        if self.layout == "mxfp4":
            qweight, scales = mxfp4_blocks_to_u8(self.qweight)
            return replace(self, layout="u8", qweight=qweight, scales=scales)
        if self.layout in ("q4k", "q5k"):
            qweight, scales, mins, supers = k_blocks_repacked(self.qweight, self.layout == "q5k")
            return replace(
                self,
                layout="u4" if self.layout == "q4k" else "u8",
                qweight=qweight,
                scales=scales,
                mins=mins,
                super_scales=supers,
            )
        return self

    def _blocks_repacked(self, rows: torch.Tensor | slice | None) -> tuple[PackedWeight, tuple]:
        """Rows `rows` (any shape) of a weight in the file's blocks, repacked as a 2-D weight, and
        the rows' shape (what its per-row results take back)."""
        picked = self.qweight if rows is None else self.qweight[rows]
        flat = picked.reshape(-1, picked.shape[-1])
        empty = torch.empty((flat.shape[0], 0), dtype=self.scales.dtype)
        return replace(self, qweight=flat, scales=empty).repacked(), tuple(picked.shape[:-1])

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        extra = [t.nbytes for t in (self.mins, self.super_scales) if t is not None]
        return self.qweight.nbytes + self.scales.nbytes + sum(extra)

    def to(self, device: torch.device | str) -> PackedWeight:
        """On the CPU as it is; elsewhere (the GPU's kernels) row-major with float16 scales, and
        u6 codes a byte each."""
        weight = self
        if torch.device(device).type != "cpu":
            weight = self.with_float16_scales().with_byte_codes()
        return replace(
            weight,
            qweight=weight.qweight.to(device),
            scales=weight.scales.to(device),
            mins=None if weight.mins is None else weight.mins.to(device),
            super_scales=None if weight.super_scales is None else weight.super_scales.to(device),
        )

    def with_float16_scales(self) -> PackedWeight:
        """The weight row-major with one float16 scale and min per group (K-quant products
        rounded), the form the GPU's kernels read (a weight in the file's blocks repacked first);
        without super_scales, only row-major."""
        weight = self.repacked().row_major()
        if weight.super_scales is None:
            return weight
        scales, mins = weight.group_params()
        assert mins is not None
        return replace(
            weight, scales=scales.to(torch.float16), mins=mins.to(torch.float16), super_scales=None
        )

    def with_byte_codes(self) -> PackedWeight:
        """The weight with u6 codes stored a byte each (the u8 layout, row-major); itself when it
        is not u6 (q6k: as u6)."""
        if self.layout not in ("u6", "q6k"):
            return self
        weight = self.repacked().row_major()
        return replace(weight, layout="u8", qweight=weight.codes().to(torch.uint8))

    def group_params(
        self, rows: torch.Tensor | slice | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each group's scale and min (None for symmetric types) as float32, row-major."""
        if self.layout in FILE_BLOCKS:
            weight, lead = self._blocks_repacked(rows)
            scales, mins = weight.group_params()
            return scales.reshape(*lead, -1), None if mins is None else mins.reshape(*lead, -1)
        if self.super_scales is None or self.mins is None:
            scales = self._rows(self.scales, rows, GROUP_UNIT).to(torch.float32)
            mins = None if self.mins is None else self._rows(self.mins, rows, GROUP_UNIT)
            return scales, None if mins is None else mins.to(torch.float32)
        sub_scales, sub_mins = unpack_k_params(
            self._rows(self.scales, rows, GROUP_UNIT), self._rows(self.mins, rows, self._mins_unit)
        )
        pairs = self._rows(self.super_scales, rows, SUPER_UNIT).to(torch.float32)
        pairs = pairs.reshape(*pairs.shape[:-1], -1, 2).repeat_interleave(GROUPS_PER_SUPER, dim=-2)
        return sub_scales.to(torch.float32) * pairs[..., 0], -(
            sub_mins.to(torch.float32) * pairs[..., 1]
        )

    @property
    def _mins_unit(self) -> int:
        """The interleaving unit of ``mins``: K-quant top bits are half as wide as the groups."""
        return GROUP_UNIT // 2 if self.super_scales is not None else GROUP_UNIT

    def row_major(self) -> PackedWeight:
        """The weight with its rows in plain order (itself when it is not interleaved)."""
        if not self.interleaved:
            return self
        supers = self.super_scales
        return replace(
            self,
            qweight=interleave_rows(self.qweight, CODE_UNIT, back=True),
            scales=interleave_rows(self.scales, GROUP_UNIT, back=True),
            mins=None
            if self.mins is None
            else interleave_rows(self.mins, self._mins_unit, back=True),
            super_scales=None if supers is None else interleave_rows(supers, SUPER_UNIT, back=True),
            interleaved=False,
        )

    def _rows(self, t: torch.Tensor, rows: torch.Tensor | slice | None, unit: int) -> torch.Tensor:
        """Rows of one of the weight's tensors (all of them when None), row-major."""
        if not self.interleaved:
            return t if rows is None else t[rows]
        if rows is None:
            return interleave_rows(t, unit, back=True)
        if isinstance(rows, slice):
            rows = torch.arange(t.shape[0])[rows]
        return _gather_rows(t, rows, unit)

    def select_rows(self, index: torch.Tensor) -> PackedWeight:
        """The weight with its output rows reordered/selected by `index` (row-major)."""
        weight = self.row_major()
        supers = weight.super_scales
        return replace(
            weight,
            qweight=weight.qweight[index].contiguous(),
            scales=weight.scales[index].contiguous(),
            mins=None if weight.mins is None else weight.mins[index].contiguous(),
            super_scales=None if supers is None else supers[index].contiguous(),
        )

    def offsets(self) -> torch.Tensor:
        """The additive term of each group (mins, or -zero_point * scales for symmetric types),
        float16."""
        if self.super_scales is not None or self.layout in FILE_BLOCKS:
            return self.with_float16_scales().offsets()
        return (
            self.mins
            if self.mins is not None
            else (self.scales.to(torch.float32) * -self.zero_point).half()
        )

    def codes(self, rows: torch.Tensor | slice | None = None) -> torch.Tensor:
        """The integer codes as int32 [out, in] (or the selected rows), in natural order."""
        if self.layout in FILE_BLOCKS:
            weight, lead = self._blocks_repacked(rows)
            return weight.codes().reshape(*lead, -1)
        q = self._rows(self.qweight, rows, CODE_UNIT)
        if self.layout == "u8":
            return q.to(torch.int32)
        if self.layout == "u6":
            return unpack_u6(q)
        groups = q.reshape(*q.shape[:-1], -1, 16).to(torch.int32)
        return torch.cat((groups & 0x0F, groups >> 4), dim=-1).reshape(*q.shape[:-1], -1)

    def dequantize(
        self, rows: torch.Tensor | slice | None = None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The weight (or the selected rows) as a dense [out, in] tensor: the reference for every
        kernel."""
        if self.layout in FILE_BLOCKS:  # repacked once, for its codes and its scales
            weight, lead = self._blocks_repacked(rows)
            return weight.dequantize(dtype=dtype).reshape(*lead, -1)
        codes = self.codes(rows).to(torch.float32)
        scales, mins = self.group_params(rows)
        codes = codes.reshape(*codes.shape[:-1], scales.shape[-1], self.group_size)
        if mins is None:
            values = (codes - self.zero_point) * scales.unsqueeze(-1)
        else:
            values = codes * scales.unsqueeze(-1) + mins.unsqueeze(-1)
        return values.reshape(*values.shape[:-2], -1).to(dtype)


def pack_k_params(
    sub_scales: torch.Tensor, sub_mins: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-quant 6-bit sub-scales and sub-mins, integers [..., groups] (groups even), as PackedWeight
    keeps them: (scales, mins) = (low four bits of both, uint8 [..., groups]; top two bits of both,
    two groups a byte, uint8 [..., groups // 2]). See the module docstring."""
    s, m = sub_scales.to(torch.uint8), sub_mins.to(torch.uint8)
    top = ((s >> 4) | ((m >> 4) << 2)).reshape(*s.shape[:-1], -1, 2)
    return (s & 0x0F) | ((m & 0x0F) << 4), top[..., 0] | (top[..., 1] << 4)


def unpack_k_params(scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sub-scales and sub-mins, uint8 [..., groups], of pack_k_params' (scales, mins)."""
    top = torch.stack((mins & 0x0F, mins >> 4), dim=-1).flatten(-2)
    return (scales & 0x0F) | ((top & 3) << 4), (scales >> 4) | ((top >> 2) << 4)


def pack_u4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in // 2] from int codes in [0, 15] of shape [out, in] (in a multiple of 32)."""
    groups = codes.to(torch.uint8).reshape(codes.shape[0], -1, 2, 16)
    return (groups[:, :, 0] | (groups[:, :, 1] << 4)).reshape(codes.shape[0], -1)


def _u6_vectors(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two 64-value vectors the kernel forms from each 128-weight chunk of [..., in]: weights
    i and i + 8 of every group of 16 (the low and high nibbles of the chunk's 64 bytes)."""
    g = t.reshape(*t.shape[:-1], -1, 8, 2, 8)
    return g[..., 0, :].flatten(-2), g[..., 1, :].flatten(-2)


def pack_u6(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in // 2 + in // 4] from int codes in [0, 63] of shape [out, in] (in a multiple
    of 128). The first plane holds the low nibbles (byte 8g + i of a group's 8: weight i low,
    weight i + 8 high). The second holds 32 bytes per 128-weight chunk: byte j has the top two bits
    of the chunk's low-nibble vector at positions j and 32 + j in bits 0-1 and 2-3, and of its
    high-nibble vector at j and 32 + j in bits 4-5 and 6-7 (how the kernel spreads them)."""
    c = codes.to(torch.uint8)
    out = c.shape[0]
    groups = c.reshape(out, -1, 2, 8)
    nibbles = ((groups[:, :, 0] & 0x0F) | ((groups[:, :, 1] & 0x0F) << 4)).reshape(out, -1)
    low, high = _u6_vectors(c >> 4)  # [out, chunks, 64] each
    top = low[..., :32] | (low[..., 32:] << 2) | (high[..., :32] << 4) | (high[..., 32:] << 6)
    return torch.cat((nibbles, top.reshape(out, -1)), dim=1)


def unpack_u6(qweight: torch.Tensor) -> torch.Tensor:
    """The int32 codes [..., in] of u6 qweight rows [..., in // 2 + in // 4] (pack_u6's inverse)."""
    q = qweight.to(torch.int32)
    cols = q.shape[-1] // 3 * 4
    nibbles, top = q[..., : cols // 2], q[..., cols // 2 :]
    pairs = nibbles.reshape(*q.shape[:-1], -1, 8)
    low4 = torch.stack((pairs & 0x0F, pairs >> 4), dim=-2).flatten(-3)
    top = top.reshape(*q.shape[:-1], -1, 32)
    low = torch.cat((top & 3, (top >> 2) & 3), dim=-1)
    high = torch.cat(((top >> 4) & 3, top >> 6), dim=-1)
    split = (*low.shape[:-1], 8, 8)  # [..., chunks, group, position]
    top2 = torch.stack((low.reshape(split), high.reshape(split)), dim=-2)
    return low4 | (top2.reshape(*q.shape[:-1], cols) << 4)


def q6k_blocks_to_u6(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks, uint8 [..., in // 256 * 210], as u6 (qweight uint8 [..., in // 2 + in // 4],
    scales float16 [..., in // 16]: each group's d * sub-scale rounded to float16). A block is ql
    (128 bytes: per half of 128 weights, weight j's low four bits in byte j % 64 of the half's 64,
    low nibble for j < 64), qh (64 bytes: per half, bits 2q, 2q + 1 of byte j % 32 are the top bits
    of weight 32q + j % 32), 16 int8 sub-scales and the float16 d."""
    lead = blocks.shape[:-1]
    b = blocks.reshape(-1, blocks.shape[-1] // Q6K_BYTES, Q6K_BYTES)
    rows = b.shape[0]
    lo = b[..., 0:128].reshape(rows, -1, 2, 1, 64)
    low = torch.cat((lo & 0x0F, lo >> 4), dim=3)  # [rows, blocks, half, 2, 64]: 128 weights a half
    qh = b[..., 128:192].reshape(rows, -1, 2, 1, 32)
    high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 1, 4, 1)) & 3
    codes = low.reshape(rows, -1) | (high.reshape(rows, -1) << 4)
    sub = b[..., 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = b[..., 208:210].contiguous().view(torch.float16).to(torch.float32)
    scales = (d * sub).reshape(rows, -1).to(torch.float16)
    return pack_u6(codes).reshape(*lead, -1), scales.reshape(*lead, -1)


def k_sub_params(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit sub-scales and sub-mins (uint8 [..., 8] each) of Q4_K/Q5_K blocks from their
    12 packed bytes [..., 12]: groups 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins),
    groups 4-7 in the nibbles of bytes 8-11 with their top bits in those of bytes 0-7."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mins = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return scales, mins


def k_block_params(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K blocks uint8 [rows, blocks, bytes] -> their sub-scales and sub-mins as
    PackedWeight keeps them (pack_k_params: uint8 [rows, groups] and [rows, groups // 2]), and
    (d, dmin) per block, float16 [rows, 2 * blocks]."""
    rows = blocks.shape[0]
    sub_scales, sub_mins = k_sub_params(blocks[..., 4:16])
    supers = blocks[..., 0:4].contiguous().view(torch.float16).reshape(rows, -1)
    scales, mins = pack_k_params(sub_scales.reshape(rows, -1), sub_mins.reshape(rows, -1))
    return scales, mins, supers


def k_low_codes(qs: torch.Tensor) -> torch.Tensor:
    """The low 4 bits [rows, in] of Q4_K/Q5_K codes [rows, blocks, 128]: each 32 bytes hold group
    2i in their low nibbles and group 2i + 1 in their high ones."""
    rows = qs.shape[0]
    grouped = qs.reshape(rows, -1, 4, 32)
    return torch.stack((grouped & 0x0F, grouped >> 4), dim=3).reshape(rows, -1)


def k_blocks_repacked(
    blocks: torch.Tensor, five: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks, uint8 [rows, in // 256 * 144], as a u4 K-quant weight's (qweight, scales,
    mins, super_scales), or with `five` Q5_K blocks [rows, in // 256 * 176] as a u8 one's; nothing
    rounded. A block is d and dmin (float16), 12 bytes of 6-bit sub-scales and sub-mins
    (k_sub_params), for Q5_K 32 bytes whose bit g of byte j is the fifth bit of weight j of group
    g, and 128 bytes of low bits (k_low_codes)."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, Q5K_BYTES if five else Q4K_BYTES)
    scales, mins, supers = k_block_params(b)
    if not five:
        return pack_u4(k_low_codes(b[..., 16:])), scales, mins, supers
    qh = b[..., 16:48].reshape(rows, -1, 1, 32)
    fifth = (qh >> torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8, 1)) & 1
    return k_low_codes(b[..., 48:]) | (fifth.reshape(rows, -1) << 4), scales, mins, supers


def _group_block_params(
    b: torch.Tensor, with_mins: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float16 d (and with `with_mins`, m) that start each block of b, uint8 [rows, blocks,
    block bytes], as [rows, blocks] tensors: Q8_0, Q4_0 and Q5_0 (d), Q4_1 and Q5_1 (d, m)."""
    rows = b.shape[0]
    scales = b[..., 0:2].contiguous().view(torch.float16).reshape(rows, -1)
    mins = b[..., 2:4].contiguous().view(torch.float16).reshape(rows, -1) if with_mins else None
    return scales, mins


def q8_0_blocks_to_u8(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 blocks, uint8 [rows, in // 32 * 34] (float16 d, then 32 int8 codes), as a u8 weight's
    qweight (each code + 128 as an unsigned byte, zero point 128) and scales (float16
    [rows, in // 32])."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, Q8_0_BYTES)
    codes = (b[..., 2:] ^ 0x80).reshape(rows, -1)
    return codes, _group_block_params(b, False)[0]


def q4_blocks_to_u4(
    blocks: torch.Tensor, with_mins: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q4_0 blocks, uint8 [rows, in // 32 * 18] (float16 d, then 16 bytes of codes: byte j holds
    weight j in its low nibble and j + 16 in its high one, as u4 does), or with `with_mins` Q4_1
    blocks [rows, in // 32 * 20] (d and m, then the codes), as a u4 weight's qweight, scales and
    mins (float16 [rows, in // 32]; None for Q4_0, whose zero point is 8)."""
    rows = blocks.shape[0]
    first = 4 if with_mins else 2
    b = blocks.reshape(rows, -1, first + 16)
    codes = b[..., first:].reshape(rows, -1)
    scales, mins = _group_block_params(b, with_mins)
    return codes, scales, mins


def q5_blocks_to_u8(
    blocks: torch.Tensor, with_mins: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q5_0 blocks, uint8 [rows, in // 32 * 22] (float16 d, 4 bytes of fifth bits: bit j of their
    little-endian word for weight j, then 16 bytes of low nibbles as Q4_0's), or with `with_mins`
    Q5_1 blocks [rows, in // 32 * 24] (d and m first), as a u8 weight's qweight (codes 0-31), scales
    and mins (float16 [rows, in // 32]; None for Q5_0, whose zero point is 16)."""
    rows = blocks.shape[0]
    high = 4 if with_mins else 2
    b = blocks.reshape(rows, -1, high + 20)
    qs = b[..., high + 4 :]
    low = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # weights 0-15, then 16-31
    word = b[..., high : high + 4].contiguous().view(torch.int32).to(torch.int64)
    fifth = ((word >> torch.arange(32, dtype=torch.int64)) & 1).to(torch.uint8)
    codes = (low | (fifth << 4)).reshape(rows, -1)
    scales, mins = _group_block_params(b, with_mins)
    return codes, scales, mins


# MXFP4's 4-bit E2M1 codes as their values doubled (sign bit 3), and the zero point of the codes the
# kernels form from them (value + 12: 0-24)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
MXFP4_ZERO = 12


def mxfp4_scales(exponents: torch.Tensor) -> torch.Tensor:
    """The float32 scales 2^(e - 127) / 2 = 2^(e - 128) of E8M0 exponent bytes (uint8, any shape),
    as gguf-py computes them (e 0 and 1: float32 subnormals; 255 reads as 2^127)."""
    e = exponents.to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def mxfp4_blocks_to_u8(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 blocks, uint8 [rows, in // 32 * 17] (an E8M0 exponent byte e, then 16 bytes whose byte
    j holds weight j's E2M1 code in its low nibble and weight j + 16's in its high one), as a u8
    weight's qweight (each code's doubled value + 12: 0-24, zero point 12) and scales (2^(e - 128)
    rounded to float16 [rows, in // 32]: exact for e in 104-143)."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, BY_LAYOUT["mxfp4"].block_bytes)
    qs = b[..., 1:].to(torch.int64)
    nibbles = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # weights 0-15, then 16-31
    table = torch.tensor(MXFP4_VALUES, dtype=torch.int64) + MXFP4_ZERO
    codes = table[nibbles].to(torch.uint8).reshape(rows, -1)
    return codes, mxfp4_scales(b[..., 0]).to(torch.float16).reshape(rows, -1)


def quantize_weight(weight: torch.Tensor, bits: int, group_size: int = 32) -> PackedWeight:
    """Weight-only group-wise quantization of a dense [out, in] weight (asymmetric, round to
    nearest), for checkpoints without quantized weights (`--quantization int4|int8`)."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(
            f"in_features {in_features} is not a multiple of the group size {group_size}"
        )
    groups = weight.detach().to(torch.float32).reshape(out_features, -1, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    levels = (1 << bits) - 1
    scales = ((high - low) / levels).to(torch.float16)
    safe = torch.where(scales == 0, 1.0, scales.to(torch.float32))
    mins = low.to(torch.float16)
    codes = (
        ((groups - mins.to(torch.float32).unsqueeze(-1)) / safe.unsqueeze(-1))
        .round_()
        .clamp_(0, levels)
    )
    codes = codes.reshape(out_features, in_features).to(torch.uint8)
    if bits == 4:
        return PackedWeight("u4", pack_u4(codes), scales, mins, group_size, source_type="int4")
    if bits == 8:
        return PackedWeight("u8", codes, scales, mins, group_size, source_type="int8")
    raise ValueError(f"bits must be 4 or 8, got {bits}")
