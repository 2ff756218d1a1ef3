// Q6_K blocks on AVX2 (quant/generic/blocks.h describes the type).
#pragma once
#include "common.h"

#if LC_AVX2
namespace {
namespace isa {


// The 16 group scales of a Q6_K block as two halves of 8 (q6k_scales: rounded to float16 like u6's).
inline void q6k_scales(const uint8_t* block, __m256 out[2]) {
  const __m256 d = _mm256_set1_ps(q6k_super_scale(block));
  for (int i = 0; i < 2; ++i) {
    const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kQ6KSubScales + 8 * i));
    const __m256 product = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sub)));
    out[i] = _mm256_cvtph_ps(_mm256_cvtps_ph(product, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

// Vector half h of chunk hc (half hc of the block) as unpack_half<6> gives a u6 chunk's: the block's codes j < 64
// of the chunk (h = 0) or 64 + j (h = 1) are the low or high nibbles of ql's 64 bytes, with qh's bit pairs 0-1 and
// 2-3 (or 4-5 and 6-7) on top; their 8-byte runs alternate between u6's lo (each group's first 8) and hi.
inline HalfCodes q6k_half(const uint8_t* block, int hc, int h) {
  const uint8_t* ql = block + 64 * hc;
  const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ6KHighBits + 32 * hc));
  const __m256i low_mask = _mm256_set1_epi8(0x0F), pair = _mm256_set1_epi8(0x30);
  __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  __m256i second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  if (h == 1) {
    first = _mm256_srli_epi16(first, 4);
    second = _mm256_srli_epi16(second, 4);
  }
  // codes j < 32 take bits 2 * (2h) and up of qh[j], codes 32 + j bits 2 * (2h + 1)
  const __m256i top_first = h == 0 ? _mm256_slli_epi16(top, 4) : top;
  const __m256i top_second = h == 0 ? _mm256_slli_epi16(top, 2) : _mm256_srli_epi16(top, 2);
  first = _mm256_or_si256(_mm256_and_si256(first, low_mask), _mm256_and_si256(top_first, pair));
  second = _mm256_or_si256(_mm256_and_si256(second, low_mask), _mm256_and_si256(top_second, pair));
  HalfCodes w;
  w.lo = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(first, second), 0xD8);  // runs 0, 2 of each
  w.hi = _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(first, second), 0xD8);  // runs 1, 3 of each
  return w;
}

// gemv_rows for a pass of Q6_K rows (v: row-major, row_step the row's bytes), a row at a time, in gemv_rows' order.
template <bool PRECISE>
void gemv_q6k(const PassView& v, int64_t, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow& a,
              int rows, float* out) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  for (int r = 0; r < rows; ++r) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < chunks / 2; ++b) {
      const uint8_t* block = v.w + r * v.row_step + b * kQ6KBytes;
      prefetch_q6k_ahead(block);
      __m256 sd[2];
      q6k_scales(block, sd);
      sd[0] = _mm256_mul_ps(sd[0], _mm256_loadu_ps(a.group_scales + b * kGroupBlock));
      sd[1] = _mm256_mul_ps(sd[1], _mm256_loadu_ps(a.group_scales + b * kGroupBlock + 8));
      const BlockLanes<8> lanes(sd, index);
      for (int hc = 0; hc < 2; ++hc) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i dot = lane_dots<PRECISE, true, 6>(q6k_half(block, hc, h), h, a, 2 * b + hc, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lanes.at(hc, h), acc);
        }
      }
    }
    out[r] = finish_row<true>(acc, _mm256_setzero_ps());
  }
}

// panel_dots for a pass of Q6_K rows, in panel_dots' order.
template <bool PRECISE>
void panel_q6k(const PassView& v, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
               int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  __m256 scales[kRowsPerPass][2];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, HalfCodes* w, __m256* s) {
    const int hc = static_cast<int>(c % 2);
    const uint8_t* block = row + c / 2 * kQ6KBytes;
    if (hc == 0) q6k_scales(block, scales[r]);
    for (int h = 0; h < 2; ++h) {
      w[h] = q6k_half(block, hc, h);
      s[h] = to_lanes(scales[r], index, hc, h);
    }
  };
  panel_blocks<PRECISE, true, 6>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, kNoOffsets);
}

}  // namespace isa
}  // namespace
#endif
