// Q6_K weights read in the GGUF file's own blocks (arrangement kQ6KBlocks, PackedWeight layout "q6k"): the weight
// stays in the file's memory map, so loading neither copies nor repacks it, and a decode reads 210 bytes per 256
// weights instead of u6's 224.
//
// A block holds 256 weights: ql (128 bytes of low nibbles), qh (64 bytes of top bits), 16 int8 sub-scales (one per
// group of 16) and the float16 super-scale d. Each half (128 weights) of ql and qh is stored as a u6 chunk's two
// planes are (six_bit_codes), except that a u6 chunk's low nibbles hold weights i and i + 8 of each group of 16 in
// one byte, so that every dot-product lane meets one group, where ql holds weights j and j + 64. One 64-bit
// permutation per vector turns the block's codes into u6's order, and from there the kernels run u6's operations:
// the same activation layout, and each group's scale d * sub-scale rounded to float16 as the repack rounds it for
// u6. A product of the two layouts is the same bit for bit.
#pragma once

#if LC_SIMD
namespace {

// The GEMV reads a pass's rows one after the other: the rows are contiguous, so that is one stream, which it prefetches
// this many blocks ahead. Measured on the Zen 5 EPYC (2026-12-05, one process, alternating, Q6_K weights from DRAM,
// 2 threads): a pass's four rows read side by side (four streams) took 1.20-1.26 ms for a 4096 x 14336 weight
// where row by row took 0.98-1.02 (u6 interleaved: 1.24-1.28); 16 blocks ahead was slower on that shape than
// 24-48.
constexpr int64_t kQ6KPrefetchBlocks = 32;

// Prefetch the cache lines of `bytes` bytes from `distance` bytes past p, in a stream of blocks (past a weight's end:
// harmless).
inline void prefetch_ahead(const uint8_t* p, int64_t distance, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + distance + line);
}

inline void prefetch_q6k_ahead(const uint8_t* block) { prefetch_ahead(block, kQ6KPrefetchBlocks * kQ6KBytes, kQ6KBytes); }

inline float q6k_super_scale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block + kQ6KSuperScale, 2);
  return _cvtsh_ss(d);
}

}  // namespace
#endif

#if LC_VNNI
namespace {

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
  __m512* acc = static_cast<__m512*>(scratch);
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm512_setzero_ps();
  __m512 scales[kRowsPerPass];
  for (int64_t c = 0; c < chunks; ++c) {
    const int h = static_cast<int>(c % 2);
    const __m512i lanes = _mm512_load_si512(kChunkIndex8.lanes[h]);
    __m512i lo[kRowsPerPass], hi[kRowsPerPass];
    __m512 s[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) {
      const uint8_t* block = v.w + (r < rows ? r : 0) * v.row_step + c / 2 * kQ6KBytes;  // a short pass repeats row 0
      if (h == 0) scales[r] = q6k_scales(block);
      q6k_chunk(block, h, lo[r], hi[r]);
      s[r] = _mm512_permutexvar_ps(lanes, scales[r]);
    }
    panel_chunk<PRECISE, true, 6>(lo, hi, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) out[t * out_stride + r] = _mm512_reduce_add_ps(acc[t * kRowsPerPass + r]);
  }
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

}  // namespace
#elif LC_AVX2
namespace {

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
      for (int hc = 0; hc < 2; ++hc) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i dot = lane_dots<PRECISE, true, 6>(q6k_half(block, hc, h), h, a, 2 * b + hc, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), to_lanes(sd, index, hc, h), acc);
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
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  __m256 scales[kRowsPerPass][2];
  for (int64_t c = 0; c < chunks; ++c) {
    const int hc = static_cast<int>(c % 2);
    HalfCodes w[kRowsPerPass][2];
    __m256 s[kRowsPerPass][2];
    for (int r = 0; r < kRowsPerPass; ++r) {
      const uint8_t* block = v.w + (r < rows ? r : 0) * v.row_step + c / 2 * kQ6KBytes;
      if (hc == 0) q6k_scales(block, scales[r]);
      for (int h = 0; h < 2; ++h) {
        w[r][h] = q6k_half(block, hc, h);
        s[r][h] = to_lanes(scales[r], index, hc, h);
      }
    }
    panel_chunk<PRECISE, true, 6>(w, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) out[t * out_stride + r] = finish_row<true>(acc[t * kRowsPerPass + r], _mm256_setzero_ps());
  }
}

}  // namespace
#endif

#if !LC_VNNI
namespace {

// A Q6_K row's group scales as floats, `groups` of them: d * sub-scale rounded to float16 as u6 stores it (the
// AVX-512 build's q6k_row_scales, a group at a time).
inline void q6k_row_scales(const uint8_t* row, int64_t groups, float* scales) {
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* block = row + g / kGroupBlock * kQ6KBytes;
    uint16_t d;
    std::memcpy(&d, block + kQ6KSuperScale, 2);
    const float sub = static_cast<float>(static_cast<int8_t>(block[kQ6KSubScales + g % kGroupBlock]));
    scales[g] = half_to_float(at::Half(half_to_float(at::Half(d, at::Half::from_bits())) * sub));
  }
}

}  // namespace
#endif
