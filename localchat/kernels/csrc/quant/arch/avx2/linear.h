// The AVX2 kernels of the repacked layouts (u4, u6, u8; row-major or interleaved): a decode's GEMV and a batch's
// panel.
#pragma once
#include "common.h"

#if LC_AVX2
namespace {
namespace isa {

// One activation row (a decode) against kRowsPerPass (or fewer) weight rows. Per block of kGroupBlock groups,
// each row's weight scales are multiplied by the activation's group scales once; each chunk's lanes pick
// theirs with one permute. Every lane of a row accumulates into one vector (the lanes are summed at the end).
template <bool PRECISE, bool SYMMETRIC, int BITS, bool KQ>
void gemv_rows(const PassView& v, int64_t w_row, int64_t groups, int64_t chunks, int64_t weight_bytes,
               const Layout& L, const ActivationRow& a, int rows, float* out) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  const int64_t top0 = weight_bytes / kChunkBytes;
  const int64_t chunks_per_block = kGroupBlock / L.groups_per_chunk;
  constexpr int64_t param_bytes = KQ ? 1 : 2;
  const int64_t min_bytes = KQ ? groups / 2 : groups * param_bytes;  // a row's (K-quants: half as wide)
  for (int64_t b = 0; b < rows * groups * param_bytes; b += 64) {
    __builtin_prefetch(static_cast<const char*>(v.s) + kPrefetchRows * groups * param_bytes + b);
  }
  for (int64_t b = 0; !SYMMETRIC && b < rows * min_bytes; b += 64) {
    __builtin_prefetch(static_cast<const char*>(v.m) + kPrefetchRows * min_bytes + b);
  }
  // all kRowsPerPass rows, whatever `rows` (a short pass repeats its first row, results not stored), so the loops
  // unroll and the accumulators stay in registers
  __m256 acc[kRowsPerPass], offsets[kRowsPerPass];  // the dot products' lanes, and (K-quants) the mins'
  for (int r = 0; r < kRowsPerPass; ++r) acc[r] = offsets[r] = _mm256_setzero_ps();
  for (int64_t c0 = 0; c0 < chunks; c0 += chunks_per_block) {
    const int64_t g0 = c0 * L.groups_per_chunk;
    const __m256 da[2] = {_mm256_loadu_ps(a.group_scales + g0), _mm256_loadu_ps(a.group_scales + g0 + 8)};
    __m256 sd[kRowsPerPass][2];
    pass_block_scales<KQ>(v, rows, g0, groups, sd, a.group_terms, offsets);
    for (int r = 0; r < kRowsPerPass; ++r) {
      sd[r][0] = _mm256_mul_ps(sd[r][0], da[0]);
      sd[r][1] = _mm256_mul_ps(sd[r][1], da[1]);
    }
    const int64_t c1 = std::min(chunks, c0 + chunks_per_block);
    for (int64_t c = c0; c < c1; ++c) {
#pragma GCC unroll 4
      for (int r = 0; r < kRowsPerPass; ++r) {
        const int rr = r < rows ? r : 0;
        __builtin_prefetch(v.codes(rr, c) + kPrefetchRows * w_row);
        if (BITS == 6 && (c & 1) == 0) __builtin_prefetch(v.codes(rr, top0 + c / 2) + kPrefetchRows * w_row);
      }
      // half by half, so one half's activation codes serve the four rows from registers
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
        for (int r = 0; r < kRowsPerPass; ++r) {
          const HalfCodes w = unpack_half<BITS>(v, r < rows ? r : 0, c, top0, weight_bytes - c * kChunkBytes, h);
          const __m256i dot = lane_dots<PRECISE, SYMMETRIC, BITS>(w, h, a, c, L);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), to_lanes(sd[r], index, c - c0, h), acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    if (!KQ) offsets[r] = row_offsets<SYMMETRIC, KQ>(v, r, a.group_terms, groups);
    out[r] = finish_row<SYMMETRIC>(acc[r], offsets[r]);
  }
}

// A block of activation rows against kRowsPerPass weight rows (batches, prefill chunks): each weight chunk is
// unpacked once and meets every row of the block, whose accumulators live in `scratch` (L1). A lane's scale is
// its weight scale permuted to it times its activation scale: the same product gemv_rows forms before its
// permute, so every (activation row, weight row) pair gets gemv_rows' result bit for bit.
template <bool PRECISE, bool SYMMETRIC, int BITS, bool KQ>
void panel_dots(const PassView& v, int64_t groups, int64_t chunks, int64_t weight_bytes, const Layout& L,
                const ActivationRow* acts, int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  const int64_t top0 = weight_bytes / kChunkBytes;
  const int64_t chunks_per_block = kGroupBlock / L.groups_per_chunk;
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  __m256 block[kRowsPerPass][2];
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j = c % chunks_per_block, g0 = (c - j) * L.groups_per_chunk;
    HalfCodes w[kRowsPerPass][2];
    __m256 s[kRowsPerPass][2];
    if (j == 0) pass_block_scales<KQ>(v, rows, g0, groups, block);
    for (int r = 0; r < kRowsPerPass; ++r) {
      const int rr = r < rows ? r : 0;  // a short pass repeats its first row (results not stored)
      for (int h = 0; h < 2; ++h) {
        w[r][h] = unpack_half<BITS>(v, rr, c, top0, weight_bytes - c * kChunkBytes, h);
        s[r][h] = to_lanes(block[r], index, j, h);
      }
    }
    panel_chunk<PRECISE, SYMMETRIC, BITS>(w, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      out[t * out_stride + r] = finish_row<SYMMETRIC>(acc[t * kRowsPerPass + r],
                                                      row_offsets<SYMMETRIC, KQ>(v, r, acts[t].group_terms, groups));
    }
  }
}


}  // namespace isa
}  // namespace
#endif
