// MXFP4 blocks on AVX2 (quant/generic/blocks.h describes the type): arch/avx512/mxfp4.h's approach on 256-bit
// vectors. Two blocks' 16 code bytes make half a u4 chunk, one byte shuffle per vector turns each 4-bit E2M1 code
// into the kernels' code (its doubled value + 12: 0-24), and from there the kernels run u4's symmetric operations
// (gemv_q4's and panel_q4's order) with zero point 12 and each group's scale mxfp4_scale of its E8M0 byte.
#pragma once
#include "../../generic/blocks.h"
#include "common.h"

#if LC_AVX2
namespace {
namespace isa {

// The scales of groups 0-7 and 8-15 of the blocks from `block` (n of them left), zero past them.
inline void mxfp4_params(const uint8_t* block, int64_t n, __m256 scales[2]) {
  alignas(32) float s[kGroupBlock] = {};
  for (int64_t i = 0; i < std::min<int64_t>(n, kGroupBlock); ++i) s[i] = generic::mxfp4_scale(block[i * kMxfp4Bytes]);
  scales[0] = _mm256_load_ps(s);
  scales[1] = _mm256_load_ps(s + 8);
}

// Half h of chunk c (groups 4c + 2h and 4c + 2h + 1, n groups there from 4c) as the kernels' codes in unpack_half<4>'s
// two vectors (lo: weights 0-15 of each group, hi: 16-31), zero for groups past the n there.
inline HalfCodes mxfp4_half(const uint8_t* row, int64_t c, int h, int64_t n) {
  const uint8_t* first = row + 4 * c * kMxfp4Bytes;
  auto codes = [&](int i) {
    return i < n ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + i * kMxfp4Bytes + 1)) : _mm_setzero_si128();
  };
  auto there = [&](int i) { return i < n ? _mm_set1_epi8(-1) : _mm_setzero_si128(); };
  const __m256i raw = _mm256_set_m128i(codes(2 * h + 1), codes(2 * h));
  const __m256i keep = _mm256_set_m128i(there(2 * h + 1), there(2 * h));
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i table = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  HalfCodes w;
  w.lo = _mm256_and_si256(_mm256_shuffle_epi8(table, _mm256_and_si256(raw, low_mask)), keep);
  w.hi = _mm256_and_si256(_mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask)), keep);
  return w;
}

// gemv_rows<PRECISE, true, 4, false> for a pass of rows of MXFP4 blocks, a row at a time, in gemv_q4's order.
template <bool PRECISE>
void gemv_mxfp4(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
                const ActivationRow& a, int rows, float* out) {
  auto params = [](const uint8_t* blocks, int64_t n, int64_t, __m256 sd[2], __m256&) { mxfp4_params(blocks, n, sd); };
  auto half = [&](const uint8_t* row, int64_t c, int h) { return mxfp4_half(row, c, h, groups - 4 * c); };
  gemv_group_blocks<PRECISE, true, 4, 4>(v, groups, chunks, L, a, rows, out, kMxfp4Bytes, kPrefetchBytes, params,
                                         half);
}

// panel_dots<PRECISE, true, 4, false> for a pass of rows of MXFP4 blocks, in panel_q4's order.
template <bool PRECISE>
void panel_mxfp4(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L,
                 const ActivationRow* acts, int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  __m256 block[kRowsPerPass][2];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, HalfCodes* w, __m256* s) {
    const int64_t j = c % (kGroupBlock / 4), g0 = (c - j) * 4;
    if (j == 0) mxfp4_params(row + g0 * kMxfp4Bytes, groups - g0, block[r]);
    for (int h = 0; h < 2; ++h) {
      w[h] = mxfp4_half(row, c, h, groups - 4 * c);
      s[h] = to_lanes(block[r], index, j, h);
    }
  };
  panel_blocks<PRECISE, true, 4>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, kNoOffsets);
}

}  // namespace isa
}  // namespace
#endif
