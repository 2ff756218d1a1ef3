// Q4_K weights read in the GGUF file's own blocks (arrangement kQ4KBlocks, PackedWeight layout "q4k"): the weight
// stays in the file's memory map, so loading neither copies nor repacks it.
//
// A block holds 256 weights in 8 groups of 32: float16 d and dmin, 12 bytes of 6-bit sub-scales and sub-mins
// (ggml's get_scale_min_k4 packing), then 128 bytes of codes, 32 per pair of groups: byte j holds weight j of group
// 2i in its low nibble and weight j of group 2i + 1 in its high one. A u4 chunk's byte holds weights j and j + 16 of
// one group instead, so two 64-bit permutations per 128 weights turn a half block's nibbles into the vectors
// unpack_chunk<4> gives for u4. From there the kernels run u4's K-quant operations (quant_linear.h: the same
// activation layout, d * sub-scale and dmin * sub-min formed alike), and a product of the two layouts is the same
// bit for bit.
#pragma once

#if LC_SIMD
namespace {

// The GEMV reads a pass's rows one after the other (one stream, as quant_q6k.h's), prefetching this many blocks
// ahead. Measured on the Zen 5 EPYC (2026-12-05, one process, alternating, a 14336 x 4096 weight from DRAM): 36-38
// GB/s on one thread and 48-50 on two, where the interleaved u4 kernel read 31-32 and 43-45.
constexpr int64_t kQ4KPrefetchBlocks = 32;

// (the kernels step two blocks at a time)
inline void prefetch_q4k_ahead(const uint8_t* pair) {
  prefetch_ahead(pair, kQ4KPrefetchBlocks * kQ4KBytes, 2 * kQ4KBytes);
}

// The 8 sub-scales and 8 sub-mins of a Q4_K block, a byte each (group q in byte q), from its 12 packed bytes:
// groups 0-3 keep their low 6 bits in bytes 0-3 (scales) and 4-7 (mins), groups 4-7 their low 4 bits in bytes
// 8-11 and their top 2 bits in the top bits of bytes 0-7.
inline void q4k_sub_params(const uint8_t* block, uint64_t& scales, uint64_t& mins) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, block + kQ4KSubParams, 4);
  std::memcpy(&w1, block + kQ4KSubParams + 4, 4);
  std::memcpy(&w2, block + kQ4KSubParams + 8, 4);
  const uint32_t scales_hi = (w2 & 0x0F0F0F0F) | ((w0 >> 2) & 0x30303030);
  const uint32_t mins_hi = ((w2 >> 4) & 0x0F0F0F0F) | ((w1 >> 2) & 0x30303030);
  scales = (w0 & 0x3F3F3F3F) | (uint64_t{scales_hi} << 32);
  mins = (w1 & 0x3F3F3F3F) | (uint64_t{mins_hi} << 32);
}

// Block `block`'s d and dmin (as their float16 bits), and those of the block after it when `two`, else zeros.
inline __m128i q4k_supers(const uint8_t* block, bool two) {
  int32_t first, second = 0;
  std::memcpy(&first, block, 4);
  if (two) std::memcpy(&second, block + kQ4KBytes, 4);
  return _mm_set_epi32(0, 0, second, first);
}

// The sub-scales (which = 0) or sub-mins (1) of block `block` and, when `two`, the next, as 16 bytes (zero past
// the blocks' groups).
inline __m128i q4k_sub_bytes(const uint8_t* block, bool two, int which) {
  uint64_t s0, m0, s1 = 0, m1 = 0;
  q4k_sub_params(block, s0, m0);
  if (two) q4k_sub_params(block + kQ4KBytes, s1, m1);
  return which == 0 ? _mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0))
                    : _mm_set_epi64x(static_cast<int64_t>(m1), static_cast<int64_t>(m0));
}

}  // namespace
#endif

#if LC_VNNI
namespace {

// The scales d * sub-scale and (positive) mins dmin * sub-min of the 16 groups of blocks `block` and, when `two`,
// the next (zeros past them), as k_group_params forms a u4 weight's.
inline void q4k_params(const uint8_t* block, bool two, __m512& scales, __m512& mins) {
  uint64_t s0, m0, s1 = 0, m1 = 0;
  q4k_sub_params(block, s0, m0);
  if (two) q4k_sub_params(block + kQ4KBytes, s1, m1);
  const __m512 supers = _mm512_castps128_ps512(_mm_cvtph_ps(q4k_supers(block, two)));  // d0 dmin0 d1 dmin1
  const __m128i sub_scales = _mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0));
  const __m128i sub_mins = _mm_set_epi64x(static_cast<int64_t>(m1), static_cast<int64_t>(m0));
  scales = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_scales)), _mm512_permutexvar_ps(super_lanes(0), supers));
  mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_mins)), _mm512_permutexvar_ps(super_lanes(1), supers));
}

// Half h (128 weights, groups 4h .. 4h + 3) of a Q4_K block as unpack_chunk<4> gives a u4 chunk: each group's
// weights 0-15 in lo, 16-31 in hi. The half's low nibbles are groups 4h and 4h + 2, its high nibbles 4h + 1 and
// 4h + 3, each 32 weights (four 64-bit words) long.
inline void q4k_chunk(const uint8_t* block, int h, __m512i& lo, __m512i& hi) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i raw = _mm512_loadu_si512(block + kQ4KCodes + 64 * h);
  const __m512i low = _mm512_and_si512(raw, low_mask), high = high_nibbles(raw, low_mask);
  lo = _mm512_permutex2var_epi64(low, _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), high);
  hi = _mm512_permutex2var_epi64(low, _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2), high);
}

// The lanes of a Q4_K row's mins times the activation group sums (terms), 16 groups at a time from zero, as
// offset_lanes<true> forms a u4 weight's.
inline __m512 q4k_offsets(const uint8_t* row, int64_t blocks, const float* terms) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool two = b + 1 < blocks;
    __m512 scales, mins;
    q4k_params(row + b * kQ4KBytes, two, scales, mins);
    acc = _mm512_fnmadd_ps(mins, _mm512_maskz_loadu_ps(two ? 0xFFFF : 0x00FF, terms + 8 * b), acc);
  }
  return acc;
}

// gemv_rows for a pass of Q4_K rows (v: row-major, row_step the row's bytes), a row at a time: per two blocks (16
// groups), their scales times the activation scales and their mins against the activation's group sums, then per
// half block u4's dot products, in gemv_rows' order.
template <bool PRECISE>
void gemv_q4k(const PassView& v, int64_t, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow& a,
              int rows, float* out) {
  const int64_t blocks = chunks / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m512 acc = _mm512_setzero_ps(), offsets = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b += 2) {
      const uint8_t* block = row + b * kQ4KBytes;
      prefetch_q4k_ahead(block);
      const bool two = b + 1 < blocks;
      __m512 scales, mins;
      q4k_params(block, two, scales, mins);
      const int64_t g0 = 8 * b;
      const __m512 sd = _mm512_mul_ps(scales, _mm512_loadu_ps(a.group_scales + g0));
      offsets = _mm512_fnmadd_ps(mins, _mm512_maskz_loadu_ps(two ? 0xFFFF : 0x00FF, a.group_terms + g0), offsets);
      for (int j = 0; j < (two ? 4 : 2); ++j) {
        const ActivationChunk chunk = load_chunk<PRECISE, false, 4>(a, 2 * b + j, L);
        __m512i lo, hi;
        q4k_chunk(block + j / 2 * kQ4KBytes, j % 2, lo, hi);
        const __m512 lane_sd = _mm512_permutexvar_ps(_mm512_load_si512(kChunkIndex4.lanes[j]), sd);
        acc = accumulate_scaled<PRECISE, false, 4>(lo, hi, lane_sd, chunk, acc);
      }
    }
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc, offsets));
  }
}

// panel_dots for a pass of Q4_K rows: each half block unpacked once for the panel's activation rows.
template <bool PRECISE>
void panel_q4k(const PassView& v, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
               int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const int64_t blocks = chunks / 2;
  __m512* acc = static_cast<__m512*>(scratch);
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm512_setzero_ps();
  __m512 scales[kRowsPerPass];
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j = c % 4, b = c / 2;
    const __m512i lanes = _mm512_load_si512(kChunkIndex4.lanes[j]);
    __m512i lo[kRowsPerPass], hi[kRowsPerPass];
    __m512 s[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) {
      if (j == 0) {
        __m512 mins;
        q4k_params(row(r) + b * kQ4KBytes, b + 1 < blocks, scales[r], mins);
      }
      q4k_chunk(row(r) + b * kQ4KBytes, static_cast<int>(c % 2), lo[r], hi[r]);
      s[r] = _mm512_permutexvar_ps(lanes, scales[r]);
    }
    for (int64_t t = 0; t < mt; ++t) {
      const ActivationChunk chunk = load_chunk<PRECISE, false, 4>(acts[t], c, L);
      __m512* row_acc = acc + t * kRowsPerPass;
      for (int r = 0; r < kRowsPerPass; ++r) row_acc[r] = accumulate<PRECISE, false, 4>(lo[r], hi[r], s[r], chunk, row_acc[r]);
    }
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const __m512 offsets = q4k_offsets(row(r), blocks, acts[t].group_terms);
      out[t * out_stride + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t * kRowsPerPass + r], offsets));
    }
  }
}

}  // namespace
#elif LC_AVX2
namespace {

// The (d, dmin, d, dmin) of block `block` and, when `two`, the next (else zeros), as floats.
inline void q4k_supers(const uint8_t* block, bool two, float out[4]) {
  _mm_storeu_ps(out, _mm_cvtph_ps(q4k_supers(block, two)));
}

// block_scales<true> for the 16 groups of blocks `block` and, when `two`, the next: their scales per half of 8
// groups, and with `offsets` their mins times the activation's group sums (terms: the first group's) taken off it.
inline void q4k_scales(const uint8_t* block, bool two, __m256 out[2], const float* terms = nullptr,
                       __m256* offsets = nullptr) {
  float supers[4];
  q4k_supers(block, two, supers);
  const __m128i sub = q4k_sub_bytes(block, two, 0);
  out[0] = _mm256_mul_ps(low_bytes_to_floats(sub), _mm256_set1_ps(supers[0]));
  out[1] = _mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(sub, 8)), _mm256_set1_ps(supers[2]));
  if (offsets) {
    const __m128i mins = q4k_sub_bytes(block, two, 1);
    *offsets = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(mins), _mm256_set1_ps(supers[1])),
                                _mm256_loadu_ps(terms), *offsets);
    *offsets = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(mins, 8)), _mm256_set1_ps(supers[3])),
                                _mm256_loadu_ps(terms + 8), *offsets);
  }
}

// Vector half h of half hc of a Q4_K block as unpack_half<4> gives a u4 chunk's: its 32 bytes hold groups 2h and
// 2h + 1 of the half in their low and high nibbles, 32 weights each.
inline HalfCodes q4k_half(const uint8_t* block, int hc, int h) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ4KCodes + 64 * hc + 32 * h));
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i low = _mm256_and_si256(raw, low_mask);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
  HalfCodes w;
  w.lo = _mm256_permute2x128_si256(low, high, 0x20);  // weights 0-15 of both groups
  w.hi = _mm256_permute2x128_si256(low, high, 0x31);  // weights 16-31
  return w;
}

// row_offsets<false, true> of a Q4_K row.
inline __m256 q4k_offsets(const uint8_t* row, int64_t blocks, const float* terms) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    __m256 scales[2];
    q4k_scales(row + b * kQ4KBytes, b + 1 < blocks, scales, terms + 8 * b, &acc);
  }
  return acc;
}

// gemv_rows for a pass of Q4_K rows (v: row-major, row_step the row's bytes), a row at a time, in gemv_rows' order.
template <bool PRECISE>
void gemv_q4k(const PassView& v, int64_t, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow& a,
              int rows, float* out) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  const int64_t blocks = chunks / 2;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m256 acc = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b += 2) {
      const uint8_t* block = row + b * kQ4KBytes;
      prefetch_q4k_ahead(block);
      const bool two = b + 1 < blocks;
      const int64_t g0 = 8 * b;
      __m256 sd[2];
      q4k_scales(block, two, sd, a.group_terms + g0, &offsets);
      sd[0] = _mm256_mul_ps(sd[0], _mm256_loadu_ps(a.group_scales + g0));
      sd[1] = _mm256_mul_ps(sd[1], _mm256_loadu_ps(a.group_scales + g0 + 8));
      for (int j = 0; j < (two ? 4 : 2); ++j) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i dot = lane_dots<PRECISE, false, 4>(q4k_half(block + j / 2 * kQ4KBytes, j % 2, h), h, a, 2 * b + j, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), to_lanes(sd, index, j, h), acc);
        }
      }
    }
    out[r] = finish_row<false>(acc, offsets);
  }
}

// panel_dots for a pass of Q4_K rows, in panel_dots' order.
template <bool PRECISE>
void panel_q4k(const PassView& v, int64_t, int64_t chunks, int64_t, const Layout& L, const ActivationRow* acts,
               int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  const int64_t blocks = chunks / 2;
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  __m256 scales[kRowsPerPass][2];
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j = c % 4, b = c / 2;
    HalfCodes w[kRowsPerPass][2];
    __m256 s[kRowsPerPass][2];
    for (int r = 0; r < kRowsPerPass; ++r) {
      if (j == 0) q4k_scales(row(r) + b * kQ4KBytes, b + 1 < blocks, scales[r]);
      for (int h = 0; h < 2; ++h) {
        w[r][h] = q4k_half(row(r) + b * kQ4KBytes, static_cast<int>(c % 2), h);
        s[r][h] = to_lanes(scales[r], index, j, h);
      }
    }
    panel_chunk<PRECISE, false, 4>(w, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      out[t * out_stride + r] = finish_row<false>(acc[t * kRowsPerPass + r], q4k_offsets(row(r), blocks, acts[t].group_terms));
    }
  }
}

}  // namespace
#endif

namespace {

// A Q4_K row of K weights as a u4 row (row-major codes, K / 2 bytes) with each group's scale d * sub-scale and
// min -(dmin * sub-min) as floats, formed as RowRestorer forms a u4 K-quant row's: what dequantize_row reads.
inline void q4k_row_as_u4(const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins) {
  const int64_t blocks = K / kQ4KWeights;
#if LC_VNNI
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool two = b + 1 < blocks;
    const __mmask16 mask = two ? 0xFFFF : 0x00FF;
    __m512 s, m;
    q4k_params(row + b * kQ4KBytes, two, s, m);
    _mm512_mask_storeu_ps(scales + 8 * b, mask, s);
    _mm512_mask_storeu_ps(mins + 8 * b, mask, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32(INT32_MIN))));
  }
  for (int64_t c = 0; c < 2 * blocks; ++c) {
    __m512i lo, hi;
    q4k_chunk(row + c / 2 * kQ4KBytes, static_cast<int>(c % 2), lo, hi);
    _mm512_storeu_si512(codes + 64 * c, _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)));
  }
#else
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kQ4KBytes;
    uint16_t halves[2];
    std::memcpy(halves, block, 4);
    const float d = half_to_float(at::Half(halves[0], at::Half::from_bits()));
    const float dmin = half_to_float(at::Half(halves[1], at::Half::from_bits()));
    for (int q = 0; q < 8; ++q) {
      // get_scale_min_k4: groups 0-3 from the low 6 bits of bytes q and q + 4; groups 4-7 from the nibbles of
      // byte q + 4 and the top bits of bytes q - 4 and q
      const uint8_t* p = block + kQ4KSubParams;
      const int sub = q < 4 ? p[q] & 63 : (p[q + 4] & 0x0F) | ((p[q - 4] >> 6) << 4);
      const int sub_min = q < 4 ? p[q + 4] & 63 : (p[q + 4] >> 4) | ((p[q] >> 6) << 4);
      scales[8 * b + q] = static_cast<float>(sub) * d;
      mins[8 * b + q] = -(static_cast<float>(sub_min) * dmin);
      const uint8_t* qs = block + kQ4KCodes + 32 * (q / 2);
      uint8_t* out = codes + (8 * b + q) * 16;
      for (int j = 0; j < 16; ++j) {
        const int low = q % 2 == 0 ? qs[j] & 0x0F : qs[j] >> 4;
        const int high = q % 2 == 0 ? qs[j + 16] & 0x0F : qs[j + 16] >> 4;
        out[j] = static_cast<uint8_t>(low | (high << 4));
      }
    }
  }
#endif
}

}  // namespace
