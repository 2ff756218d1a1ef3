// Q4_K and Q5_K blocks on AVX-512 VNNI (quant/generic/blocks.h describes the types).
#pragma once
#include "common.h"

#if LC_VNNI
namespace {
namespace isa {


// The scales d * sub-scale and (positive) mins dmin * sub-min of the 16 groups of blocks `block` and, when `two`,
// the next (zeros past them), as k_group_params forms a u4 weight's.
template <int BITS>
inline void k_blocks_params(const uint8_t* block, bool two, __m512& scales, __m512& mins) {
  __m128i sub_scales, sub_mins, halves;
  k_pair_params<BITS>(block, two, sub_scales, sub_mins, halves);
  const __m512 supers = _mm512_castps128_ps512(_mm_cvtph_ps(halves));
  scales = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_scales)), _mm512_permutexvar_ps(super_lanes(0), supers));
  mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_mins)), _mm512_permutexvar_ps(super_lanes(1), supers));
}

// Half h (128 weights, groups 4h .. 4h + 3) of a block as unpack_chunk<4> gives a u4 chunk: each group's weights
// 0-15 in lo, 16-31 in hi. The half's low nibbles are groups 4h and 4h + 2, its high nibbles 4h + 1 and 4h + 3,
// each 32 weights (four 64-bit words) long. Q5_K's fifth bits come from bit 4h + q of its high-bit bytes 0-15 (lo's
// 16-byte lane q) and 16-31 (hi's).
template <int BITS>
inline void k_blocks_chunk(const uint8_t* block, int h, __m512i& lo, __m512i& hi) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i raw = _mm512_loadu_si512(block + k_block_codes<BITS>() + 64 * h);
  const __m512i low = _mm512_and_si512(raw, low_mask), high = high_nibbles(raw, low_mask);
  lo = _mm512_permutex2var_epi64(low, _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), high);
  hi = _mm512_permutex2var_epi64(low, _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2), high);
  if (BITS == 5) {
    auto lane = [&](int q) { return static_cast<int32_t>(0x01010101u << (4 * h + q)); };  // bit 4h + q of each byte
    const __m512i bits = _mm512_set_epi32(lane(3), lane(3), lane(3), lane(3), lane(2), lane(2), lane(2), lane(2),
                                          lane(1), lane(1), lane(1), lane(1), lane(0), lane(0), lane(0), lane(0));
    const __m128i* top = reinterpret_cast<const __m128i*>(block + kQ5KHighBits);
    const __m512i sixteen = _mm512_set1_epi8(16);
    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(_mm512_broadcast_i32x4(_mm_loadu_si128(top)), bits), lo, sixteen);
    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(_mm512_broadcast_i32x4(_mm_loadu_si128(top + 1)), bits), hi, sixteen);
  }
}

// The lanes of a row's mins times the activation group sums (terms), 16 groups at a time from zero, as
// offset_lanes<true> forms a u4 weight's.
template <int BITS>
inline __m512 k_blocks_offsets(const uint8_t* row, int64_t blocks, const float* terms) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool two = b + 1 < blocks;
    __m512 scales, mins;
    k_blocks_params<BITS>(row + b * k_block_bytes<BITS>(), two, scales, mins);
    acc = _mm512_fnmadd_ps(mins, _mm512_maskz_loadu_ps(two ? 0xFFFF : 0x00FF, terms + 8 * b), acc);
  }
  return acc;
}

// gemv_rows for a pass of rows of blocks (v: row-major, row_step the row's bytes), a row at a time: per two blocks
// (16 groups), their scales times the activation scales and their mins against the activation's group sums, then
// per half block u4's dot products, in gemv_rows' order.
template <bool PRECISE, int BITS>
void gemv_k_blocks(const PassView& v, int64_t, int64_t, int64_t chunks, int64_t, const Layout& L,
                   const ActivationRow& a, int rows, float* out) {
  const int64_t blocks = chunks / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m512 acc = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b += 2) {
      const uint8_t* block = row + b * k_block_bytes<BITS>();
      prefetch_k_blocks_ahead<BITS>(block);
      const bool two = b + 1 < blocks;
      __m512 scales, mins;
      k_blocks_params<BITS>(block, two, scales, mins);
      const int64_t g0 = 8 * b;
      const __m512 sd = _mm512_mul_ps(scales, _mm512_loadu_ps(a.group_scales + g0));
      offsets = _mm512_fnmadd_ps(mins, _mm512_maskz_loadu_ps(two ? 0xFFFF : 0x00FF, a.group_terms + g0), offsets);
      for (int j = 0; j < (two ? 4 : 2); ++j) {
        const ActivationChunk chunk = load_chunk<PRECISE, false, 4>(a, 2 * b + j, L);
        __m512i lo, hi;
        k_blocks_chunk<BITS>(block + j / 2 * k_block_bytes<BITS>(), j % 2, lo, hi);
        const __m512 lane_sd = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex4.lanes[j]), sd);
        acc = accumulate_scaled<PRECISE, false, 4>(lo, hi, lane_sd, chunk, acc);
      }
    }
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc, offsets));
  }
}

// panel_dots for a pass of rows of blocks: each half block unpacked once for the panel's activation rows.
template <bool PRECISE, int BITS>
void panel_k_blocks(const PassView& v, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
                    int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const int64_t blocks = chunks / 2;
  __m512 scales[kRowsPerPass];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, __m512i& lo, __m512i& hi, __m512& s) {
    const int64_t j = c % 4, b = c / 2;
    const uint8_t* block = row + b * k_block_bytes<BITS>();
    if (j == 0) {
      __m512 mins;
      k_blocks_params<BITS>(block, b + 1 < blocks, scales[r], mins);
    }
    k_blocks_chunk<BITS>(block, static_cast<int>(c % 2), lo, hi);
    s = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex4.lanes[j]), scales[r]);
  };
  auto offsets = [&](const uint8_t* row, const ActivationRow& a) {
    return k_blocks_offsets<BITS>(row, blocks, a.group_terms);
  };
  panel_blocks<PRECISE, false, 4>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, offsets);
}

}  // namespace isa
}  // namespace
#endif
