// The q8_0 KV pool's rows on AVX-512 (quant/generic/kv_q8.h says what each function does): 16 codes at a time
// widened to floats and multiplied by their block's scale in registers, the same codes as the generic quantize.
#pragma once
#include "../../generic/kv_q8.h"

#if LC_VNNI
#define LC_KV_Q8_ISA 1
namespace {
namespace isa {

// codes[0, 16) of a block times its scale d
inline __m512 kv_q8_values16(const int8_t* codes, __m512 d) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), d);
}

inline void kv_q8_quantize(const float* x, int64_t n, KvQ8Block* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * b), hi = _mm512_loadu_ps(x + 32 * b + 16);
    const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float d = top / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
    out[b].d = float_to_half(d);
    const __m512 scale = _mm512_set1_ps(inverse);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i q_lo = _mm512_cvt_roundps_epi32(_mm512_mul_ps(lo, scale), kNearest);
    const __m512i q_hi = _mm512_cvt_roundps_epi32(_mm512_mul_ps(hi, scale), kNearest);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs), _mm512_cvtepi32_epi8(q_lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16), _mm512_cvtepi32_epi8(q_hi));
  }
}

template <int G>
void kv_q8_dot(const float* q, const KvQ8Block* k, int64_t D, float scale, float* out, int64_t stride) {
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (int64_t b = 0; b < D / 32; ++b) {
    const __m512 d = _mm512_set1_ps(half_to_float(k[b].d));
    for (int h = 0; h < 2; ++h) {
      const __m512 kc = kv_q8_values16(k[b].qs + 16 * h, d);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + 32 * b + 16 * h), kc, acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) out[g * stride] = _mm512_reduce_add_ps(acc[g]) * scale;
}

// kv_q8_add_rows over the values [i0, i0 + 16 C) of each row: the G x C sums in registers over the whole run.
template <int G, int C>
void kv_q8_add_rows_chunk(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t i0,
                          float* out, int64_t out_stride) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 vc[C];
    for (int c = 0; c < C; ++c) {
      const KvQ8Block& block = v[j * row + (i0 + 16 * c) / 32];
      vc[c] = kv_q8_values16(block.qs + (i0 + 16 * c) % 32, _mm512_set1_ps(half_to_float(block.d)));
    }
    for (int g = 0; g < G; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g * w_stride + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(wg, vc[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* o = out + g * out_stride + i0 + 16 * c;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[g][c]));
    }
  }
}

template <int G>
void kv_q8_add_rows(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
                    float* out, int64_t out_stride) {
  for (int64_t i = 0; i < D; i += 64) {  // D is a multiple of 32: chunks of 4 or a last one of 2
    if (D - i >= 64) kv_q8_add_rows_chunk<G, 4>(v, row, count, w, w_stride, i, out, out_stride);
    else kv_q8_add_rows_chunk<G, 2>(v, row, count, w, w_stride, i, out, out_stride);
  }
}

}  // namespace isa
}  // namespace
#endif
