// Restoring rows of a packed weight to floats with AVX-512 (quant/restore.h; the generic ones' values, 16 at a
// time).
#pragma once
#include "k_blocks.h"
#include "q6k.h"

#if LC_VNNI
namespace {
namespace isa {

// u6_chunk_codes with AVX-512: the low nibbles of 64 bytes, the top bits of 32 (bits 2q, 2q + 1 for code i of
// byte p < 32, bits 2q + 2, 2q + 3 for p >= 32; q = 0 for the low nibble, 2 for the high), then each 8-code run
// of the low-nibble codes followed by the same run of the high-nibble codes.
inline void u6_chunk_codes_avx512(const uint8_t* row, int64_t K, int64_t c, uint8_t* codes) {
  const __m512i low = _mm512_loadu_si512(row + c * 64);
  const __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + K / 2 + c * 32)));
  const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);  // 0 for p < 32, 2 after
  const __m512i top_low = _mm512_and_si512(_mm512_srlv_epi16(high, shift), two);
  const __m512i top_high = _mm512_and_si512(_mm512_srlv_epi16(high, _mm512_add_epi16(shift, _mm512_set1_epi16(4))), two);
  const __m512i a = _mm512_or_si512(_mm512_and_si512(low, nibble), _mm512_slli_epi16(top_low, 4));
  const __m512i b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble), _mm512_slli_epi16(top_high, 4));
  _mm512_storeu_si512(codes, _mm512_permutex2var_epi64(a, _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), b));
  _mm512_storeu_si512(codes + 64, _mm512_permutex2var_epi64(a, _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4), b));
}


// The 128 codes of chunk c of a row of 6-bit codes in natural order, from u6's planes or a row of Q6_K blocks.
inline void u6_chunk_values(const uint8_t* row, int64_t K, int64_t c, const Layout& L, uint8_t* codes) {
  if (L.file == kBlocksQ6_K) q6k_natural_codes(row, c, codes);
  else u6_chunk_codes_avx512(row, K, c, codes);
}

// With AVX-512, 16 values at a time: the scalar loop's operations (code * scale + min, fused as GCC fuses the
// scalar's, or (code - zero point) * scale) in vector registers.
// 16 codes of group g as values: code * scale + min (fused), or (code - zero point) * scale without mins.
inline __m512 code_values(__m128i codes, const float* scales, const float* mins, int64_t g, __m512 zp) {
  const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes));
  const __m512 scale = _mm512_set1_ps(scales[g]);
  return mins ? _mm512_fmadd_ps(c, scale, _mm512_set1_ps(mins[g])) : _mm512_mul_ps(_mm512_sub_ps(c, zp), scale);
}

void dequantize_row(const uint8_t* row, const float* scales, const float* mins, int64_t zero_point, const Layout& L,
                    int64_t K, float* out) {
  const int64_t groups = K / L.group_size;
  const __m512 zp = _mm512_set1_ps(static_cast<float>(zero_point));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  auto put = [&](float* o, __m128i codes, int64_t g) { _mm512_storeu_ps(o, code_values(codes, scales, mins, g, zp)); };
  alignas(64) uint8_t chunk[128];
  for (int64_t g = 0; g < groups; ++g) {
    float* o = out + g * L.group_size;
    if (L.u6) {
      const int64_t first = g * L.group_size;
      if (first % 128 == 0) u6_chunk_values(row, K, first / 128, L, chunk);
      put(o, _mm_load_si128(reinterpret_cast<const __m128i*>(chunk + first % 128)), g);
    } else if (L.nibbles) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16));
      put(o, _mm_and_si128(b, nibble), g);
      put(o + 16, _mm_and_si128(_mm_srli_epi16(b, 4), nibble), g);
    } else {
      for (int i = 0; i < L.group_size; i += 16) {
        put(o + i, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * L.group_size + i)), g);
      }
    }
  }
}
#if defined(__AVX512BF16__)
// dequantize_row's values rounded to bfloat16 (as to_bfloat16 rounds them), written 32 at a time: the same fused
// multiply-adds, without the float32 row in between.
void dequantize_row_bf16(const uint8_t* row, const float* scales, const float* mins, int64_t zero_point,
                         const Layout& L, int64_t K, uint16_t* out) {
  const __m512 zp = _mm512_set1_ps(static_cast<float>(zero_point));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  auto value = [&](__m128i codes, int64_t g) { return code_values(codes, scales, mins, g, zp); };
  auto put = [&](uint16_t* o, __m512 first, __m512 second) {
    const __m512bh v = _mm512_cvtne2ps_pbh(second, first);
    _mm512_storeu_si512(o, reinterpret_cast<const __m512i&>(v));
  };
  alignas(64) uint8_t chunk[128];
  const int64_t g16 = L.group_size == 16 ? 1 : 0;  // 32 values: one group of 32 or two of 16
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t g = k / L.group_size;
    if (L.u6) {
      if (k % 128 == 0) u6_chunk_values(row, K, k / 128, L, chunk);
      const uint8_t* b = chunk + k % 128;
      put(out + k, value(_mm_load_si128(reinterpret_cast<const __m128i*>(b)), g),
          value(_mm_load_si128(reinterpret_cast<const __m128i*>(b + 16)), g + 1));
    } else if (L.nibbles) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
      put(out + k, value(_mm_and_si128(b, nibble), g), value(_mm_and_si128(_mm_srli_epi16(b, 4), nibble), g));
    } else {
      put(out + k, value(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)), g),
          value(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16)), g + g16));
    }
  }
}
#endif

// generic::k_blocks_row with AVX-512: the same codes, and the scales and mins as k_blocks_params forms them.
inline void k_blocks_row(const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins) {
  const int64_t blocks = K / kQ4KWeights;
  const bool five = L.file == kBlocksQ5_K;
  const int64_t block_bytes = L.block_bytes();
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
}

// generic::gather_pass_row with AVX-512: a chunk per copy, 16 groups' scales per vector (the same arithmetic).
inline void gather_pass_row(const PassView& v, int r, int64_t w_row, int64_t groups, bool k_scales, uint8_t* codes,
                            float* row_scales, float* row_mins) {
  int64_t c = 0;
  for (; (c + 1) * kChunkBytes <= w_row; ++c) {
    _mm512_storeu_si512(codes + c * kChunkBytes, _mm512_loadu_si512(v.codes(r, c)));
  }
  if (c * kChunkBytes < w_row) std::memcpy(codes + c * kChunkBytes, v.codes(r, c), w_row - c * kChunkBytes);
  for (int64_t g = 0; g < groups; g += kGroupBlock) {
    const int64_t left = groups - g;
    const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    if (k_scales) {  // d * sub-scale and -(dmin * sub-min)
      __m512 scales, m;
      k_group_params(v, r, g, left, scales, m);
      _mm512_mask_storeu_ps(row_scales + g, mask, scales);
      const __m512i negated = _mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32(INT32_MIN));  // -m
      _mm512_mask_storeu_ps(row_mins + g, mask, _mm512_castsi512_ps(negated));
    } else {
      _mm512_mask_storeu_ps(row_scales + g, mask,
                            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.group<uint16_t>(v.s, r, g))));
      if (v.m) {
        _mm512_mask_storeu_ps(row_mins + g, mask,
                              _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.group<uint16_t>(v.m, r, g))));
      }
    }
  }
}

}  // namespace isa
}  // namespace
#endif
