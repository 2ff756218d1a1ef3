// Q6_K blocks on AVX-512 VNNI (quant/generic/blocks.h describes the type).
#pragma once
#include "common.h"

#if LC_VNNI
namespace {
namespace isa {


// The 16 group scales of a Q6_K block: d * sub-scale, rounded to float16 as the u6 repack (gguf_repack.h) stores it.
inline __m512 q6k_scales(const uint8_t* block) {
  const __m512 sub = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ6KSubScales))));
  const __m512 product = _mm512_mul_ps(_mm512_set1_ps(q6k_super_scale(block)), sub);
  return _mm512_cvtph_ps(_mm512_cvtps_ph(product, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Half h's 128 codes of a Q6_K block in their own order: weights 0-63 of the half in lo, 64-127 in hi.
inline void q6k_codes(const uint8_t* block, int h, __m512i& lo, __m512i& hi) {
  six_bit_codes(_mm512_loadu_si512(block + 64 * h), block + kQ6KHighBits + 32 * h, lo, hi);
}

// Half h of a Q6_K block as a u6 chunk's two vectors (unpack_chunk<6>): each group of 16's first 8 codes in lo, its
// last 8 in hi.
inline void q6k_chunk(const uint8_t* block, int h, __m512i& lo, __m512i& hi) {
  __m512i first, second;
  q6k_codes(block, h, first, second);
  lo = _mm512_permutex2var_epi64(first, _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0), second);
  hi = _mm512_permutex2var_epi64(first, _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1), second);
}

// gemv_rows for a pass of Q6_K rows (v: row-major, row_step the row's bytes), a row at a time: per block, its
// scales times the activation scales, then per half the u6 chunk's dot products, in gemv_rows' order.
template <bool PRECISE>
void gemv_q6k(const PassView& v, int64_t, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow& a,
              int rows, float* out) {
  for (int r = 0; r < rows; ++r) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < chunks / 2; ++b) {
      const uint8_t* block = v.w + r * v.row_step + b * kQ6KBytes;
      prefetch_q6k_ahead(block);
      const __m512 sd = _mm512_mul_ps(q6k_scales(block), _mm512_loadu_ps(a.group_scales + b * kGroupBlock));
      for (int h = 0; h < 2; ++h) {
        const ActivationChunk chunk = load_chunk<PRECISE, true, 6>(a, 2 * b + h, L);
        __m512i lo, hi;
        q6k_chunk(block, h, lo, hi);
        const __m512 lane_sd = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex8.lanes[h]), sd);
        acc = accumulate_scaled<PRECISE, true, 6>(lo, hi, lane_sd, chunk, acc);
      }
    }
    out[r] = _mm512_reduce_add_ps(acc);
  }
}

// panel_dots for a pass of Q6_K rows: each half block unpacked once for the panel's activation rows.
template <bool PRECISE>
void panel_q6k(const PassView& v, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
               int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  __m512 scales[kRowsPerPass];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, __m512i& lo, __m512i& hi, __m512& s) {
    const int h = static_cast<int>(c % 2);
    const uint8_t* block = row + c / 2 * kQ6KBytes;
    if (h == 0) scales[r] = q6k_scales(block);
    q6k_chunk(block, h, lo, hi);
    s = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex8.lanes[h]), scales[r]);
  };
  panel_blocks<PRECISE, true, 6>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, kNoOffsets);
}

// The 128 codes of chunk c (half c % 2 of block c / 2) of a Q6_K row, in natural order (dequantize_row).
inline void q6k_natural_codes(const uint8_t* row, int64_t c, uint8_t* codes) {
  __m512i lo, hi;
  q6k_codes(row + c / 2 * kQ6KBytes, static_cast<int>(c % 2), lo, hi);
  _mm512_storeu_si512(codes, lo);
  _mm512_storeu_si512(codes + 64, hi);
}

// A Q6_K row's group scales as floats (q6k_scales), `groups` of them.
inline void q6k_row_scales(const uint8_t* row, int64_t groups, float* scales) {
  for (int64_t b = 0; b < groups / kGroupBlock; ++b) _mm512_storeu_ps(scales + b * kGroupBlock, q6k_scales(row + b * kQ6KBytes));
}


}  // namespace isa
}  // namespace
#endif
