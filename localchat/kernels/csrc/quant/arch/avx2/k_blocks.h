// Q4_K and Q5_K blocks on AVX2 (quant/generic/blocks.h describes the types).
#pragma once
#include "common.h"

#if LC_AVX2
namespace {
namespace isa {


// The sub-scales of blocks `block` and (when `two`) the next times their d, and their mins times their dmin, per half
// of 8 groups.
template <int BITS>
inline void k_blocks_params(const uint8_t* block, bool two, __m256 scales[2], __m256 mins[2]) {
  __m128i sub, min_bytes, halves;
  k_pair_params<BITS>(block, two, sub, min_bytes, halves);
  float supers[4];
  _mm_storeu_ps(supers, _mm_cvtph_ps(halves));
  scales[0] = _mm256_mul_ps(low_bytes_to_floats(sub), _mm256_set1_ps(supers[0]));
  scales[1] = _mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(sub, 8)), _mm256_set1_ps(supers[2]));
  mins[0] = _mm256_mul_ps(low_bytes_to_floats(min_bytes), _mm256_set1_ps(supers[1]));
  mins[1] = _mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(min_bytes, 8)), _mm256_set1_ps(supers[3]));
}

// The mins times the activation's group sums (terms: the pair's first group's) taken off `offsets`.
inline void take_mins(const __m256 mins[2], const float* terms, __m256& offsets) {
  offsets = _mm256_fnmadd_ps(mins[0], _mm256_loadu_ps(terms), offsets);
  offsets = _mm256_fnmadd_ps(mins[1], _mm256_loadu_ps(terms + 8), offsets);
}

// block_scales<true> for the 16 groups of blocks `block` and, when `two`, the next: their scales per half of 8
// groups, and with `offsets` their mins times the activation's group sums (terms: the first group's) taken off it.
template <int BITS>
inline void k_blocks_scales(const uint8_t* block, bool two, __m256 out[2], const float* terms = nullptr,
                            __m256* offsets = nullptr) {
  __m256 mins[2];
  k_blocks_params<BITS>(block, two, out, mins);
  if (offsets) take_mins(mins, terms, *offsets);
}

// Vector half h of half hc of a block as unpack_half<4> gives a u4 chunk's: its 32 bytes hold groups 2h and 2h + 1
// of the half (4hc + 2h and 4hc + 2h + 1 of the block) in their low and high nibbles, 32 weights each. Q5_K's
// fifth bits of weights 0-15 (lo) and 16-31 (hi) come from its high-bit bytes 0-15 and 16-31.
template <int BITS>
inline HalfCodes k_blocks_half(const uint8_t* block, int hc, int h) {
  const __m256i raw =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + k_block_codes<BITS>() + 64 * hc + 32 * h));
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i low = _mm256_and_si256(raw, low_mask);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
  HalfCodes w;
  w.lo = _mm256_permute2x128_si256(low, high, 0x20);  // weights 0-15 of both groups
  w.hi = _mm256_permute2x128_si256(low, high, 0x31);  // weights 16-31
  if (BITS == 5) {
    const int g = 4 * hc + 2 * h;
    const __m256i bits = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(1 << (g + 1))), _mm_set1_epi8(static_cast<char>(1 << g)));
    const __m128i* top = reinterpret_cast<const __m128i*>(block + kQ5KHighBits);
    auto fifth = [&](const __m128i* p) {  // 16 where the byte's bit for its lane's group is set
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128(p)), bits), bits);
      return _mm256_and_si256(set, _mm256_set1_epi8(16));
    };
    w.lo = _mm256_or_si256(w.lo, fifth(top));
    w.hi = _mm256_or_si256(w.hi, fifth(top + 1));
  }
  return w;
}

// row_offsets<false, true> of a row of blocks against activation rows acts[0 .. mt), into extra[t]: each pair of
// blocks' mins formed once, taken off every row's offsets as k_blocks_scales takes them.
template <int BITS>
inline void k_blocks_offsets(const uint8_t* row, int64_t blocks, const ActivationRow* acts, int64_t mt,
                             __m256* extra) {
  for (int64_t t = 0; t < mt; ++t) extra[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    __m256 scales[2], mins[2];
    k_blocks_params<BITS>(row + b * k_block_bytes<BITS>(), b + 1 < blocks, scales, mins);
    for (int64_t t = 0; t < mt; ++t) take_mins(mins, acts[t].group_terms + 8 * b, extra[t]);
  }
}

// gemv_rows for a pass of rows of blocks (v: row-major, row_step the row's bytes), a row at a time, in gemv_rows'
// order.
template <bool PRECISE, int BITS>
void gemv_k_blocks(const PassView& v, int64_t, int64_t, int64_t chunks, int64_t, const Layout& L,
                   const ActivationRow& a, int rows, float* out) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  const int64_t blocks = chunks / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m256 acc = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b += 2) {
      const uint8_t* block = row + b * k_block_bytes<BITS>();
      prefetch_k_blocks_ahead<BITS>(block);
      const bool two = b + 1 < blocks;
      const int64_t g0 = 8 * b;
      __m256 sd[2];
      k_blocks_scales<BITS>(block, two, sd, a.group_terms + g0, &offsets);
      times_activation_scales(sd, a, g0);
      const BlockLanes<4> lanes(sd, index);
      for (int j = 0; j < (two ? 4 : 2); ++j) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const HalfCodes w = k_blocks_half<BITS>(block + j / 2 * k_block_bytes<BITS>(), j % 2, h);
          const __m256i dot = lane_dots<PRECISE, false, 4>(w, h, a, 2 * b + j, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lanes.at(j, h), acc);
        }
      }
    }
    out[r] = finish_row<false>(acc, offsets);
  }
}

// panel_dots for a pass of rows of blocks, in panel_dots' order.
template <bool PRECISE, int BITS>
void panel_k_blocks(const PassView& v, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
                    int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  const int64_t blocks = chunks / 2;
  __m256 scales[kRowsPerPass][2];
  auto chunk = [&](int r, const uint8_t* row, int64_t c, HalfCodes* w, __m256* s) {
    const int64_t j = c % 4, b = c / 2;
    const uint8_t* block = row + b * k_block_bytes<BITS>();
    if (j == 0) k_blocks_scales<BITS>(block, b + 1 < blocks, scales[r]);
    for (int h = 0; h < 2; ++h) {
      w[h] = k_blocks_half<BITS>(block, static_cast<int>(c % 2), h);
      s[h] = to_lanes(scales[r], index, j, h);
    }
  };
  auto offsets = [&](const uint8_t* row, const ActivationRow* rows_of, int64_t m, __m256* extra) {
    k_blocks_offsets<BITS>(row, blocks, rows_of, m, extra);
  };
  panel_blocks<PRECISE, false, 4>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, offsets);
}

}  // namespace isa
}  // namespace
#endif
