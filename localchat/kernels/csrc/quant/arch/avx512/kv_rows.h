// The paged KV pool's float32, float16 and bfloat16 rows on AVX-512 (quant/generic/kv_rows.h says what each
// function does): 16 values at a time, 16-bit ones widened in registers; a run of value rows keeps its G heads' sums
// of up to 64 columns in registers.
#pragma once
#include "../../generic/kv_rows.h"

#if LC_VNNI
#define LC_ISA_DOT_ROW 1
#define LC_ISA_DOT_HEADS 1
#define LC_ISA_ADD_SCALED_ROW 1
#define LC_ISA_ADD_ROWS 1
#define LC_ISA_STORE_ROW 1
namespace {
namespace isa {

// p[0, 16) as float32
template <RowType R>
inline __m512 load16(const RowElement<R>* p) {
  if constexpr (R == RowType::kFloat) {
    return _mm512_loadu_ps(p);
  } else if constexpr (R == RowType::kHalf) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
}

template <RowType R>
float dot_row(const float* q, const RowElement<R>* k, int64_t n) {
  int64_t i = 0;
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16<R>(k + i), acc);
  float sum = _mm512_reduce_add_ps(acc);
  if constexpr (R == RowType::kFloat) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = i; j < n; ++j) sum += q[j] * k[j];
  } else {
    for (; i < n; ++i) sum += q[i] * widen<R>(k[i]);
  }
  return sum;
}

// G independent sums in flight, each chunk of k loaded (and widened) once for all G.
template <int G, RowType R>
void dot_heads(const float* q, const RowElement<R>* k, int64_t D, float scale, float* out, int64_t stride) {
  if (D % 16 == 0) {
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
      const __m512 kc = load16<R>(k + i);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + i), kc, acc[g]);
    }
    for (int g = 0; g < G; ++g) out[g * stride] = _mm512_reduce_add_ps(acc[g]) * scale;
    return;
  }
  for (int g = 0; g < G; ++g) out[g * stride] = dot_row<R>(q + g * D, k, D) * scale;
}

template <RowType R>
void add_scaled_row(float* acc, float w, const RowElement<R>* v, int64_t n) {
  int64_t i = 0;
  const __m512 weight = _mm512_set1_ps(w);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(weight, load16<R>(v + i), _mm512_loadu_ps(acc + i)));
  }
  generic::add_scaled_row<R>(acc + i, w, v + i, n - i);
}

// add_rows for 16 C columns: the G x C accumulators stay in registers for the whole run of rows, and each chunk of
// a row is loaded (and widened) once for all G heads.
template <int G, int C, RowType R>
void add_rows_columns(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride,
                      float* out, int64_t out_stride) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 vc[C];
    for (int c = 0; c < C; ++c) vc[c] = load16<R>(v + j * row + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g * w_stride + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(wg, vc[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* o = out + g * out_stride + 16 * c;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[g][c]));
    }
  }
}

template <int G, RowType R>
void add_rows(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
              float* out, int64_t out_stride) {
  if (D % 16 == 0) {
    for (int64_t i = 0; i < D; i += 64) {
      switch (std::min<int64_t>((D - i) / 16, 4)) {
        case 4: add_rows_columns<G, 4, R>(v + i, row, count, w, w_stride, out + i, out_stride); break;
        case 3: add_rows_columns<G, 3, R>(v + i, row, count, w, w_stride, out + i, out_stride); break;
        case 2: add_rows_columns<G, 2, R>(v + i, row, count, w, w_stride, out + i, out_stride); break;
        default: add_rows_columns<G, 1, R>(v + i, row, count, w, w_stride, out + i, out_stride); break;
      }
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
    for (; i + 16 <= n; i += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  generic::store_row<R>(dst + i, src + i, n - i);
}

}  // namespace isa
}  // namespace
#endif
