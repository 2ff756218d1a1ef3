// Q4_0, Q4_1, Q5_0 and Q5_1 weights read in the GGUF file's own blocks (arrangements kQ4_0Blocks, kQ4_1Blocks,
// kQ5_0Blocks and kQ5_1Blocks, PackedWeight layouts "q4_0", "q4_1", "q5_0" and "q5_1"): the weight stays in the file's
// memory map, so loading neither copies nor repacks it.
//
// A block is one group of 32 weights: its float16 scale d (Q4_1, Q5_1: then its float16 min m), Q5's 32 fifth bits
// (bit j for weight j), then 16 bytes whose byte j holds weight j in its low nibble and weight j + 16 in its high one.
// Those are a u4 group's bytes, so a u4 chunk (4 groups) is the codes of 4 blocks side by side, one per 128-bit lane;
// Q5's fifth bits join them in registers (16 added where a bit is set), as Q5_K's do. The kernels read the scales
// (and mins) from the blocks and run u4's operations in u4's order: symmetric around 8 (Q4_0) or 16 (Q5_0), with the
// mins against the activation's group sums for Q4_1 and Q5_1. A Q4 product equals the u4 repack's bit for bit; a Q5
// one the u8 repack's up to float rounding (the same integer products, summed in other lanes).
#pragma once

#if LC_SIMD
namespace {

// A block's bytes, where its fifth bits (FIFTH: Q5) and its codes start, without (Q4_0, Q5_0) or with (Q4_1, Q5_1)
// mins.
template <bool MINS>
constexpr int64_t q4_block_high() { return MINS ? 4 : 2; }
template <bool MINS, bool FIFTH>
constexpr int64_t q4_block_codes() { return q4_block_high<MINS>() + (FIFTH ? 4 : 0); }
template <bool MINS, bool FIFTH>
constexpr int64_t q4_block_bytes() { return q4_block_codes<MINS, FIFTH>() + 16; }
static_assert(q4_block_bytes<false, false>() == kQ4_0Bytes && q4_block_bytes<true, false>() == kQ4_1Bytes &&
              q4_block_bytes<false, true>() == kQ5_0Bytes && q4_block_bytes<true, true>() == kQ5_1Bytes);

// The 16 code bytes of the block i of those from `first`, or zeros where i is past the n there (never, when the
// caller knows the chunk is WHOLE).
template <bool MINS, bool FIFTH, bool WHOLE = false>
inline __m128i q4_codes(const uint8_t* first, int i, int64_t n) {
  if (!WHOLE && i >= n) return _mm_setzero_si128();
  return _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(first + i * q4_block_bytes<MINS, FIFTH>() + q4_block_codes<MINS, FIFTH>()));
}

// The fifth bits of the blocks i0 and i0 + 1 of those from `first` (zero past the n there): bits 0-15 of each (its
// weights 0-15) side by side in the low 32 bits, bits 16-31 (weights 16-31) in the high 32.
template <bool MINS, bool WHOLE>
inline uint64_t q5_fifth_pair(const uint8_t* first, int i0, int64_t n) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, true>(), kHigh = q4_block_high<MINS>();
  uint32_t qh[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    if (WHOLE || i0 + i < n) std::memcpy(qh + i, first + (i0 + i) * kBytes + kHigh, 4);
  }
  return (qh[0] & 0xFFFFu) | (qh[1] & 0xFFFFu) << 16 | static_cast<uint64_t>((qh[0] >> 16) | (qh[1] >> 16) << 16) << 32;
}

}  // namespace
#endif

#if LC_VNNI
namespace {

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
// slowly than that repack, and a whole decode on two runs as fast (docs/benchmarks.md, twenty-sixth session).
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
  __m512* acc = static_cast<__m512*>(scratch);
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i quarters = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);  // each lane's group
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n = std::min<int64_t>(4, groups - 4 * c);
    __m512i lo[kRowsPerPass], hi[kRowsPerPass];
    __m512 s[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) {
      q4_chunk<MINS, FIFTH>(row(r), c, n, lo[r], hi[r]);
      __m128 scales, mins;
      q4_chunk_params<MINS, FIFTH>(row(r) + 4 * c * kBytes, n, scales, mins);
      s[r] = _mm512_permutexvar_ps(quarters, _mm512_castps128_ps512(scales));
    }
    panel_chunk<PRECISE, !MINS, 4>(lo, hi, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      __m512 total = acc[t * kRowsPerPass + r];
      if (MINS) total = _mm512_add_ps(total, q4_1_offsets<FIFTH>(row(r), groups, acts[t].group_terms));
      out[t * out_stride + r] = _mm512_reduce_add_ps(total);
    }
  }
}

}  // namespace
#elif LC_AVX2
namespace {

// block_scales<false> for the blocks from `block` (n of them left): the scales of groups 0-7 and 8-15, zero past
// them, and with MINS their mins likewise.
template <bool MINS, bool FIFTH>
inline void q4_params(const uint8_t* block, int64_t n, __m256 scales[2], __m256 mins[2]) {
  alignas(16) uint16_t d[kGroupBlock] = {}, m[kGroupBlock] = {};
  for (int64_t i = 0; i < std::min<int64_t>(n, kGroupBlock); ++i) {
    std::memcpy(d + i, block + i * q4_block_bytes<MINS, FIFTH>(), 2);
    if (MINS) std::memcpy(m + i, block + i * q4_block_bytes<MINS, FIFTH>() + 2, 2);
  }
  scales[0] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
  scales[1] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d + 8)));
  if (MINS) {
    mins[0] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(m)));
    mins[1] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(m + 8)));
  }
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

// row_offsets<false, false> of a row of Q4_1 or (FIFTH) Q5_1 blocks: the mins' lanes, in the same order.
template <bool FIFTH>
inline __m256 q4_1_offsets(const uint8_t* row, int64_t groups, const float* terms) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
    __m256 scales[2], mins[2];
    q4_params<true, FIFTH>(row + g0 * q4_block_bytes<true, FIFTH>(), groups - g0, scales, mins);
    acc = _mm256_fmadd_ps(mins[0], _mm256_loadu_ps(terms + g0), acc);
    acc = _mm256_fmadd_ps(mins[1], _mm256_loadu_ps(terms + g0 + 8), acc);
  }
  return acc;
}

// gemv_rows<PRECISE, !MINS, 4, false> for a pass of rows of blocks, a row at a time, in gemv_rows' order.
template <bool PRECISE, bool MINS, bool FIFTH>
void gemv_q4(const PassView& v, int64_t, int64_t groups, int64_t chunks, int64_t, const Layout& L,
             const ActivationRow& a, int rows, float* out) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, FIFTH>();
  const HalfIndex& index = half_index(L.groups_per_chunk);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m256 acc = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
      prefetch_ahead(row + g0 * kBytes, kPrefetchBytes, kGroupBlock * kBytes);
      __m256 sd[2], mins[2];
      q4_params<MINS, FIFTH>(row + g0 * kBytes, groups - g0, sd, mins);
      if (MINS) {
        offsets = _mm256_fmadd_ps(mins[0], _mm256_loadu_ps(a.group_terms + g0), offsets);
        offsets = _mm256_fmadd_ps(mins[1], _mm256_loadu_ps(a.group_terms + g0 + 8), offsets);
      }
      times_activation_scales(sd, a, g0);
      const int64_t c0 = g0 / 4, c1 = std::min(chunks, c0 + kGroupBlock / 4);
      for (int64_t c = c0; c < c1; ++c) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i dot = lane_dots<PRECISE, !MINS, 4>(q4_half<MINS, FIFTH>(row, c, h, groups - 4 * c), h, a, c, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), to_lanes(sd, index, c - c0, h), acc);
        }
      }
    }
    out[r] = finish_row<!MINS>(acc, offsets);
  }
}

// panel_dots<PRECISE, !MINS, 4, false> for a pass of rows of blocks, in panel_dots' order.
template <bool PRECISE, bool MINS, bool FIFTH>
void panel_q4(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
              int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, FIFTH>();
  const HalfIndex& index = half_index(L.groups_per_chunk);
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  __m256 block[kRowsPerPass][2];
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j = c % (kGroupBlock / 4), g0 = (c - j) * 4;
    HalfCodes w[kRowsPerPass][2];
    __m256 s[kRowsPerPass][2];
    for (int r = 0; r < kRowsPerPass; ++r) {
      if (j == 0) {
        __m256 mins[2];
        q4_params<MINS, FIFTH>(row(r) + g0 * kBytes, groups - g0, block[r], mins);
      }
      for (int h = 0; h < 2; ++h) {
        w[r][h] = q4_half<MINS, FIFTH>(row(r), c, h, groups - 4 * c);
        s[r][h] = to_lanes(block[r], index, j, h);
      }
    }
    panel_chunk<PRECISE, !MINS, 4>(w, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const __m256 offsets = MINS ? q4_1_offsets<FIFTH>(row(r), groups, acts[t].group_terms) : _mm256_setzero_ps();
      out[t * out_stride + r] = finish_row<!MINS>(acc[t * kRowsPerPass + r], offsets);
    }
  }
}

}  // namespace
#endif

namespace {

// A Q5_0 or (MINS) Q5_1 block's 32 codes (0-31), a byte each, into out: its low nibbles with its fifth bits added.
inline void q5_block_codes(const uint8_t* block, bool with_mins, uint8_t* out) {
  const int64_t high = with_mins ? 4 : 2;
  uint32_t qh;
  std::memcpy(&qh, block + high, 4);
  const uint8_t* qs = block + high + 4;
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<uint8_t>((qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
    out[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}

// A row of K weights in Q4_0 or Q4_1 blocks as a row-major u4 row (K / 2 bytes: the blocks' codes as they are), or in
// Q5_0 or Q5_1 blocks as a u8 row (K bytes, codes 0-31), with each group's scale and (Q4_1, Q5_1) min as floats:
// what dequantize_row reads (Q4_0 with zero point 8, Q5_0 with 16). Returns whether the codes are u8.
inline bool q4_row(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins) {
  const bool with_mins = L.block_mins(), fifth = L.file == kQ5_0Blocks || L.file == kQ5_1Blocks;
  const int64_t bytes = L.block_bytes();
  for (int64_t g = 0; g < K / kActBlock; ++g) {
    const uint8_t* block = row + g * bytes;
    uint16_t halves[2];
    std::memcpy(halves, block, 4);
    scales[g] = half_to_float(at::Half(halves[0], at::Half::from_bits()));
    if (with_mins) mins[g] = half_to_float(at::Half(halves[1], at::Half::from_bits()));
    if (fifth) q5_block_codes(block, with_mins, codes + g * 32);
    else std::memcpy(codes + g * 16, block + (with_mins ? 4 : 2), 16);
  }
  return fifth;
}

}  // namespace
