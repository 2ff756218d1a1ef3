// MXFP4 blocks on AVX-512 VNNI (quant/generic/blocks.h describes the type). A block's 16 code bytes are a u4
// group's (weight j in byte j's low nibble, j + 16 in its high one), so a chunk (4 groups) is the codes of 4 blocks
// side by side, one per 128-bit lane, as Q4_0's; one byte shuffle per vector then turns each 4-bit E2M1 code into
// the kernels' code (its doubled value + 12: 0-24, kMxfp4Values), and from there the kernels run u4's symmetric
// operations with zero point 12 and each group's scale 2^(e - 128) formed from its E8M0 byte as mxfp4_scale forms it.
// The integer products are the u8 repack's; the lanes they are summed in are u4's. (arch/avx2/mxfp4.h: the same on
// 256-bit vectors.)
#pragma once
#include "../../generic/blocks.h"
#include "common.h"

#if LC_VNNI
namespace {
namespace isa {

// The kernels' codes of each 4-bit code (kMxfp4Values + 12), in each 128-bit lane for the byte shuffle.
inline __m512i mxfp4_code_table() {
  return _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// The scales 2^(e - 128) of E8M0 bytes, the low byte of each 32-bit lane of `words` (mxfp4_scale, 16 at a time).
inline __m512 mxfp4_scales_of(__m512i words) {
  const __m512i e = _mm512_and_si512(words, _mm512_set1_epi32(0xFF));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);  // e 0 and 1: float32 subnormals
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
}

// The scales of the n (at most 16) blocks from `block` as floats, zero past them.
inline __m512 mxfp4_params(const uint8_t* block, int64_t n) {
  const __mmask16 mask = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(static_cast<int>(kMxfp4Bytes)));
  // (4 bytes from each block's start: e and three code bytes, inside the block)
  const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, at, block, 1);
  return _mm512_maskz_mov_ps(mask, mxfp4_scales_of(words));
}

// The scales of the n (at most 4) blocks from `first`, lanes 0-3, zero past them: mxfp4_params for one chunk,
// without a gather.
inline __m128 mxfp4_chunk_params(const uint8_t* first, int64_t n) {
  alignas(64) int32_t word[16] = {};
  for (int i = 0; i < 4; ++i) {
    if (i < n) word[i] = first[i * kMxfp4Bytes];
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(n, 4)) - 1);
  return _mm512_castps512_ps128(_mm512_maskz_mov_ps(mask, mxfp4_scales_of(_mm512_load_si512(word))));
}

// The 16 code bytes of block i of those from `first`, or zeros where i is past the n there.
template <bool WHOLE>
inline __m128i mxfp4_codes(const uint8_t* first, int i, int64_t n) {
  if (!WHOLE && i >= n) return _mm_setzero_si128();
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + i * kMxfp4Bytes + 1));
}

// Chunk c of a row (groups 4c .. 4c + 3, n of them there) as the kernels' codes in u4's two vectors (lo: weights
// 0-15 of each group, hi: 16-31), zero for groups past the n there.
template <bool WHOLE>
inline void mxfp4_chunk_as(const uint8_t* row, int64_t c, int64_t n, __m512i& lo, __m512i& hi) {
  const uint8_t* first = row + 4 * c * kMxfp4Bytes;
  const __m256i low = _mm256_set_m128i(mxfp4_codes<WHOLE>(first, 1, n), mxfp4_codes<WHOLE>(first, 0, n));
  const __m256i high = _mm256_set_m128i(mxfp4_codes<WHOLE>(first, 3, n), mxfp4_codes<WHOLE>(first, 2, n));
  const __m512i raw = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  const __m512i low_mask = _mm512_set1_epi8(0x0F), table = mxfp4_code_table();
  // (a group past the row's end has no activations: its codes are zeroed all the same)
  const __mmask64 there = WHOLE || n >= 4 ? ~0ULL : (1ULL << (16 * n)) - 1;
  lo = _mm512_maskz_shuffle_epi8(there, table, _mm512_and_si512(raw, low_mask));
  hi = _mm512_maskz_shuffle_epi8(there, table, high_nibbles(raw, low_mask));
}

inline void mxfp4_chunk(const uint8_t* row, int64_t c, int64_t n, __m512i& lo, __m512i& hi) {
  if (n >= 4) mxfp4_chunk_as<true>(row, c, n, lo, hi);
  else mxfp4_chunk_as<false>(row, c, n, lo, hi);
}

// gemv_mxfp4's step over the kGroupBlock groups from g0 of a row (WHOLE: all 16 there).
template <bool PRECISE, bool WHOLE>
inline void gemv_mxfp4_step(const uint8_t* row, int64_t g0, int64_t groups, int64_t chunks, const Layout& L,
                            const ActivationRow& a, __m512& acc) {
  const __m512 scales = mxfp4_params(row + g0 * kMxfp4Bytes, groups - g0);
  const __m512 sd = _mm512_mul_ps(scales, _mm512_loadu_ps(a.group_scales + g0));
  const int64_t c0 = g0 / 4, n = WHOLE ? 4 : std::min<int64_t>(chunks - c0, 4);
#pragma GCC unroll 4
  for (int j = 0; j < n; ++j) {
    const ActivationChunk chunk = load_chunk<PRECISE, true, 4>(a, c0 + j, L);
    __m512i lo, hi;
    mxfp4_chunk(row, c0 + j, groups - 4 * (c0 + j), lo, hi);
    const __m512 lane_sd = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex4.lanes[j]), sd);
    acc = accumulate_scaled<PRECISE, true, 4>(lo, hi, lane_sd, chunk, acc);
  }
}

// gemv_rows<PRECISE, true, 4, false> for a pass of rows of MXFP4 blocks (v: row-major, row_step the row's bytes), a
// row at a time, in gemv_q4's order.
template <bool PRECISE>
void gemv_mxfp4(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
                const ActivationRow& a, int rows, float* out) {
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m512 acc = _mm512_setzero_ps();
    int64_t g0 = 0;
    for (; g0 + kGroupBlock <= groups; g0 += kGroupBlock) {
      prefetch_ahead(row + g0 * kMxfp4Bytes, kPrefetchBytes, kGroupBlock * kMxfp4Bytes);
      gemv_mxfp4_step<PRECISE, true>(row, g0, groups, chunks, L, a, acc);
    }
    if (g0 < groups) gemv_mxfp4_step<PRECISE, false>(row, g0, groups, chunks, L, a, acc);
    out[r] = _mm512_reduce_add_ps(acc);
  }
}

// panel_dots<PRECISE, true, 4, false> for a pass of rows of MXFP4 blocks.
template <bool PRECISE>
void panel_mxfp4(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L,
                 const ActivationRow* acts, int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const __m512i quarters = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);  // each lane's group
  auto chunk = [&](int, const uint8_t* row, int64_t c, __m512i& lo, __m512i& hi, __m512& s) {
    const int64_t n = std::min<int64_t>(4, groups - 4 * c);
    mxfp4_chunk(row, c, n, lo, hi);
    s = _mm512_permutexvar_ps(quarters, _mm512_castps128_ps512(mxfp4_chunk_params(row + 4 * c * kMxfp4Bytes, n)));
  };
  panel_blocks<PRECISE, true, 4>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, kNoOffsets);
}

}  // namespace isa
}  // namespace
#endif
