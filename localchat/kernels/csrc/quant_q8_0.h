// Q8_0 weights read in the GGUF file's own blocks (arrangement kQ8_0Blocks, PackedWeight layout "q8_0"): the weight
// stays in the file's memory map, so loading neither copies nor repacks it.
//
// A block is one group of 32 weights: its float16 scale d, then 32 int8 codes. The u8 repack stores code + 128 in a
// byte and the scales apart, with zero point 128; here the kernels flip each code's top bit as they load it (that
// is code + 128) and read the scales from the blocks, then run u8's operations in u8's order, so a product equals
// the u8 weight's bit for bit. (AVX2 takes int8 codes as they are: its u8 kernels turn code + 128 back into them.)
#pragma once

#if LC_SIMD
namespace {

// Bytes ahead of the GEMV's row-by-row stream that it prefetches (about 4 KiB, as kPrefetchBytes), and the bytes
// of the kGroupBlock groups each step reads.
constexpr int64_t kQ8_0PrefetchBytes = 128 * kQ8_0Bytes, kQ8_0StepBytes = kGroupBlock * kQ8_0Bytes;

// The 32 codes of the block `block` (int8).
inline const uint8_t* q8_0_codes(const uint8_t* block) { return block + 2; }

}  // namespace
#endif

#if LC_VNNI
namespace {

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
  __m512* acc = static_cast<__m512*>(scratch);
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);  // each lane's group
  for (int64_t c = 0; c < chunks; ++c) {
    const bool two = 2 * c + 1 < groups;
    __m512i codes[kRowsPerPass];
    __m512 s[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) {
      const uint8_t* row = v.w + (r < rows ? r : 0) * v.row_step;  // a short pass repeats row 0
      codes[r] = q8_0_chunk(row, c, two);
      s[r] = _mm512_permutexvar_ps(halves, q8_0_scales(row + 2 * c * kQ8_0Bytes, two ? 2 : 1));
    }
    panel_chunk<PRECISE, true, 8>(codes, codes, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) out[t * out_stride + r] = _mm512_reduce_add_ps(acc[t * kRowsPerPass + r]);
  }
}

}  // namespace
#elif LC_AVX2
namespace {

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
  const HalfIndex& index = half_index(L.groups_per_chunk);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
      prefetch_ahead(row + g0 * kQ8_0Bytes, kQ8_0PrefetchBytes, kQ8_0StepBytes);
      __m256 sd[2];
      q8_0_scales(row + g0 * kQ8_0Bytes, groups - g0, sd);
      times_activation_scales(sd, a, g0);
      const int64_t c0 = g0 / 2, c1 = std::min(chunks, c0 + kGroupBlock / 2);
      for (int64_t c = c0; c < c1; ++c) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i dot = lane_dots<PRECISE, true, 8>(q8_0_half(row, c, h, groups), h, a, c, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), to_lanes(sd, index, c - c0, h), acc);
        }
      }
    }
    out[r] = finish_row<true>(acc, _mm256_setzero_ps());
  }
}

// panel_dots<PRECISE, true, 8, false> for a pass of Q8_0 rows.
template <bool PRECISE>
void panel_q8_0(const PassView& v, int64_t groups, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
                int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  __m256 block[kRowsPerPass][2];
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j = c % (kGroupBlock / 2), g0 = (c - j) * 2;
    HalfCodes w[kRowsPerPass][2];
    __m256 s[kRowsPerPass][2];
    for (int r = 0; r < kRowsPerPass; ++r) {
      const uint8_t* row = v.w + (r < rows ? r : 0) * v.row_step;  // a short pass repeats row 0
      if (j == 0) q8_0_scales(row + g0 * kQ8_0Bytes, groups - g0, block[r]);
      for (int h = 0; h < 2; ++h) {
        w[r][h] = q8_0_half(row, c, h, groups);
        s[r][h] = to_lanes(block[r], index, j, h);
      }
    }
    panel_chunk<PRECISE, true, 8>(w, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) out[t * out_stride + r] = finish_row<true>(acc[t * kRowsPerPass + r], _mm256_setzero_ps());
  }
}

}  // namespace
#endif

namespace {

// A row of K weights in Q8_0 blocks as a row-major u8 row (code + 128, K bytes) with each group's scale as a float:
// what dequantize_row reads (zero point 128).
inline void q8_0_row(const uint8_t* row, int64_t K, uint8_t* codes, float* scales) {
  for (int64_t g = 0; g < K / kActBlock; ++g) {
    const uint8_t* block = row + g * kQ8_0Bytes;
    uint16_t d;
    std::memcpy(&d, block, 2);
    scales[g] = half_to_float(at::Half(d, at::Half::from_bits()));
    for (int i = 0; i < kActBlock; ++i) codes[g * kActBlock + i] = static_cast<uint8_t>(block[2 + i] ^ 0x80);
  }
}

}  // namespace
