// The paged KV pool's float32, float16 and bfloat16 rows on AVX2 (quant/generic/kv_rows.h says what each function
// does): 8 values at a time, float16 widened by F16C and bfloat16 by a shift; a run of value rows keeps its G heads'
// sums of up to 16 columns in registers (16 registers: 4 heads x 2 vectors, their loads and a weight).
#pragma once
#include "../../generic/kv_rows.h"

#if LC_AVX2
#define LC_ISA_DOT_ROW 1
#define LC_ISA_DOT_HEADS 1
#define LC_ISA_ADD_SCALED_ROW 1
#define LC_ISA_ADD_ROWS 1
#define LC_ISA_STORE_ROW 1
namespace {
namespace isa {

// p[0, 8) as float32
template <RowType R>
inline __m256 load8(const RowElement<R>* p) {
  if constexpr (R == RowType::kFloat) {
    return _mm256_loadu_ps(p);
  } else if constexpr (R == RowType::kHalf) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
}

inline float row_sum8(__m256 x) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

template <RowType R>
float dot_row(const float* q, const RowElement<R>* k, int64_t n) {
  int64_t i = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8<R>(k + i), acc);
  float sum = row_sum8(acc);
  for (; i < n; ++i) sum += q[i] * widen<R>(k[i]);
  return sum;
}

// G independent sums in flight, each chunk of k loaded (and widened) once for all G.
template <int G, RowType R>
void dot_heads(const float* q, const RowElement<R>* k, int64_t D, float scale, float* out, int64_t stride) {
  if (D % 8 == 0) {
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t i = 0; i < D; i += 8) {
      const __m256 kc = load8<R>(k + i);
      for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + i), kc, acc[g]);
    }
    for (int g = 0; g < G; ++g) out[g * stride] = row_sum8(acc[g]) * scale;
    return;
  }
  for (int g = 0; g < G; ++g) out[g * stride] = dot_row<R>(q + g * D, k, D) * scale;
}

template <RowType R>
void add_scaled_row(float* acc, float w, const RowElement<R>* v, int64_t n) {
  int64_t i = 0;
  const __m256 weight = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(weight, load8<R>(v + i), _mm256_loadu_ps(acc + i)));
  }
  generic::add_scaled_row<R>(acc + i, w, v + i, n - i);
}

// add_rows for 8 C columns, the G x C accumulators in registers over the run
template <int G, int C, RowType R>
void add_rows_columns(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride,
                      float* out, int64_t out_stride) {
  __m256 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) acc[g][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < count; ++j) {
    __m256 vc[C];
    for (int c = 0; c < C; ++c) vc[c] = load8<R>(v + j * row + 8 * c);
    for (int g = 0; g < G; ++g) {
      const __m256 wg = _mm256_set1_ps(w[g * w_stride + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm256_fmadd_ps(wg, vc[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* o = out + g * out_stride + 8 * c;
      _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[g][c]));
    }
  }
}

template <int G, RowType R>
void add_rows(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
              float* out, int64_t out_stride) {
  if (D % 8 == 0) {
    for (int64_t i = 0; i < D; i += 16) {
      if (D - i >= 16) add_rows_columns<G, 2, R>(v + i, row, count, w, w_stride, out + i, out_stride);
      else add_rows_columns<G, 1, R>(v + i, row, count, w, w_stride, out + i, out_stride);
    }
    return;
  }
  for (int g = 0; g < G; ++g) {
    for (int64_t j = 0; j < count; ++j) add_scaled_row<R>(out + g * out_stride, w[g * w_stride + j], v + j * row, D);
  }
}

// (one token's row: the bfloat16 rounding stays scalar)
template <RowType R>
void store_row(RowElement<R>* dst, const float* src, int64_t n) {
  int64_t i = 0;
  if constexpr (R == RowType::kHalf) {
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  generic::store_row<R>(dst + i, src + i, n - i);
}

}  // namespace isa
}  // namespace
#endif
