// The q8_0 KV pool's rows on AVX2 (quant/generic/kv_q8.h says what each function does): 8 codes at a time widened
// to floats and multiplied by their block's scale in registers, the same codes as the generic quantize.
#pragma once
#include "../../generic/kv_q8.h"

#if LC_AVX2
#define LC_KV_Q8_ISA 1
namespace {
namespace isa {

// codes[0, 8) of a block times its scale d
inline __m256 kv_q8_values8(const int8_t* codes, __m256 d) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d);
}

inline float kv_q8_sum8(__m256 x) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

inline void kv_q8_quantize(const float* x, int64_t n, KvQ8Block* out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < n / 32; ++b) {
    __m256 v[4];
    __m256 top = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      v[c] = _mm256_loadu_ps(x + 32 * b + 8 * c);
      top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[c]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
    out[b].d = float_to_half(d);
    const __m256 scale = _mm256_set1_ps(inverse);
    __m256i q[4];
    for (int c = 0; c < 4; ++c) {
      q[c] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[c], scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // int32 -> int8 in order: the packs interleave 128-bit lanes, the permute restores them (as llama.cpp's)
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), ordered);
  }
}

template <int G>
void kv_q8_dot(const float* q, const KvQ8Block* k, int64_t D, float scale, float* out, int64_t stride) {
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < D / 32; ++b) {
    const __m256 d = _mm256_set1_ps(half_to_float(k[b].d));
    for (int c = 0; c < 4; ++c) {
      const __m256 kc = kv_q8_values8(k[b].qs + 8 * c, d);
      for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + 32 * b + 8 * c), kc, acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) out[g * stride] = kv_q8_sum8(acc[g]) * scale;
}

// kv_q8_add_rows over the values [i0, i0 + 16) of each row (half a block): 2 G sums in registers over the run.
template <int G>
void kv_q8_add_rows_chunk(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t i0,
                          float* out, int64_t out_stride) {
  __m256 acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < count; ++j) {
    const KvQ8Block& block = v[j * row + i0 / 32];
    const __m256 d = _mm256_set1_ps(half_to_float(block.d));
    const __m256 v0 = kv_q8_values8(block.qs + i0 % 32, d), v1 = kv_q8_values8(block.qs + i0 % 32 + 8, d);
    for (int g = 0; g < G; ++g) {
      const __m256 wg = _mm256_set1_ps(w[g * w_stride + j]);
      acc[g][0] = _mm256_fmadd_ps(wg, v0, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(wg, v1, acc[g][1]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 2; ++c) {
      float* o = out + g * out_stride + i0 + 8 * c;
      _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[g][c]));
    }
  }
}

template <int G>
void kv_q8_add_rows(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
                    float* out, int64_t out_stride) {
  for (int64_t i = 0; i < D; i += 16) kv_q8_add_rows_chunk<G>(v, row, count, w, w_stride, i, out, out_stride);
}

}  // namespace isa
}  // namespace
#endif
