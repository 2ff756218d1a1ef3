// Q4_0, Q4_1, Q5_0 and Q5_1 blocks on AVX2 (quant/generic/blocks.h describes the types).
#pragma once
#include "common.h"

#if LC_AVX2
namespace {
namespace isa {


// block_scales<false> for the blocks from `block` (n of them left): the scales of groups 0-7 and 8-15, zero past
// them, and with MINS their mins likewise.
template <bool MINS, bool FIFTH>
inline void q4_params(const uint8_t* block, int64_t n, __m256 scales[2], __m256 mins[2]) {
  if (MINS) {
    block_half_pairs(block, n, static_cast<int32_t>(q4_block_bytes<MINS, FIFTH>()), scales, mins);
    return;
  }
  alignas(16) uint16_t d[kGroupBlock] = {};
  for (int64_t i = 0; i < std::min<int64_t>(n, kGroupBlock); ++i) {
    std::memcpy(d + i, block + i * q4_block_bytes<MINS, FIFTH>(), 2);
  }
  scales[0] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
  scales[1] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d + 8)));
}

// 16 in byte i where bit i of `bits` is set, else 0.
inline __m256i q5_sixteens(uint32_t bits) {
  // byte i takes byte i / 8 of `bits`, then keeps its bit i % 8
  const __m256i which = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), which);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

// Half h of chunk c (groups 4c + 2h and 4c + 2h + 1, n groups there from 4c) as unpack_half<4> gives a u4 chunk's (Q5:
// with the fifth bits, codes 0-31).
template <bool MINS, bool FIFTH>
inline HalfCodes q4_half(const uint8_t* row, int64_t c, int h, int64_t n) {
  const uint8_t* first = row + 4 * c * q4_block_bytes<MINS, FIFTH>();
  const __m256i raw =
      _mm256_set_m128i(q4_codes<MINS, FIFTH>(first, 2 * h + 1, n), q4_codes<MINS, FIFTH>(first, 2 * h, n));
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  HalfCodes w;
  w.lo = _mm256_and_si256(raw, low_mask);
  w.hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
  if (FIFTH) {  // byte 16b + j of lo is weight j of block 2h + b, of hi weight j + 16
    const uint64_t pair = q5_fifth_pair<MINS, false>(first, 2 * h, n);
    w.lo = _mm256_or_si256(w.lo, q5_sixteens(static_cast<uint32_t>(pair)));
    w.hi = _mm256_or_si256(w.hi, q5_sixteens(static_cast<uint32_t>(pair >> 32)));
  }
  return w;
}

// row_offsets<false, false> of a row of Q4_1 or (FIFTH) Q5_1 blocks against activation rows acts[0 .. mt), into
// extra[t]: the mins' lanes, in the same order, each 16 blocks' read once.
template <bool FIFTH>
inline void q4_1_offsets(const uint8_t* row, int64_t groups, const ActivationRow* acts, int64_t mt, __m256* extra) {
  for (int64_t t = 0; t < mt; ++t) extra[t] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
    __m256 scales[2], mins[2];
    q4_params<true, FIFTH>(row + g0 * q4_block_bytes<true, FIFTH>(), groups - g0, scales, mins);
    for (int64_t t = 0; t < mt; ++t) {
      const float* terms = acts[t].group_terms;
      extra[t] = _mm256_fmadd_ps(mins[0], _mm256_loadu_ps(terms + g0), extra[t]);
      extra[t] = _mm256_fmadd_ps(mins[1], _mm256_loadu_ps(terms + g0 + 8), extra[t]);
    }
  }
}

// gemv_rows<PRECISE, !MINS, 4, false> for a pass of rows of blocks, a row at a time, in gemv_rows' order.
template <bool PRECISE, bool MINS, bool FIFTH>
void gemv_q4(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
             const ActivationRow& a, int rows, float* out) {
  auto params = [&](const uint8_t* blocks, int64_t n, int64_t g0, __m256 sd[2], __m256& offsets) {
    __m256 mins[2];
    q4_params<MINS, FIFTH>(blocks, n, sd, mins);
    if (MINS) {
      offsets = _mm256_fmadd_ps(mins[0], _mm256_loadu_ps(a.group_terms + g0), offsets);
      offsets = _mm256_fmadd_ps(mins[1], _mm256_loadu_ps(a.group_terms + g0 + 8), offsets);
    }
  };
  auto half = [&](const uint8_t* row, int64_t c, int h) { return q4_half<MINS, FIFTH>(row, c, h, groups - 4 * c); };
  gemv_group_blocks<PRECISE, !MINS, 4, 4>(v, groups, chunks, L, a, rows, out, q4_block_bytes<MINS, FIFTH>(),
                                          kPrefetchBytes, params, half);
}

// panel_dots<PRECISE, !MINS, 4, false> for a pass of rows of blocks, in panel_dots' order.
template <bool PRECISE, bool MINS, bool FIFTH>
void panel_q4(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
              int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, FIFTH>();
  const HalfIndex& index = half_index(L.groups_per_chunk);
  __m256 block[kRowsPerPass][2];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, HalfCodes* w, __m256* s) {
    const int64_t j = c % (kGroupBlock / 4), g0 = (c - j) * 4;
    if (j == 0) {
      __m256 mins[2];
      q4_params<MINS, FIFTH>(row + g0 * kBytes, groups - g0, block[r], mins);
    }
    for (int h = 0; h < 2; ++h) {
      w[h] = q4_half<MINS, FIFTH>(row, c, h, groups - 4 * c);
      s[h] = to_lanes(block[r], index, j, h);
    }
  };
  auto offsets = [&](const uint8_t* row, const ActivationRow* acts_of, int64_t m, __m256* extra) {
    q4_1_offsets<FIFTH>(row, groups, acts_of, m, extra);
  };
  panel_blocks<PRECISE, !MINS, 4>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, offsets);
}

}  // namespace isa
}  // namespace
#endif
