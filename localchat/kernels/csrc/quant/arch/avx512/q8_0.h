// Q8_0 blocks on AVX-512 VNNI (quant/generic/blocks.h describes the type).
#pragma once
#include "common.h"

#if LC_VNNI
namespace {
namespace isa {


// The scales of the n (at most 16) blocks from `block` as floats, zero past them.
inline __m512 q8_0_scales(const uint8_t* block, int64_t n) {
  const __mmask16 mask = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(static_cast<int>(kQ8_0Bytes)));
  // (4 bytes from each block's start: its d and its first two codes, inside the block)
  const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, at, block, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
}

// Chunk c of a row as unpack_chunk<8> gives a u8 chunk: the codes + 128 of groups 2c and 2c + 1 (a missing second
// group zero, as u8's masked load leaves it).
inline __m512i q8_0_chunk(const uint8_t* row, int64_t c, bool two) {
  const uint8_t* first = row + 2 * c * kQ8_0Bytes;
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8_0_codes(first)));
  const __m256i high = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8_0_codes(first + kQ8_0Bytes)))
                           : _mm256_set1_epi8(static_cast<char>(0x80));
  const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  return _mm512_xor_si512(codes, _mm512_set1_epi8(static_cast<char>(0x80)));
}

// gemv_rows<PRECISE, true, 8, false> for a pass of Q8_0 rows (v: row-major, row_step the row's bytes), a row at a
// time, in gemv_rows' order.
template <bool PRECISE>
void gemv_q8_0(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
               const ActivationRow& a, int rows, float* out) {
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
      prefetch_ahead(row + g0 * kQ8_0Bytes, kQ8_0PrefetchBytes, kQ8_0StepBytes);
      const __m512 sd = _mm512_mul_ps(q8_0_scales(row + g0 * kQ8_0Bytes, groups - g0), _mm512_loadu_ps(a.group_scales + g0));
      const int64_t c0 = g0 / 2, c1 = std::min(chunks, c0 + kGroupBlock / 2);
      for (int64_t c = c0; c < c1; ++c) {
        const ActivationChunk chunk = load_chunk<PRECISE, true, 8>(a, c, L);
        const __m512i codes = q8_0_chunk(row, c, 2 * c + 1 < groups);
        const __m512 lane_sd = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex2.lanes[c - c0]), sd);
        acc = accumulate_scaled<PRECISE, true, 8>(codes, codes, lane_sd, chunk, acc);
      }
    }
    out[r] = _mm512_reduce_add_ps(acc);
  }
}

// panel_dots<PRECISE, true, 8, false> for a pass of Q8_0 rows.
template <bool PRECISE>
void panel_q8_0(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
                int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);  // each lane's group
  auto chunk = [&](int, const uint8_t* row, int64_t c, __m512i& lo, __m512i& hi, __m512& s) {
    const bool two = 2 * c + 1 < groups;
    lo = hi = q8_0_chunk(row, c, two);
    s = _mm512_permutexvar_ps(halves, q8_0_scales(row + 2 * c * kQ8_0Bytes, two ? 2 : 1));
  };
  panel_blocks<PRECISE, true, 8>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, kNoOffsets);
}

}  // namespace isa
}  // namespace
#endif
