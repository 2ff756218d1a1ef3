// GGUF (ggml) quantized blocks -> PackedWeight arrays (localchat/engine/loading/gguf_repack.py documents the
// mapping; the torch version there is the reference this must equal bit for bit). One pass over the
// memory-mapped file per tensor, rows shared between threads: an 8B Q4_K_M file repacks in about a second
// where the torch ops took most of a minute.
#pragma once
#include "torch_api.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/common.h"
#include "quant/generic/blocks.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

// Ask for transparent huge pages for a fresh (untouched) tensor, where Linux allows them (THP in `madvise`
// mode): an 8B model's 4.5 GB of packed weights is then written with ~2,300 page faults instead of ~1.1 million,
// and each decode streams it through far fewer TLB entries.
void advise_huge_pages(const torch::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t start = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (begin + t.numel() * t.element_size()) & ~(kHuge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

// How a type repacks (quant/types.def): its blocks, its group, and the PackedWeight layout it becomes.
struct BlockFormat {
  int64_t weights, bytes, group_size;
  int bits;  // the PackedWeight layout: 4 (u4), 6 (u6) or 8 (u8)
  bool has_mins;
  bool k_scales = false;  // Q4_K/Q5_K: 6-bit sub-scales and mins kept in 12 bits a group, with (d, dmin) per 256
};

BlockFormat block_format(Arrangement type) {
  TORCH_CHECK(type != kRowMajor, "unsupported GGUF block type");
  const QuantTraits& t = quant_type(type);
  const int bits = t.repacked[1] - '0';  // "u4", "u6", "u8"
  return {t.block_weights, t.block_bytes, t.group_size, bits, t.mins, t.k_scales};
}

inline at::Half load_half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return at::Half(bits, at::Half::from_bits());
}

inline float load_float_half(const uint8_t* p) { return static_cast<float>(load_half(p)); }

// The 6-bit scale and min of sub-block s of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4).
inline void k_scale_min(const uint8_t* q, int s, int& scale, int& min) {
  if (s < 4) {
    scale = q[s] & 63;
    min = q[s + 4] & 63;
  } else {
    scale = (q[s + 4] & 0x0F) | ((q[s - 4] >> 6) << 4);
    min = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

// Eight bytes at a time (SWAR): every nibble and bit operation below keeps within each byte of a 64-bit word
// (masks after each shift), so it is the same on every byte order and several times faster than a byte loop.
inline uint64_t load_u64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

inline void store_u64(uint8_t* p, uint64_t w) { std::memcpy(p, &w, 8); }

constexpr uint64_t kEveryByte = 0x0101010101010101ULL;
constexpr uint64_t kLowNibbles = 0x0F * kEveryByte;
constexpr uint64_t kHighNibbles = 0xF0 * kEveryByte;

// The outputs of one row: codes (u6: its first plane, then `top`, its second), and float16 scales/mins per group,
// or (K-quants) the sub-scales and sub-mins packed as PackedWeight keeps them (sub_scales: the low four bits of
// both, a byte a group; sub_mins: their top two bits, two groups a byte) with a float16 (d, dmin) pair per
// super-block.
struct RowOut {
  uint8_t* codes;
  uint8_t* top;
  at::Half* scales;
  at::Half* mins;
  uint8_t* sub_scales;
  uint8_t* sub_mins;
  at::Half* supers;
};

// 128 codes (0..63) as a u6 chunk: 64 bytes of low nibbles (weights i, i + 8 of each group of 16) and 32 bytes of
// top bits (packed_weight.py's pack_u6).
void pack_u6_chunk(const uint8_t* codes, uint8_t* nibbles, uint8_t* top) {
  for (int g = 0; g < 8; ++g) {
    const uint64_t low = load_u64(codes + 16 * g), high = load_u64(codes + 16 * g + 8);
    store_u64(nibbles + 8 * g, (low & kLowNibbles) | ((high & kLowNibbles) << 4));
  }
  // top byte 8k + m holds the top bits of codes 16k + m (bits 0-1), 64 + 16k + m (2-3), 16k + 8 + m (4-5) and
  // 64 + 16k + 8 + m (6-7): the low (0) and high (1) vectors at positions 8k + m and 32 + 8k + m
  auto top2 = [&](int offset) { return (load_u64(codes + offset) >> 4) & (3 * kEveryByte); };
  for (int k = 0; k < 4; ++k) {
    store_u64(top + 8 * k, top2(16 * k) | (top2(64 + 16 * k) << 2) | (top2(16 * k + 8) << 4) |
                               (top2(64 + 16 * k + 8) << 6));
  }
}

// One block of row `in` into the row's outputs at block index b.
void repack_block(Arrangement type, const uint8_t* in, int64_t b, const RowOut& o) {
  uint8_t* codes = o.codes;
  at::Half* scales = o.scales;
  at::Half* mins = o.mins;
  switch (type) {
    case kBlocksQ4_0:
      scales[b] = load_half(in);
      std::memcpy(codes + b * 16, in + 2, 16);  // ggml's nibble order is the u4 layout's
      break;
    case kBlocksQ4_1:
      scales[b] = load_half(in);
      mins[b] = load_half(in + 2);
      std::memcpy(codes + b * 16, in + 4, 16);
      break;
    case kBlocksQ8_0: {
      scales[b] = load_half(in);
      uint8_t* out = codes + b * 32;
      for (int i = 0; i < 32; ++i) out[i] = in[2 + i] ^ 0x80;  // int8 q + 128
      break;
    }
    case kBlocksQ5_0:
    case kBlocksQ5_1: {
      const bool asym = type == kBlocksQ5_1;
      scales[b] = load_half(in);
      if (asym) mins[b] = load_half(in + 2);
      generic::q5_block_codes(in, asym, codes + b * 32);  // (quant/generic/blocks.h)
      break;
    }
    case kBlocksMXFP4:  // codes 0-24 (zero point 12) and the scale 2^(e - 128), rounded to float16 as torch does
      scales[b] = at::Half(generic::mxfp4_scale(in[0]));
      generic::mxfp4_block_codes(in, codes + b * 32);
      break;
    case kBlocksQ4_K:
    case kBlocksQ5_K: {
      o.supers[2 * b] = load_half(in);
      o.supers[2 * b + 1] = load_half(in + 2);
      const bool five = type == kBlocksQ5_K;
      const uint8_t* qh = in + 16;
      const uint8_t* qs = in + (five ? 48 : 16);
      for (int s = 0; s < 8; s += 2) {
        int top = 0;
        for (int i = 0; i < 2; ++i) {
          int sc, mn;
          k_scale_min(in + 4, s + i, sc, mn);
          o.sub_scales[b * 8 + s + i] = static_cast<uint8_t>((sc & 0x0F) | ((mn & 0x0F) << 4));
          top |= ((sc >> 4) | ((mn >> 4) << 2)) << (4 * i);
        }
        o.sub_mins[b * 4 + s / 2] = static_cast<uint8_t>(top);
      }
      // sub-blocks 2p and 2p + 1 share 32 bytes of qs: the even one's codes are their low nibbles, the odd one's
      // their high nibbles (Q5_K: plus bit s of qh as bit 4)
      for (int p = 0; p < 4; ++p) {
        const uint8_t* q = qs + 32 * p;
        if (five) {
          uint8_t* even = codes + (b * 8 + 2 * p) * 32;
          for (int i = 0; i < 32; i += 8) {
            const uint64_t low = load_u64(q + i), high = load_u64(qh + i);
            store_u64(even + i, (low & kLowNibbles) | (((high >> (2 * p)) & kEveryByte) << 4));
            store_u64(even + 32 + i, ((low >> 4) & kLowNibbles) | (((high >> (2 * p + 1)) & kEveryByte) << 4));
          }
        } else {
          uint8_t* even = codes + (b * 8 + 2 * p) * 16;
          for (int i = 0; i < 16; i += 8) {
            const uint64_t first = load_u64(q + i), second = load_u64(q + 16 + i);
            store_u64(even + i, (first & kLowNibbles) | ((second & kLowNibbles) << 4));
            store_u64(even + 16 + i, ((first >> 4) & kLowNibbles) | (second & kHighNibbles));
          }
        }
      }
      break;
    }
    case kBlocksQ6_K: {
      const uint8_t* ql = in;
      const uint8_t* qh = in + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(in + 192);
      const float d = load_float_half(in + 208);
      for (int g = 0; g < 16; ++g) scales[b * 16 + g] = at::Half(d * static_cast<float>(sc[g]));
      for (int half = 0; half < 2; ++half) {
        uint8_t out[128];
        const uint8_t* l = ql + half * 64;
        const uint8_t* h = qh + half * 32;
        // weight 32q + i: the low 4 bits from ql (q = 0, 1: low nibbles; 2, 3: high nibbles of the same
        // bytes), the top 2 from bits 2q, 2q + 1 of qh[i]
        for (int q = 0; q < 4; ++q) {
          const uint8_t* low = l + (q & 1) * 32;
          const int low_shift = (q >> 1) * 4, high_shift = 2 * q;
          for (int i = 0; i < 32; i += 8) {
            store_u64(out + 32 * q + i, ((load_u64(low + i) >> low_shift) & kLowNibbles) |
                                            (((load_u64(h + i) >> high_shift) & (3 * kEveryByte)) << 4));
          }
        }
        const int64_t chunk = 2 * b + half;
        pack_u6_chunk(out, codes + chunk * 64, o.top + chunk * 32);
      }
      break;
    }
    default: TORCH_CHECK(false, "unsupported GGUF block type ", type);
  }
}

}  // namespace

// raw: uint8 [rows, row_bytes] (the tensor's blocks); order: output row r takes input row order[r] (or
// None). Returns [qweight, scales], [qweight, scales, mins], or for K-quants [qweight, sub-scales, sub-mins,
// supers] (the packed sub-scales and sub-mins: uint8 [rows, groups] and [rows, groups / 2]; float16
// [rows, 2 * blocks]), as PackedWeight holds them; with `interleave`, in the
// kernel's interleaved layout (quant_linear.h), each block of rows rearranged while it is still in cache; with
// `huge_pages`, qweight is asked for as transparent huge pages before it is written.
std::vector<torch::Tensor> repack_gguf(const torch::Tensor& raw, int64_t type, const c10::optional<torch::Tensor>& order,
                                       bool interleave, bool huge_pages) {
  const Arrangement kind = arrangement_of_ggml(type);
  TORCH_CHECK(kind != kRowMajor, "unsupported GGUF block type ", type);
  const BlockFormat f = block_format(kind);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == torch::kUInt8 && raw.stride(1) == 1, "raw must be uint8 [rows, bytes]");
  const int64_t rows = raw.size(0), row_bytes = raw.size(1);
  TORCH_CHECK(row_bytes % f.bytes == 0, "a row is not a whole number of blocks");
  const int64_t blocks = row_bytes / f.bytes, cols = blocks * f.weights, groups = cols / f.group_size;
  const bool reorder = order.has_value() && order->defined();
  torch::Tensor index;
  if (reorder) {
    index = order->to(torch::kLong).contiguous();
    TORCH_CHECK(index.numel() == rows, "order must have one entry per row");
  }
  auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
  auto f16 = torch::TensorOptions().dtype(torch::kHalf);
  torch::Tensor qweight = torch::empty({rows, f.bits == 4 ? cols / 2 : f.bits == 6 ? cols / 2 + cols / 4 : cols}, u8);
  torch::Tensor scales = torch::empty({rows, groups}, f.k_scales ? u8 : f16);
  torch::Tensor mins = f.has_mins ? torch::empty({rows, f.k_scales ? groups / 2 : groups}, f.k_scales ? u8 : f16)
                                  : torch::Tensor();
  torch::Tensor supers = f.k_scales ? torch::empty({rows, 2 * blocks}, f16) : torch::Tensor();
  if (huge_pages) advise_huge_pages(qweight);
  const uint8_t* src = raw.data_ptr<uint8_t>();
  const int64_t src_stride = raw.stride(0);
  const int64_t* idx = reorder ? index.data_ptr<int64_t>() : nullptr;
  uint8_t* qp = qweight.data_ptr<uint8_t>();
  uint8_t* sp = static_cast<uint8_t*>(scales.data_ptr());
  uint8_t* mp = f.has_mins ? static_cast<uint8_t*>(mins.data_ptr()) : nullptr;
  at::Half* up = f.k_scales ? supers.data_ptr<at::Half>() : nullptr;
  const int64_t q_row = qweight.size(1), param_bytes = f.k_scales ? 1 : 2;
  // bytes of a row's scales, and of its mins (K-quant mins: two groups a byte)
  const int64_t param_row = groups * param_bytes, mins_row = f.k_scales ? groups / 2 : param_row;
  const int64_t super_row_halves = 2 * blocks;
  const int64_t row_blocks = (rows + kRowsPerPass - 1) / kRowsPerPass;
  at::parallel_for(0, row_blocks, 4, [&](int64_t block_begin, int64_t block_end) {
    std::vector<uint8_t> scratch(kRowsPerPass * std::max(q_row, param_row) + 64);
    const int64_t begin = block_begin * kRowsPerPass, end = std::min(rows, block_end * kRowsPerPass);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t from = idx ? idx[r] : r;
      TORCH_CHECK(from >= 0 && from < rows, "order has an out-of-range row");
      const uint8_t* in = src + from * src_stride;
      uint8_t* row_scales = sp + r * groups * param_bytes;
      uint8_t* row_mins = mp ? mp + r * mins_row : nullptr;
      const RowOut out{qp + r * q_row,
                       qp + r * q_row + cols / 2,
                       reinterpret_cast<at::Half*>(row_scales),
                       reinterpret_cast<at::Half*>(row_mins),
                       row_scales,
                       row_mins,
                       up ? up + r * 2 * blocks : nullptr};
      for (int64_t b = 0; b < blocks; ++b) repack_block(kind, in + b * f.bytes, b, out);
      if (!interleave || (r + 1) % kRowsPerPass || r + 1 > rows / kRowsPerPass * kRowsPerPass) continue;
      const int64_t first = r + 1 - kRowsPerPass;  // a whole block of rows is written: interleave it
      interleave_block(qp + first * q_row, q_row, kChunkBytes, false, scratch.data());
      for (uint8_t* params : {sp, mp}) {
        if (params == nullptr) continue;
        if (f.k_scales) {  // K-quant mins: half as wide, half as many bytes at a time
          const int64_t width = params == mp ? mins_row : param_row;
          const int64_t unit = params == mp ? kGroupBlock / 2 : kGroupBlock;
          interleave_block(params + first * width, width, unit, false, scratch.data());
        } else {
          interleave_block(reinterpret_cast<at::Half*>(params) + first * groups, groups, kGroupBlock, false,
                           reinterpret_cast<at::Half*>(scratch.data()));
        }
      }
      if (up) {
        interleave_block(up + first * super_row_halves, super_row_halves, kSupersPerBlock, false,
                         reinterpret_cast<at::Half*>(scratch.data()));
      }
    }
  });
  if (f.k_scales) return {qweight, scales, mins, supers};
  if (f.has_mins) return {qweight, scales, mins};
  return {qweight, scales};
}
