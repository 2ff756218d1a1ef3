// Q4_K and Q5_K weights read in the GGUF file's own blocks (arrangements kQ4KBlocks and kQ5KBlocks, PackedWeight
// layouts "q4k" and "q5k"): the weight stays in the file's memory map, so loading neither copies nor repacks it.
//
// A Q4_K block holds 256 weights in 8 groups of 32: float16 d and dmin, 12 bytes of 6-bit sub-scales and sub-mins
// (ggml's get_scale_min_k4 packing), then 128 bytes of codes, 32 per pair of groups: byte j holds weight j of group
// 2i in its low nibble and weight j of group 2i + 1 in its high one. A Q5_K block has 32 more bytes before its
// codes, whose bit g of byte j is the fifth bit of weight j of group g.
//
// A u4 chunk's byte holds weights j and j + 16 of one group instead, so two 64-bit permutations per 128 weights
// turn a half block's nibbles into the vectors unpack_chunk<4> gives for u4 (Q5_K then adds its fifth bits: codes
// below 32 fit the same dot products). From there the kernels run u4's K-quant operations (quant_linear.h: the
// same activation layout, d * sub-scale and dmin * sub-min formed alike), so a Q4_K product is the interleaved u4
// weight's bit for bit. (A Q5_K one differs from the u8 repack's in float rounding only: u8 sums its lanes
// otherwise.)
#pragma once

#if LC_SIMD
namespace {

// The GEMV reads a pass's rows one after the other (one stream, as quant_q6k.h's), prefetching this many blocks
// ahead. Measured on the Zen 5 EPYC (2026-12-05, one process, alternating, 8B-shaped Q4_K weights from DRAM):
// 36-37 GB/s on one thread and 47 on two, where the interleaved u4 kernel read 29-33 and 42-45; Q5_K 36-38 and
// 51-68 against u8's 21-23 and 32-41 (docs/benchmarks.md, twenty-fifth session).
constexpr int64_t kKBlocksPrefetch = 32;

// A K-quant block's bytes, and where its codes start, for 4- or 5-bit codes.
template <int BITS>
constexpr int64_t k_block_bytes() { return BITS == 5 ? kQ5KBytes : kQ4KBytes; }
template <int BITS>
constexpr int64_t k_block_codes() { return BITS == 5 ? kQ5KCodes : kQ4KCodes; }

// (the kernels step two blocks at a time)
template <int BITS>
inline void prefetch_k_blocks_ahead(const uint8_t* pair) {
  prefetch_ahead(pair, kKBlocksPrefetch * k_block_bytes<BITS>(), 2 * k_block_bytes<BITS>());
}

// The 8 sub-scales and 8 sub-mins of a K-quant block, a byte each (group q in byte q), from its 12 packed bytes:
// groups 0-3 keep their low 6 bits in bytes 0-3 (scales) and 4-7 (mins), groups 4-7 their low 4 bits in bytes
// 8-11 and their top 2 bits in the top bits of bytes 0-7.
inline void k_block_sub_params(const uint8_t* block, uint64_t& scales, uint64_t& mins) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, block + kQ4KSubParams, 4);
  std::memcpy(&w1, block + kQ4KSubParams + 4, 4);
  std::memcpy(&w2, block + kQ4KSubParams + 8, 4);
  const uint32_t scales_hi = (w2 & 0x0F0F0F0F) | ((w0 >> 2) & 0x30303030);
  const uint32_t mins_hi = ((w2 >> 4) & 0x0F0F0F0F) | ((w1 >> 2) & 0x30303030);
  scales = (w0 & 0x3F3F3F3F) | (uint64_t{scales_hi} << 32);
  mins = (w1 & 0x3F3F3F3F) | (uint64_t{mins_hi} << 32);
}

// The sub-scales and sub-mins of block `block` and, when `two`, the next, as 16 bytes each (zero past the
// blocks' groups), and their d and dmin (as float16 bits: d0 dmin0 d1 dmin1, zeros past them).
template <int BITS>
inline void k_pair_params(const uint8_t* block, bool two, __m128i& sub_scales, __m128i& sub_mins, __m128i& supers) {
  uint64_t s0, m0, s1 = 0, m1 = 0;
  int32_t first, second = 0;
  k_block_sub_params(block, s0, m0);
  std::memcpy(&first, block, 4);
  if (two) {
    k_block_sub_params(block + k_block_bytes<BITS>(), s1, m1);
    std::memcpy(&second, block + k_block_bytes<BITS>(), 4);
  }
  sub_scales = _mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0));
  sub_mins = _mm_set_epi64x(static_cast<int64_t>(m1), static_cast<int64_t>(m0));
  supers = _mm_set_epi32(0, 0, second, first);
}

}  // namespace
#endif

#if LC_VNNI
namespace {

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
      const uint8_t* block = row(r) + b * k_block_bytes<BITS>();
      if (j == 0) {
        __m512 mins;
        k_blocks_params<BITS>(block, b + 1 < blocks, scales[r], mins);
      }
      k_blocks_chunk<BITS>(block, static_cast<int>(c % 2), lo[r], hi[r]);
      s[r] = _mm512_permutexvar_ps(lanes, scales[r]);
    }
    panel_chunk<PRECISE, false, 4>(lo, hi, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const __m512 offsets = k_blocks_offsets<BITS>(row(r), blocks, acts[t].group_terms);
      out[t * out_stride + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t * kRowsPerPass + r], offsets));
    }
  }
}

}  // namespace
#elif LC_AVX2
namespace {

// block_scales<true> for the 16 groups of blocks `block` and, when `two`, the next: their scales per half of 8
// groups, and with `offsets` their mins times the activation's group sums (terms: the first group's) taken off it.
template <int BITS>
inline void k_blocks_scales(const uint8_t* block, bool two, __m256 out[2], const float* terms = nullptr,
                            __m256* offsets = nullptr) {
  __m128i sub, mins, halves;
  k_pair_params<BITS>(block, two, sub, mins, halves);
  float supers[4];
  _mm_storeu_ps(supers, _mm_cvtph_ps(halves));
  out[0] = _mm256_mul_ps(low_bytes_to_floats(sub), _mm256_set1_ps(supers[0]));
  out[1] = _mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(sub, 8)), _mm256_set1_ps(supers[2]));
  if (offsets) {
    *offsets = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(mins), _mm256_set1_ps(supers[1])),
                                _mm256_loadu_ps(terms), *offsets);
    *offsets = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(mins, 8)), _mm256_set1_ps(supers[3])),
                                _mm256_loadu_ps(terms + 8), *offsets);
  }
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

// row_offsets<false, true> of a row of blocks.
template <int BITS>
inline __m256 k_blocks_offsets(const uint8_t* row, int64_t blocks, const float* terms) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b += 2) {
    __m256 scales[2];
    k_blocks_scales<BITS>(row + b * k_block_bytes<BITS>(), b + 1 < blocks, scales, terms + 8 * b, &acc);
  }
  return acc;
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
      for (int j = 0; j < (two ? 4 : 2); ++j) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const HalfCodes w = k_blocks_half<BITS>(block + j / 2 * k_block_bytes<BITS>(), j % 2, h);
          const __m256i dot = lane_dots<PRECISE, false, 4>(w, h, a, 2 * b + j, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), to_lanes(sd, index, j, h), acc);
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
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  __m256 scales[kRowsPerPass][2];
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j = c % 4, b = c / 2;
    HalfCodes w[kRowsPerPass][2];
    __m256 s[kRowsPerPass][2];
    for (int r = 0; r < kRowsPerPass; ++r) {
      const uint8_t* block = row(r) + b * k_block_bytes<BITS>();
      if (j == 0) k_blocks_scales<BITS>(block, b + 1 < blocks, scales[r]);
      for (int h = 0; h < 2; ++h) {
        w[r][h] = k_blocks_half<BITS>(block, static_cast<int>(c % 2), h);
        s[r][h] = to_lanes(scales[r], index, j, h);
      }
    }
    panel_chunk<PRECISE, false, 4>(w, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const __m256 offsets = k_blocks_offsets<BITS>(row(r), blocks, acts[t].group_terms);
      out[t * out_stride + r] = finish_row<false>(acc[t * kRowsPerPass + r], offsets);
    }
  }
}

}  // namespace
#endif

namespace {

#if LC_SIMD
// The kernel for a weight of Q4_K or Q5_K blocks (L.k_blocks()), with or without the second activation level.
template <typename Fn>
Fn pick_k_blocks(bool precise, const Layout& L, Fn four_precise, Fn four, Fn five_precise, Fn five) {
  if (L.file == kQ5KBlocks) return precise ? five_precise : five;
  return precise ? four_precise : four;
}
#endif

// A row of K weights in Q4_K or Q5_K blocks (L.k_blocks()) as a row-major u4 row (Q4_K, K / 2 bytes) or u8 row (Q5_K,
// K bytes) with each group's scale d * sub-scale and min -(dmin * sub-min) as floats, formed as RowRestorer forms
// a u4 or u8 K-quant row's: what dequantize_row reads.
inline void k_blocks_row(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins) {
  const int64_t blocks = K / kQ4KWeights;
  const bool five = L.file == kQ5KBlocks;
  const int64_t block_bytes = L.block_bytes();
#if LC_VNNI
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool two = b + 1 < blocks;
    const __mmask16 mask = two ? 0xFFFF : 0x00FF;
    __m512 s, m;
    if (five) k_blocks_params<5>(row + b * block_bytes, two, s, m);
    else k_blocks_params<4>(row + b * block_bytes, two, s, m);
    _mm512_mask_storeu_ps(scales + 8 * b, mask, s);
    _mm512_mask_storeu_ps(mins + 8 * b, mask, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32(INT32_MIN))));
  }
  for (int64_t c = 0; c < 2 * blocks; ++c) {
    __m512i lo, hi;
    const uint8_t* block = row + c / 2 * block_bytes;
    if (five) {  // each group's weights 0-15 (lo) and 16-31 (hi) side by side
      k_blocks_chunk<5>(block, static_cast<int>(c % 2), lo, hi);
      _mm512_storeu_si512(codes + 128 * c, _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi));
      _mm512_storeu_si512(codes + 128 * c + 64, _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi));
    } else {  // a u4 byte: weight j low, j + 16 high
      k_blocks_chunk<4>(block, static_cast<int>(c % 2), lo, hi);
      _mm512_storeu_si512(codes + 64 * c, _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)));
    }
  }
#else
  const int64_t first_code = five ? kQ5KCodes : kQ4KCodes;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * block_bytes;
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
      const int64_t g = 8 * b + q;
      scales[g] = static_cast<float>(sub) * d;
      mins[g] = -(static_cast<float>(sub_min) * dmin);
      const uint8_t* qs = block + first_code + 32 * (q / 2);
      auto code = [&](int j) {  // weight j of group q
        const int nibble = q % 2 == 0 ? qs[j] & 0x0F : qs[j] >> 4;
        return five ? nibble | (((block[kQ5KHighBits + j] >> q) & 1) << 4) : nibble;
      };
      for (int j = 0; j < 16; ++j) {
        if (five) {
          codes[32 * g + j] = static_cast<uint8_t>(code(j));
          codes[32 * g + j + 16] = static_cast<uint8_t>(code(j + 16));
        } else {
          codes[16 * g + j] = static_cast<uint8_t>(code(j) | (code(j + 16) << 4));
        }
      }
    }
  }
#endif
}

}  // namespace
