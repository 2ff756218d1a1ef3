// The quantization types' own functions (types.def), in plain C++: how a block's codes, scales and mins are laid
// out, turned into a repacked layout's row (unpack_row_<TYPE>: codes row-major as u4, u6 or u8 bytes, each group's
// scale and min as floats). The generic kernels (kernels.h) and the row restore (quant/restore.h) read every type
// through these; an ISA's kernels read the blocks in registers and must form the same scales (docs/kernels.md).
// Every x86 kernel of a block type runs its repacked layout's operations, so its products equal that layout's
// (the 5-bit types' up to float rounding: the same integer products, summed in other lanes).
//
// Q6_K weights read in the GGUF file's own blocks (arrangement kBlocksQ6_K, PackedWeight layout "q6k"): the weight
// stays in the file's memory map, so loading neither copies nor repacks it, and a decode reads 210 bytes per 256
// weights instead of u6's 224.
//
// A block holds 256 weights: ql (128 bytes of low nibbles), qh (64 bytes of top bits), 16 int8 sub-scales (one per
// group of 16) and the float16 super-scale d. Each half (128 weights) of ql and qh is stored as a u6 chunk's two
// planes are (six_bit_codes), except that a u6 chunk's low nibbles hold weights i and i + 8 of each group of 16 in
// one byte, so that every dot-product lane meets one group, where ql holds weights j and j + 64. One 64-bit
// permutation per vector turns the block's codes into u6's order, and from there the kernels run u6's operations:
// the same activation layout, and each group's scale d * sub-scale rounded to float16 as the repack rounds it for
// u6. A product of the two layouts is the same bit for bit.
//
// Q4_K and Q5_K weights read in the GGUF file's own blocks (arrangements kBlocksQ4_K and kBlocksQ5_K, PackedWeight
// layouts "q4k" and "q5k"): the weight stays in the file's memory map, so loading neither copies nor repacks it.
//
// A Q4_K block holds 256 weights in 8 groups of 32: float16 d and dmin, 12 bytes of 6-bit sub-scales and sub-mins
// (ggml's get_scale_min_k4 packing), then 128 bytes of codes, 32 per pair of groups: byte j holds weight j of group
// 2i in its low nibble and weight j of group 2i + 1 in its high one. A Q5_K block has 32 more bytes before its
// codes, whose bit g of byte j is the fifth bit of weight j of group g.
//
// A u4 chunk's byte holds weights j and j + 16 of one group instead, so two 64-bit permutations per 128 weights
// turn a half block's nibbles into the vectors unpack_chunk<4> gives for u4 (Q5_K then adds its fifth bits: codes
// below 32 fit the same dot products). From there the kernels run u4's K-quant operations (quant_linear.h: the
// same activation layout, d * sub-scale and dmin * sub-min formed alike), so a Q4_K product is the interleaved u4
// weight's bit for bit. (A Q5_K one differs from the u8 repack's in float rounding only: u8 sums its lanes
// otherwise.)
//
// Q8_0 weights read in the GGUF file's own blocks (arrangement kBlocksQ8_0, PackedWeight layout "q8_0"): the weight
// stays in the file's memory map, so loading neither copies nor repacks it.
//
// A block is one group of 32 weights: its float16 scale d, then 32 int8 codes. The u8 repack stores code + 128 in a
// byte and the scales apart, with zero point 128; here the kernels flip each code's top bit as they load it (that
// is code + 128) and read the scales from the blocks, then run u8's operations in u8's order, so a product equals
// the u8 weight's bit for bit. (AVX2 takes int8 codes as they are: its u8 kernels turn code + 128 back into them.)
//
// Q4_0, Q4_1, Q5_0 and Q5_1 weights read in the GGUF file's own blocks (arrangements kBlocksQ4_0, kBlocksQ4_1,
// kBlocksQ5_0 and kBlocksQ5_1, PackedWeight layouts "q4_0", "q4_1", "q5_0" and "q5_1"): the weight stays in the file's
// memory map, so loading neither copies nor repacks it.
//
// A block is one group of 32 weights: its float16 scale d (Q4_1, Q5_1: then its float16 min m), Q5's 32 fifth bits
// (bit j for weight j), then 16 bytes whose byte j holds weight j in its low nibble and weight j + 16 in its high one.
// Those are a u4 group's bytes, so a u4 chunk (4 groups) is the codes of 4 blocks side by side, one per 128-bit lane;
// Q5's fifth bits join them in registers (16 added where a bit is set), as Q5_K's do. The kernels read the scales
// (and mins) from the blocks and run u4's operations in u4's order: symmetric around 8 (Q4_0) or 16 (Q5_0), with the
// mins against the activation's group sums for Q4_1 and Q5_1. A Q4 product equals the u4 repack's bit for bit; a Q5
// one the u8 repack's up to float rounding (the same integer products, summed in other lanes).
//
// MXFP4 weights (gpt-oss's experts) read in the GGUF file's own blocks (arrangement kBlocksMXFP4, PackedWeight layout
// "mxfp4"): the weight stays in the file's memory map, in 4.25 bits a weight, and is never dequantized at load.
//
// A block is one group of 32 weights: an E8M0 exponent byte e, then 16 bytes whose byte j holds weight j's 4-bit E2M1
// code in its low nibble and weight j + 16's in its high one (Q4_0's order). A code is worth kMxfp4Values[code] (the
// E2M1 value doubled: 0, 1, 2, 3, 4, 6, 8, 12, and their negatives from code 8 on) times 2^(e - 127) / 2. The kernels
// form code' = that value + 12 (0-24, a byte each: u8's operations, zero point 12) and the scale 2^(e - 128) as a
// float, exact for every e (mxfp4_scale). The u8 repack keeps the same codes with the scale in float16, which holds
// 2^(e - 128) exactly for e in 104-143 (weights of 2^-24 to 2^15 a step; a real model's lie well inside): there a
// product equals the u8 weight's up to float rounding (the same integer products, summed in other lanes), and the
// generic kernels give the u8 weight's bits. The ISAs read the blocks in registers: on x86 (arch/avx512/mxfp4.h,
// arch/avx2/mxfp4.h) a byte shuffle per vector turns the nibbles into these codes, then u4's operations run (the u8
// weight's integer products, summed in u4's lanes); NEON looks up the values themselves (code - 12) and keeps the
// generic order, so its results are the generic ones bit for bit.
#pragma once
#include "../common.h"

namespace {
namespace generic {

// Code n of a u6 row of K weights (packed_weight.py's pack_u6).
inline int u6_code(const uint8_t* row, int64_t K, int64_t n) {
  const int64_t chunk = n / 128, within = n % 128, i = within % 16;
  const int64_t position = within / 16 * 8 + i % 8;  // in the chunk's low- or high-nibble vector
  const int nibble = (row[n / 16 * 8 + i % 8] >> (i < 8 ? 0 : 4)) & 0x0F;
  const int pair = 2 * (i < 8 ? 0 : 2) + 2 * static_cast<int>(position / 32);
  return nibble | (((row[K / 2 + chunk * 32 + position % 32] >> pair) & 3) << 4);
}

// The 128 codes of chunk c of a u6 row of K weights: u6_code for n = 128 c .. 128 c + 127, without its
// per-code index arithmetic (each low-nibble byte holds codes i and i + 8 of a 16-code run).
inline void u6_chunk_codes(const uint8_t* row, int64_t K, int64_t c, uint8_t* codes) {
  const uint8_t* low = row + c * 64;
  const uint8_t* high = row + K / 2 + c * 32;
  for (int p = 0; p < 64; ++p) {
    const int shift = (p >> 5) * 2, at = (p >> 3) * 16 + (p & 7);
    codes[at] = static_cast<uint8_t>((low[p] & 0x0F) | (((high[p & 31] >> shift) & 3) << 4));
    codes[at + 8] = static_cast<uint8_t>((low[p] >> 4) | (((high[p & 31] >> (4 + shift)) & 3) << 4));
  }
}


// The 128 codes of chunk c of a row of 6-bit codes in natural order, from u6's planes or a row of Q6_K blocks
// (half c % 2 of block c / 2: code j < 64 is ql[j]'s low nibble, 64 + j its high one, with bits 2q, 2q + 1 of
// qh[j % 32] on top for code 32q + j % 32).
inline void u6_chunk_values(const uint8_t* row, int64_t K, int64_t c, const Layout& L, uint8_t* codes) {
  if (L.file != kBlocksQ6_K) {
    u6_chunk_codes(row, K, c, codes);
    return;
  }
  const uint8_t* ql = row + c / 2 * kQ6KBytes + 64 * (c % 2);
  const uint8_t* qh = row + c / 2 * kQ6KBytes + kQ6KHighBits + 32 * (c % 2);
  for (int j = 0; j < 128; ++j) {
    const int nibble = j < 64 ? ql[j] & 0x0F : ql[j - 64] >> 4;
    codes[j] = static_cast<uint8_t>(nibble | (((qh[j % 32] >> (2 * (j / 32))) & 3) << 4));
  }
}


// The scale of group q (0-15) of a Q6_K block: d * sub-scale rounded to float16, as u6 stores it.
inline float q6k_group_scale(const uint8_t* block, int q) {
  const float sub = static_cast<float>(static_cast<int8_t>(block[kQ6KSubScales + q]));
  return half_to_float(float_to_half(half_to_float(load_half_bits(block + kQ6KSuperScale)) * sub));
}

// A Q6_K row's group scales as floats, `groups` of them (the AVX-512 build's q6k_row_scales, a group at a time).
inline void q6k_row_scales(const uint8_t* row, int64_t groups, float* scales) {
  for (int64_t g = 0; g < groups; ++g) scales[g] = q6k_group_scale(row + g / kGroupBlock * kQ6KBytes, g % kGroupBlock);
}


// The scales d * sub-scale and mins -(dmin * sub-min) of the 8 groups of a Q4_K or Q5_K block, as floats.
inline void k_block_params(const uint8_t* block, float* scales, float* mins) {
  const float d = half_to_float(load_half_bits(block)), dmin = half_to_float(load_half_bits(block + 2));
  for (int q = 0; q < 8; ++q) {
    // get_scale_min_k4: groups 0-3 from the low 6 bits of bytes q and q + 4; groups 4-7 from the nibbles of
    // byte q + 4 and the top bits of bytes q - 4 and q
    const uint8_t* p = block + kQ4KSubParams;
    const int sub = q < 4 ? p[q] & 63 : (p[q + 4] & 0x0F) | ((p[q - 4] >> 6) << 4);
    const int sub_min = q < 4 ? p[q + 4] & 63 : (p[q + 4] >> 4) | ((p[q] >> 6) << 4);
    scales[q] = static_cast<float>(sub) * d;
    mins[q] = -(static_cast<float>(sub_min) * dmin);
  }
}

// A row of K weights in Q4_K or Q5_K blocks (L.k_blocks()) as a row-major u4 row (Q4_K, K / 2 bytes) or u8 row (Q5_K,
// K bytes) with each group's scale d * sub-scale and min -(dmin * sub-min) as floats, formed as RowRestorer forms
// a u4 or u8 K-quant row's: what dequantize_row reads.
inline void k_blocks_row(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins) {
  const int64_t blocks = K / kQ4KWeights;
  const bool five = L.file == kBlocksQ5_K;
  const int64_t block_bytes = L.block_bytes();
  const int64_t first_code = five ? kQ5KCodes : kQ4KCodes;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * block_bytes;
    k_block_params(block, scales + 8 * b, mins + 8 * b);
    for (int q = 0; q < 8; ++q) {
      const int64_t g = 8 * b + q;
      const uint8_t* qs = block + first_code + 32 * (q / 2);
      auto code = [&](int j) {  // weight j of group q
        const int nibble = q % 2 == 0 ? qs[j] & 0x0F : qs[j] >> 4;
        return five ? nibble | (((block[kQ5KHighBits + j] >> q) & 1) << 4) : nibble;
      };
      for (int j = 0; j < 16; ++j) {
        if (five) {
          codes[32 * g + j] = static_cast<uint8_t>(code(j));
          codes[32 * g + j + 16] = static_cast<uint8_t>(code(j + 16));
        } else {
          codes[16 * g + j] = static_cast<uint8_t>(code(j) | (code(j + 16) << 4));
        }
      }
    }
  }
}

// The scale d (and with `mins`, the min m) of a block of one group that starts with them as float16: Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1.
inline void group_block_params(const uint8_t* block, bool mins, float& scale, float& min) {
  scale = half_to_float(load_half_bits(block));
  if (mins) min = half_to_float(load_half_bits(block + 2));
}

// A row of K weights in Q8_0 blocks as a row-major u8 row (code + 128, K bytes) with each group's scale as a float:
// what dequantize_row reads (zero point 128).
inline void q8_0_row(const uint8_t* row, int64_t K, uint8_t* codes, float* scales) {
  for (int64_t g = 0; g < K / kActBlock; ++g) {
    const uint8_t* block = row + g * kQ8_0Bytes;
    float unused;
    group_block_params(block, false, scales[g], unused);
    for (int i = 0; i < kActBlock; ++i) codes[g * kActBlock + i] = static_cast<uint8_t>(block[2 + i] ^ 0x80);
  }
}

// A Q5_0 or (MINS) Q5_1 block's 32 codes (0-31), a byte each, into out: its low nibbles with its fifth bits added.
inline void q5_block_codes(const uint8_t* block, bool with_mins, uint8_t* out) {
  const int64_t high = with_mins ? 4 : 2;
  uint32_t qh;
  std::memcpy(&qh, block + high, 4);
  const uint8_t* qs = block + high + 4;
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<uint8_t>((qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
    out[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}

// A row of K weights in Q4_0 or Q4_1 blocks as a row-major u4 row (K / 2 bytes: the blocks' codes as they are), or in
// Q5_0 or Q5_1 blocks as a u8 row (K bytes, codes 0-31), with each group's scale and (Q4_1, Q5_1) min as floats:
// what dequantize_row reads (Q4_0 with zero point 8, Q5_0 with 16). Returns whether the codes are u8.
inline bool q4_row(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins) {
  const bool with_mins = L.block_mins(), fifth = L.file == kBlocksQ5_0 || L.file == kBlocksQ5_1;
  const int64_t bytes = L.block_bytes();
  for (int64_t g = 0; g < K / kActBlock; ++g) {
    const uint8_t* block = row + g * bytes;
    float unused;
    group_block_params(block, with_mins, scales[g], with_mins ? mins[g] : unused);
    if (fifth) q5_block_codes(block, with_mins, codes + g * 32);
    else std::memcpy(codes + g * 16, block + (with_mins ? 4 : 2), 16);
  }
  return fifth;
}


// The doubled E2M1 value of each 4-bit MXFP4 code (the OCP Microscaling format's FP4 E2M1 element: sign bit 3, two
// exponent bits and one mantissa bit), and the zero point the kernels' codes (value + 12) sit at.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr int kMxfp4Zero = 12;

// The scale 2^(e - 127) / 2 = 2^(e - 128) of an E8M0 exponent byte, as a float: exact for every e (the smallest two
// are float32 subnormals; e = 255, E8M0's NaN, reads as 2^127, as gguf-py and ggml read it).
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return scale;
}

// An MXFP4 block's 32 codes as the kernels read them (kMxfp4Values + 12: 0-24), a byte each, into out.
inline void mxfp4_block_codes(const uint8_t* block, uint8_t* out) {
  const uint8_t* qs = block + 1;
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<uint8_t>(kMxfp4Values[qs[j] & 0x0F] + kMxfp4Zero);
    out[j + 16] = static_cast<uint8_t>(kMxfp4Values[qs[j] >> 4] + kMxfp4Zero);
  }
}

// A row of K weights in MXFP4 blocks as a row-major u8 row (K bytes, codes 0-24, zero point 12) with each group's
// scale as a float: what dequantize_row reads.
inline void mxfp4_row(const uint8_t* row, int64_t K, uint8_t* codes, float* scales) {
  const int64_t bytes = quant_type(kBlocksMXFP4).block_bytes;
  for (int64_t g = 0; g < K / kActBlock; ++g) {
    const uint8_t* block = row + g * bytes;
    scales[g] = mxfp4_scale(block[0]);
    mxfp4_block_codes(block, codes + g * kActBlock);
  }
}

// unpack_row_<TYPE>: a row of K weights in the type's blocks as a repacked layout's row: its codes (row-major u4, u8,
// or for Q6_K the blocks as they are, which u6_chunk_values reads), each group's scale and (asymmetric types) min as
// floats (K-quants: d * sub-scale and -(dmin * sub-min)); returns the layout of the codes. One per row of types.def.
using RowUnpackFn = const Layout& (*)(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                      float* mins);

inline const Layout& unpack_row_Q6_K(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                     float*) {
  std::memcpy(codes, row, L.row_bytes(K));
  q6k_row_scales(row, K / L.group_size, scales);
  return L;
}

inline const Layout& unpack_row_Q4_K(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                     float* mins) {
  k_blocks_row(L, row, K, codes, scales, mins);
  return kU4;
}

inline const Layout& unpack_row_Q5_K(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                     float* mins) {
  k_blocks_row(L, row, K, codes, scales, mins);
  return kU8;
}

inline const Layout& unpack_row_Q8_0(const Layout&, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                     float*) {
  q8_0_row(row, K, codes, scales);
  return kU8;
}

inline const Layout& unpack_q4_q5_row(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                      float* mins) {
  return q4_row(L, row, K, codes, scales, mins) ? kU8 : kU4;
}
constexpr RowUnpackFn unpack_row_Q4_0 = unpack_q4_q5_row, unpack_row_Q4_1 = unpack_q4_q5_row;
constexpr RowUnpackFn unpack_row_Q5_0 = unpack_q4_q5_row, unpack_row_Q5_1 = unpack_q4_q5_row;

inline const Layout& unpack_row_MXFP4(const Layout&, const uint8_t* row, int64_t K, uint8_t* codes, float* scales,
                                      float*) {
  mxfp4_row(row, K, codes, scales);
  return kU8;
}

// Each type's unpack_row, in types.def's order (a type without one does not compile).
constexpr RowUnpackFn kUnpackRow[] = {
#define LC_QUANT_TYPE(NAME, ...) unpack_row_##NAME,
#include "../types.def"
#undef LC_QUANT_TYPE
};

}  // namespace generic
}  // namespace
