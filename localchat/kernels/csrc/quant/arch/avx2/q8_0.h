// Q8_0 blocks on AVX2 (quant/generic/blocks.h describes the type).
#pragma once
#include "common.h"

#if LC_AVX2
namespace {
namespace isa {


// block_scales<false> for the blocks from `block`: the scales of groups 0-7 and 8-15 of the n left, zero past them.
inline void q8_0_scales(const uint8_t* block, int64_t n, __m256 out[2]) {
  alignas(16) uint16_t halves[kGroupBlock] = {};
  for (int64_t i = 0; i < std::min<int64_t>(n, kGroupBlock); ++i) std::memcpy(halves + i, block + i * kQ8_0Bytes, 2);
  out[0] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(halves)));
  out[1] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(halves + 8)));
}

// Half h of chunk c (group 2c + h) as unpack_half<8> gives a u8 chunk's: the signed codes and their magnitudes.
inline HalfCodes q8_0_half(const uint8_t* row, int64_t c, int h, int64_t groups) {
  HalfCodes w;
  const int64_t g = 2 * c + h;
  w.lo = g < groups ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8_0_codes(row + g * kQ8_0Bytes)))
                    : _mm256_set1_epi8(static_cast<char>(0x80));  // (as u8 leaves a missing group: code 0)
  w.hi = _mm256_abs_epi8(w.lo);
  return w;
}

// gemv_rows<PRECISE, true, 8, false> for a pass of Q8_0 rows, a row at a time, in gemv_rows' order.
template <bool PRECISE>
void gemv_q8_0(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
               const ActivationRow& a, int rows, float* out) {
  auto params = [](const uint8_t* blocks, int64_t n, int64_t, __m256 sd[2], __m256&) { q8_0_scales(blocks, n, sd); };
  auto half = [&](const uint8_t* row, int64_t c, int h) { return q8_0_half(row, c, h, groups); };
  gemv_group_blocks<PRECISE, true, 8, 2>(v, groups, chunks, L, a, rows, out, kQ8_0Bytes, kQ8_0PrefetchBytes, params,
                                         half);
}

// panel_dots<PRECISE, true, 8, false> for a pass of Q8_0 rows.
template <bool PRECISE>
void panel_q8_0(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
                int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  __m256 block[kRowsPerPass][2];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, HalfCodes* w, __m256* s) {
    const int64_t j = c % (kGroupBlock / 2), g0 = (c - j) * 2;
    if (j == 0) q8_0_scales(row + g0 * kQ8_0Bytes, groups - g0, block[r]);
    for (int h = 0; h < 2; ++h) {
      w[h] = q8_0_half(row, c, h, groups);
      s[h] = to_lanes(block[r], index, j, h);
    }
  };
  panel_blocks<PRECISE, true, 8>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, kNoOffsets);
}

}  // namespace isa
}  // namespace
#endif
