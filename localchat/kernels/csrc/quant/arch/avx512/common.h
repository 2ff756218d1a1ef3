// The AVX-512 VNNI kernels' building blocks: a chunk's codes unpacked into the two vectors vpdpbusd takes, the
// activation chunk, the K-quant scales of a block of 16 groups, each lane's group.
#pragma once
#include "../x86_shared.h"

#if LC_VNNI
namespace {
namespace isa {

// The bytes of a 64-byte chunk that exist, given how many are left in the row (the last chunk may be short).
inline __mmask64 chunk_byte_mask(int64_t left) { return left >= 64 ? ~0ULL : ((1ULL << left) - 1); }

// Lanes of a block of kGroupBlock groups: which of its (d, dmin, d, dmin) halves each group's d and dmin are.
inline __m512i super_lanes(int which) {
  return _mm512_set_epi32(2 + which, 2 + which, 2 + which, 2 + which, 2 + which, 2 + which, 2 + which, 2 + which,
                          which, which, which, which, which, which, which, which);
}

// The (d, dmin) halves of row r's block b (two super-blocks, or one at a short end) as floats.
inline __m512 load_supers(const PassView& v, int r, int64_t b, int64_t groups_left) {
  const __mmask16 mask = groups_left > 8 ? 0xF : 0x3;
  return _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>(mask), v.supers(r, b))));
}

// Row r's K-quant scales d * sub-scale and (positive) mins dmin * sub-min of groups g .. g + n (n even; those past
// the first 16 are left out) as floats: the one place every kernel forms them, so all round them alike.
inline void k_group_params(const PassView& v, int r, int64_t g, int64_t n, __m512& scales, __m512& mins) {
  const __m512 supers = load_supers(v, r, g / kGroupBlock, n);
  __m128i sub_scales, sub_mins;
  k_sub_params(v, r, g, n, sub_scales, sub_mins);
  scales = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_scales)), _mm512_permutexvar_ps(super_lanes(0), supers));
  mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_mins)), _mm512_permutexvar_ps(super_lanes(1), supers));
}

// The 128-bit lane r (0-3) of x.
inline __m128i lane128(__m512i x, int r) {
  switch (r) {
    case 0: return _mm512_castsi512_si128(x);
    case 1: return _mm512_extracti32x4_epi32(x, 1);
    case 2: return _mm512_extracti32x4_epi32(x, 2);
    default: return _mm512_extracti32x4_epi32(x, 3);
  }
}

// k_group_params for all kRowsPerPass rows of an interleaved pass's block b, whose 16 groups are all there: the
// rows' packed sub-scales and sub-mins lie side by side (k_sub_params' unpacking, for four rows in one vector) and
// so do their (d, dmin) halves. Each row's scales and mins come out as k_group_params forms them, bit for bit.
// Unpacking them row by row cost the decode about a third of its instructions on Q4_K weights: measured on the
// Zen 5 EPYC (2026-12-05, one process, alternating), a 14336 x 4096 Q4_K GEMV read 27 -> 34 GB/s on one thread,
// and a whole 8B Q4_K_M decode step took 88.0 -> 76.7 ms on two.
inline void k_pass_params(const PassView& v, int64_t b, __m512* scales, __m512* mins) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_loadu_si512(static_cast<const uint8_t*>(v.s) + b * v.g_block_step);
  // word j of row r's lane: the top byte of groups 2j and 2j + 1; the even group takes its low nibble (the
  // masks below keep only its bits), the odd group its high one
  const __m512i top = _mm512_cvtepu8_epi16(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint8_t*>(v.m) + b * v.g_block_step / 2)));
  const __m512i bits = _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAULL, top, _mm512_slli_epi16(top, 4));
  const __m512i sub_scales =
      _mm512_or_si512(_mm512_and_si512(lo, nibble), _mm512_slli_epi16(_mm512_and_si512(bits, _mm512_set1_epi8(3)), 4));
  const __m512i sub_mins = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), nibble),
                                           _mm512_slli_epi16(_mm512_and_si512(bits, _mm512_set1_epi8(12)), 2));
  // row r's (d, dmin) of its two super-blocks at lanes 4r .. 4r + 3
  const __m512 supers = _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.sup + b * v.sup_block_step)));
  for (int r = 0; r < kRowsPerPass; ++r) {
    const __m512i at = _mm512_set1_epi32(4 * r);
    scales[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane128(sub_scales, r))),
                              _mm512_permutexvar_ps(_mm512_add_epi32(super_lanes(0), at), supers));
    mins[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane128(sub_mins, r))),
                            _mm512_permutexvar_ps(_mm512_add_epi32(super_lanes(1), at), supers));
  }
}

// The K-quant scales and mins of the block of groups from g0 for each of a pass's kRowsPerPass rows (a short pass
// repeats its first row): k_pass_params where an interleaved pass holds the whole block, else row by row.
inline void k_block_params(const PassView& v, int rows, int64_t g0, int64_t groups, __m512* scales, __m512* mins) {
  if (v.holds_block(g0 / kGroupBlock)) {
    k_pass_params(v, g0 / kGroupBlock, scales, mins);
    return;
  }
  for (int r = 0; r < kRowsPerPass; ++r) k_group_params(v, r < rows ? r : 0, g0, groups - g0, scales[r], mins[r]);
}

// acc + the lanes of sum_g min_g * terms_g, 16 groups at a time (the lanes are summed with the rest later). The
// kernels add these to the dot products' lanes from zero (gemv_rows forms a K-quant's as it goes, in this order).
template <bool KQ>
inline __m512 offset_lanes(const PassView& v, int r, const float* terms, int64_t groups, __m512 acc) {
  for (int64_t g = 0; g < groups; g += 16) {
    const int64_t left = groups - g;
    const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    if (KQ) {  // the mins are -dmin * m
      __m512 scales, o;
      k_group_params(v, r, g, left, scales, o);
      acc = _mm512_fnmadd_ps(o, _mm512_maskz_loadu_ps(mask, terms + g), acc);
    } else {
      const __m512 o = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.group<uint16_t>(v.m, r, g)));
      acc = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(mask, terms + g), acc);
    }
  }
  return acc;
}

// One activation row (a decode) against kRowsPerPass (or fewer) weight rows: the activation codes and lane
// scales are loaded once per chunk for all of them. An asymmetric weight's mins are applied 16 groups at a time
// after the chunks, into the same accumulator, so they cost no extra reduction.

// One activation row's chunk c, loaded for the dot products: codes (and the second level's), lane scales, and
// the zero-point sums of a symmetric weight.
struct ActivationChunk {
  __m512i a_lo, a_hi, b_lo, b_hi, zsums;
  __m512 lane_scales;
};

template <bool PRECISE, bool SYMMETRIC, int BITS>
inline ActivationChunk load_chunk(const ActivationRow& a, int64_t c, const Layout& L) {
  ActivationChunk k;
  const int8_t* codes = a.codes + c * L.act_chunk_bytes;
  k.a_lo = _mm512_load_si512(codes);
  k.a_hi = BITS != 8 ? _mm512_load_si512(codes + 64) : k.a_lo;
  k.b_lo = k.a_lo;
  k.b_hi = k.a_hi;
  if (PRECISE) {
    const int8_t* codes2 = a.codes2 + c * L.act_chunk_bytes;
    k.b_lo = _mm512_load_si512(codes2);
    k.b_hi = BITS != 8 ? _mm512_load_si512(codes2 + 64) : k.b_lo;
  }
  k.lane_scales = _mm512_load_ps(a.lane_scales + c * 16);
  k.zsums = SYMMETRIC ? _mm512_load_si512(a.lane_zsums + c * 16) : _mm512_setzero_si512();
  return k;
}

// acc + one weight row's chunk (lo/hi: its codes, unpacked) times an activation chunk: the integer dot products
// times sd, the lanes' weight scale x activation scale. Every kernel goes through this with sd = s * lane_scale
// computed the same way, so a (row, row) pair's result is the same in all.
// (accumulate: the same, from the lanes' weight scales s.)
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline __m512 accumulate_scaled(__m512i lo, __m512i hi, __m512 sd, const ActivationChunk& k, __m512 acc) {
  __m512i dot, dot2;
  if (BITS != 8) {
    dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.a_lo), hi, k.a_hi);
    if (PRECISE) dot2 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.b_lo), hi, k.b_hi);
  } else {
    dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.a_lo);
    if (PRECISE) dot2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.b_lo);
  }
  if (PRECISE) dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), dot2);
  if (SYMMETRIC) dot = _mm512_sub_epi32(dot, k.zsums);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sd, acc);
}

template <bool PRECISE, bool SYMMETRIC, int BITS>
inline __m512 accumulate(__m512i lo, __m512i hi, __m512 s, const ActivationChunk& k, __m512 acc) {
  return accumulate_scaled<PRECISE, SYMMETRIC, BITS>(lo, hi, _mm512_mul_ps(s, k.lane_scales), k, acc);
}

// The high nibbles of every byte (GFNI: one affine transform that shifts each byte right by 4).
inline __m512i high_nibbles(__m512i raw, __m512i low_mask) {
#if defined(__GFNI__)
  (void)low_mask;
  return _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(0x1020408000000000LL), 0);
#else
  return _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_mask);
#endif
}

#if defined(__GFNI__)
// u6: per 64-bit lane, the affine transforms that move a top-bits byte's pair (0-1, 2-3: the low-nibble vector's
// positions j and 32 + j; 4-5, 6-7: the high-nibble vector's) into bits 4-5, all other bits zero.
inline __m512i top_bits_matrix(int64_t first, int64_t second) {
  return _mm512_set_epi64(second, second, second, second, first, first, first, first);
}
#endif

// 128 six-bit codes from 64 bytes of low nibbles (raw) and the 32 bytes of top bits at `top_bytes`: lo takes
// raw's low nibbles, with bits 0-1 of top byte j at positions j < 32 and bits 2-3 at 32 + j; hi the high nibbles,
// with bits 4-5 and 6-7. A u6 chunk and half a Q6_K block (its ql and qh) are both stored this way.
inline void six_bit_codes(__m512i raw, const uint8_t* top_bytes, __m512i& lo, __m512i& hi) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i top = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(top_bytes)));
#if defined(__GFNI__)
  const __m512i top_lo = _mm512_gf2p8affine_epi64_epi8(top, top_bits_matrix(0x01020000, 0x04080000), 0);
  const __m512i top_hi = _mm512_gf2p8affine_epi64_epi8(top, top_bits_matrix(0x10200000, 0x40800000), 0);
#else
  const __m512i pair = _mm512_set1_epi8(0x30);
  const __m512i top_lo = _mm512_and_si512(_mm512_sllv_epi64(top, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), pair);
  const __m512i top_hi = _mm512_and_si512(_mm512_srlv_epi64(top, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), pair);
#endif
  lo = _mm512_ternarylogic_epi32(raw, low_mask, top_lo, 0xEA);  // (raw & 0x0F) | top_lo
  hi = _mm512_or_si512(high_nibbles(raw, low_mask), top_hi);
}

// The codes of row r's chunk c as the two vectors the dot products take: u4 and u6 a chunk's low and high nibbles
// (u6 with their top two bits from the second plane, whose 64-byte chunks start at chunk top0), u8 the bytes.
template <int BITS>
inline void unpack_chunk(const PassView& v, int r, int64_t c, int64_t top0, __mmask64 byte_mask, __m512i& lo,
                         __m512i& hi) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i raw = _mm512_maskz_loadu_epi8(byte_mask, v.codes(r, c));
  if (BITS == 8) {
    lo = hi = raw;
    return;
  }
  if (BITS == 4) {
    lo = _mm512_and_si512(raw, low_mask);
    hi = high_nibbles(raw, low_mask);
    return;
  }
  six_bit_codes(raw, v.codes(r, top0 + c / 2) + 32 * (c & 1), lo, hi);
}

// Prefetch, for an interleaved u6 pass, the lines of row r's chunk t (its nibbles, and its top bits with an even
// chunk), t counted on into the blocks of the passes that follow (which are contiguous: prefetching past the weight
// is harmless).
inline void prefetch_u6_chunk(const PassView& v, int r, int64_t t, int64_t chunks, int64_t top0, int64_t w_row) {
  const uint8_t* block = v.w;
  for (; t >= chunks; t -= chunks) block += kRowsPerPass * w_row;
  __builtin_prefetch(block + t * v.chunk_step + r * kChunkBytes);
  if ((t & 1) == 0) __builtin_prefetch(block + (top0 + t / 2) * v.chunk_step + r * kChunkBytes);
}

// Per chunk j of a block of kGroupBlock groups, the lanes' group within the block: j * groups_per_chunk +
// lane / (16 / groups_per_chunk).
struct ChunkIndex {
  alignas(64) int32_t lanes[kGroupBlock / 2][16];
  explicit ChunkIndex(int groups_per_chunk) {
    for (int j = 0; j < kGroupBlock / 2; ++j)
      for (int lane = 0; lane < 16; ++lane)
        lanes[j][lane] = std::min(15, j * groups_per_chunk + lane / (16 / groups_per_chunk));
  }
};
const ChunkIndex kChunkIndex2(2), kChunkIndex4(4), kChunkIndex8(8);

inline const ChunkIndex& chunk_index(int groups_per_chunk) {
  return groups_per_chunk == 8 ? kChunkIndex8 : groups_per_chunk == 4 ? kChunkIndex4 : kChunkIndex2;
}

// Chunk c of a pass's kRowsPerPass weight rows (lo/hi: their codes, unpacked; s: their lanes' weight scales) against
// activation rows acts[0 .. mt), into their accumulators acc[t * kRowsPerPass + r]. Every panel kernel (this file's
// and the file blocks') runs its chunks through this.
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline void panel_chunk(const __m512i lo[], const __m512i hi[], const __m512 s[], const ActivationRow* acts,
                        int64_t mt, int64_t c, const Layout& L, __m512* acc) {
  for (int64_t t = 0; t < mt; ++t) {
    const ActivationChunk chunk = load_chunk<PRECISE, SYMMETRIC, BITS>(acts[t], c, L);
    __m512* row_acc = acc + t * kRowsPerPass;
    for (int r = 0; r < kRowsPerPass; ++r) row_acc[r] = accumulate<PRECISE, SYMMETRIC, BITS>(lo[r], hi[r], s[r], chunk, row_acc[r]);
  }
}

// The panel (panel_dots) of a pass of rows of file blocks, as every block type's runs it: chunk c of weight row r
// unpacked by chunk(r, row, c, lo, hi, s) (its codes, 8-bit ones in lo alone, and its lanes' weight scales; r's
// state across chunks is the hook's), then panel_chunk for the activation rows, and each pair's lanes summed, with
// offsets(row, activation row) first where the weights have mins (!SYMMETRIC), as its GEMV sums them.
template <bool PRECISE, bool SYMMETRIC, int BITS, typename Chunk, typename Offsets>
void panel_blocks(const PassView& v, int64_t chunks, const Layout& L, const ActivationRow* acts, int64_t mt, int rows,
                  float* out, int64_t out_stride, void* scratch, const Chunk& chunk, const Offsets& offsets) {
  __m512* acc = static_cast<__m512*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm512_setzero_ps();
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i lo[kRowsPerPass], hi[kRowsPerPass];
    __m512 s[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) chunk(r, row(r), c, lo[r], hi[r], s[r]);
    panel_chunk<PRECISE, SYMMETRIC, BITS>(lo, hi, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      __m512 total = acc[t * kRowsPerPass + r];
      if constexpr (!SYMMETRIC) total = _mm512_add_ps(total, offsets(row(r), acts[t]));
      out[t * out_stride + r] = _mm512_reduce_add_ps(total);
    }
  }
}

// panel_blocks' offsets for weights without mins
constexpr auto kNoOffsets = [](const uint8_t*, const ActivationRow&) { return _mm512_setzero_ps(); };

}  // namespace isa
}  // namespace
#endif
