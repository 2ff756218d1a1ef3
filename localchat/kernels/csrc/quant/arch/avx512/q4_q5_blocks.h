// Q4_0, Q4_1, Q5_0 and Q5_1 blocks on AVX-512 VNNI (quant/generic/blocks.h describes the types).
#pragma once
#include "common.h"

#if LC_VNNI
namespace {
namespace isa {


// The scales d and (MINS) the mins m of the n (at most 16) blocks from `block` as floats, zero past them.
template <bool MINS, bool FIFTH>
inline void q4_params(const uint8_t* block, int64_t n, __m512& scales, __m512& mins) {
  const __mmask16 mask = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(static_cast<int>(q4_block_bytes<MINS, FIFTH>())));
  // (4 bytes from each block's start: d and m, or d and the next two bytes, inside the block)
  const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, at, block, 1);
  scales = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
  if (MINS) mins = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16)));
}

// The scales and (MINS) mins of the n (at most 4) blocks from `first`, lanes 0-3, zero past them: q4_params for one
// chunk, without a gather.
template <bool MINS, bool FIFTH>
inline void q4_chunk_params(const uint8_t* first, int64_t n, __m128& scales, __m128& mins) {
  int32_t word[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4; ++i) {
    if (i < n) std::memcpy(word + i, first + i * q4_block_bytes<MINS, FIFTH>(), 4);
  }
  const __m128i words = _mm_setr_epi32(word[0], word[1], word[2], word[3]);
  scales = _mm_cvtph_ps(_mm_cvtepi32_epi16(words));
  if (MINS) mins = _mm_cvtph_ps(_mm_cvtepi32_epi16(_mm_srli_epi32(words, 16)));
}

// Chunk c of a row (groups 4c .. 4c + 3, n of them there) as unpack_chunk<4> gives a u4 chunk (Q5: with the fifth
// bits, codes 0-31).
template <bool MINS, bool FIFTH, bool WHOLE>
inline void q4_chunk_as(const uint8_t* row, int64_t c, int64_t n, __m512i& lo, __m512i& hi) {
  const uint8_t* first = row + 4 * c * q4_block_bytes<MINS, FIFTH>();
  const __m256i low =
      _mm256_set_m128i(q4_codes<MINS, FIFTH, WHOLE>(first, 1, n), q4_codes<MINS, FIFTH, WHOLE>(first, 0, n));
  const __m256i high =
      _mm256_set_m128i(q4_codes<MINS, FIFTH, WHOLE>(first, 3, n), q4_codes<MINS, FIFTH, WHOLE>(first, 2, n));
  const __m512i raw = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(raw, low_mask);
  hi = high_nibbles(raw, low_mask);
  if (FIFTH) {  // byte 16b + j of lo is weight j of block b, of hi its weight j + 16: bit j (j + 16) of b's fifth bits
    const uint64_t pair0 = q5_fifth_pair<MINS, WHOLE>(first, 0, n), pair1 = q5_fifth_pair<MINS, WHOLE>(first, 2, n);
    const __m512i sixteen = _mm512_set1_epi8(16);
    lo = _mm512_mask_add_epi8(lo, (pair0 & 0xFFFFFFFFu) | pair1 << 32, lo, sixteen);
    hi = _mm512_mask_add_epi8(hi, pair0 >> 32 | (pair1 >> 32) << 32, hi, sixteen);
  }
}

template <bool MINS, bool FIFTH>
inline void q4_chunk(const uint8_t* row, int64_t c, int64_t n, __m512i& lo, __m512i& hi) {
  if (n >= 4) q4_chunk_as<MINS, FIFTH, true>(row, c, n, lo, hi);
  else q4_chunk_as<MINS, FIFTH, false>(row, c, n, lo, hi);
}

#if defined(__AVX512VBMI__)
// With AVX-512 VBMI (Zen 4 and later, Intel since Ice Lake) the GEMV reads a row's blocks 16 at a time (288 or 320
// bytes) in five 64-byte loads, and byte permutes (vpermt2b: any 64 of two registers' 128 bytes) take each chunk's
// codes and the 16 blocks' scales (and mins) out of them: no gather, no 16-byte loads. Measured on the Zen 5 EPYC
// (2026-12-05, one thread, a 1024 x 4096 Q4_0 GEMV in cache): 51.5 us, against 81.8 with a gather for the scales and
// 16-byte loads for the codes, and 57.4 for the interleaved u4 repack; from DRAM on one thread it reads 5-10 % more
// slowly than that repack, and a whole decode on two runs as fast (docs/benchmarks-history.md).
struct Q4Permutes {
  alignas(64) uint8_t codes[4][64];   // chunk j's 64 code bytes from registers j and j + 1
  alignas(64) uint8_t params[3][64];  // the scales (Q4_1: scale and min, a 32-bit word a block) from registers 0-1,
                                      // 2-3 and 4
  __mmask64 from[3];                  // which of the params' bytes come from each
  explicit Q4Permutes(int bytes, int first_code, int param_bytes) {
    for (int j = 0; j < 4; ++j) {
      for (int q = 0; q < 4; ++q) {
        for (int t = 0; t < 16; ++t) codes[j][16 * q + t] = static_cast<uint8_t>(bytes * (4 * j + q) + first_code + t - 64 * j);
      }
    }
    std::memset(params, 0, sizeof(params));
    for (int i = 0; i < 3; ++i) from[i] = 0;
    for (int p = 0; p < 16 * param_bytes; ++p) {
      const int at = bytes * (p / param_bytes) + p % param_bytes;
      const int source = at < 128 ? 0 : at < 256 ? 1 : 2;  // (each byte from wherever it lies)
      params[source][p] = static_cast<uint8_t>(at - 128 * source);
      from[source] |= __mmask64{1} << p;
    }
  }
};
const Q4Permutes kQ4_0Permutes(kQ4_0Bytes, 2, 2), kQ4_1Permutes(kQ4_1Bytes, 4, 4);

// The five 64-byte loads of up to 16 blocks from `block` (n of them there, all 16 when WHOLE), zero past them.
template <bool MINS, bool WHOLE>
inline void q4_load_blocks(const uint8_t* block, int64_t n, __m512i r[5]) {
  if (WHOLE) {
    for (int i = 0; i < 4; ++i) r[i] = _mm512_loadu_si512(block + 64 * i);
    // Q4_0's 16 blocks end 32 bytes into the fifth: a 32-byte load, not a masked one. A masked load that misses
    // the caches is slow: on the Zen 5 EPYC (2026-12-05, two engines in one process, alternating) the 8B Q4_0
    // decode took 81.9 ms a token with it and 73.3 without, where the u4 repack took 74.7 and 74.3.
    r[4] = MINS ? _mm512_loadu_si512(block + 256)
                : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 256)));
    return;
  }
  const int64_t span = std::min<int64_t>(n, kGroupBlock) * q4_block_bytes<MINS, false>();
  for (int i = 0; i < 5; ++i) {
    const int64_t left = span - 64 * i;
    r[i] = _mm512_maskz_loadu_epi8(left >= 64 ? ~0ULL : left > 0 ? (1ULL << left) - 1 : 0, block + 64 * i);
  }
}

// q4_params from the five registers of q4_load_blocks.
template <bool MINS>
inline void q4_loaded_params(const __m512i r[5], __m512& scales, __m512& mins) {
  const Q4Permutes& P = MINS ? kQ4_1Permutes : kQ4_0Permutes;
  auto index = [&](int i) { return _mm512_load_si512(P.params[i]); };
  __m512i words = _mm512_permutex2var_epi8(r[0], index(0), r[1]);
  words = _mm512_mask_mov_epi8(words, P.from[1], _mm512_permutex2var_epi8(r[2], index(1), r[3]));
  words = _mm512_mask_mov_epi8(words, P.from[2], _mm512_permutexvar_epi8(index(2), r[4]));
  if (MINS) {
    scales = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
    mins = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16)));
  } else {
    scales = _mm512_cvtph_ps(_mm512_castsi512_si256(words));
  }
}

// Chunk j (0-3) of the blocks in the five registers as q4_chunk gives it.
template <bool MINS>
inline void q4_loaded_chunk(const __m512i r[5], int j, __m512i& lo, __m512i& hi) {
  const Q4Permutes& P = MINS ? kQ4_1Permutes : kQ4_0Permutes;
  const __m512i raw = _mm512_permutex2var_epi8(r[j], _mm512_load_si512(P.codes[j]), r[j + 1]);
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(raw, low_mask);
  hi = high_nibbles(raw, low_mask);
}
#endif

// offset_lanes<false> of a row of Q4_1 or (FIFTH) Q5_1 blocks: its mins times the activation group sums (terms), 16
// groups at a time from zero.
template <bool FIFTH>
inline __m512 q4_1_offsets(const uint8_t* row, int64_t groups, const float* terms) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
    const int64_t left = groups - g0;
    const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    __m512 scales, mins;
    q4_params<true, FIFTH>(row + g0 * q4_block_bytes<true, FIFTH>(), left, scales, mins);
    acc = _mm512_fmadd_ps(mins, _mm512_maskz_loadu_ps(mask, terms + g0), acc);
  }
  return acc;
}

// gemv_q4's step over the kGroupBlock groups from g0 of a row (WHOLE: all 16 there). Q5's blocks (22 or 24 bytes)
// take the gather and 16-byte loads where Q4's take VBMI's permutes.
template <bool PRECISE, bool MINS, bool FIFTH, bool WHOLE>
inline void gemv_q4_step(const uint8_t* row, int64_t g0, int64_t groups, int64_t chunks, const Layout& L,
                         const ActivationRow& a, __m512& acc, __m512& offsets) {
  const uint8_t* blocks = row + g0 * q4_block_bytes<MINS, FIFTH>();
  const int64_t left = groups - g0;
  __m512 scales, mins;
#if defined(__AVX512VBMI__)
  __m512i loaded[5];
  if constexpr (!FIFTH) {
    q4_load_blocks<MINS, WHOLE>(blocks, left, loaded);
    q4_loaded_params<MINS>(loaded, scales, mins);
  } else {
    q4_params<MINS, FIFTH>(blocks, left, scales, mins);
  }
#else
  q4_params<MINS, FIFTH>(blocks, left, scales, mins);
#endif
  const __m512 sd = _mm512_mul_ps(scales, _mm512_loadu_ps(a.group_scales + g0));
  if (MINS) {
    const __mmask16 mask = WHOLE || left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    offsets = _mm512_fmadd_ps(mins, _mm512_maskz_loadu_ps(mask, a.group_terms + g0), offsets);
  }
  const int64_t c0 = g0 / 4, n = WHOLE ? 4 : std::min<int64_t>(chunks - c0, 4);
#pragma GCC unroll 4
  for (int j = 0; j < n; ++j) {
    const ActivationChunk chunk = load_chunk<PRECISE, !MINS, 4>(a, c0 + j, L);
    __m512i lo, hi;
#if defined(__AVX512VBMI__)
    if constexpr (!FIFTH) q4_loaded_chunk<MINS>(loaded, j, lo, hi);
    else q4_chunk<MINS, FIFTH>(row, c0 + j, groups - 4 * (c0 + j), lo, hi);
#else
    q4_chunk<MINS, FIFTH>(row, c0 + j, groups - 4 * (c0 + j), lo, hi);
#endif
    const __m512 lane_sd = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex4.lanes[j]), sd);
    acc = accumulate_scaled<PRECISE, !MINS, 4>(lo, hi, lane_sd, chunk, acc);
  }
}

// gemv_rows<PRECISE, !MINS, 4, false> for a pass of rows of blocks (v: row-major, row_step the row's bytes), a row
// at a time, in gemv_rows' order (a Q4_1 row's mins into their own lanes, as offset_lanes forms them).
template <bool PRECISE, bool MINS, bool FIFTH>
void gemv_q4(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
             const ActivationRow& a, int rows, float* out) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, FIFTH>();
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m512 acc = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();
    int64_t g0 = 0;
    for (; g0 + kGroupBlock <= groups; g0 += kGroupBlock) {
      prefetch_ahead(row + g0 * kBytes, kPrefetchBytes, kGroupBlock * kBytes);
      gemv_q4_step<PRECISE, MINS, FIFTH, true>(row, g0, groups, chunks, L, a, acc, offsets);
    }
    if (g0 < groups) gemv_q4_step<PRECISE, MINS, FIFTH, false>(row, g0, groups, chunks, L, a, acc, offsets);
    out[r] = _mm512_reduce_add_ps(MINS ? _mm512_add_ps(acc, offsets) : acc);
  }
}

// panel_dots<PRECISE, !MINS, 4, false> for a pass of rows of blocks.
template <bool PRECISE, bool MINS, bool FIFTH>
void panel_q4(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
              int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, FIFTH>();
  const __m512i quarters = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);  // each lane's group
  auto chunk = [&](int, const uint8_t* row, int64_t c, __m512i& lo, __m512i& hi, __m512& s) {
    const int64_t n = std::min<int64_t>(4, groups - 4 * c);
    q4_chunk<MINS, FIFTH>(row, c, n, lo, hi);
    __m128 scales, mins;
    q4_chunk_params<MINS, FIFTH>(row + 4 * c * kBytes, n, scales, mins);
    s = _mm512_permutexvar_ps(quarters, _mm512_castps128_ps512(scales));
  };
  auto offsets = [&](const uint8_t* row, const ActivationRow& a) {
    return q4_1_offsets<FIFTH>(row, groups, a.group_terms);
  };
  panel_blocks<PRECISE, !MINS, 4>(v, chunks, L, acts, mt, rows, out, out_stride, scratch, chunk, offsets);
}

}  // namespace isa
}  // namespace
#endif
