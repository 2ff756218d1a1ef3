// The paged KV pool's rows on the CPU, float32, float16, bfloat16 or q8_0: the loads, the dot product with a
// float32 query, the weighted sum into a float32 accumulator, and the store. A 16-bit pool reads half the bytes per
// key (decode attention over a long context is bound by them); its rows are widened to float32 as they are read,
// and rounded to nearest even when stored, as torch's .to() rounds. A q8_0 pool (kernels/kv_quant.py) reads 0.53x
// of float16's: its rows are blocks of int8 codes and a scale (quant/kv_q8.h), quantized when stored and read as
// codes times their scale; pointers into it count blocks (pool_units), not values.
#pragma once
#include <torch/extension.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "quant/kv_q8.h"

namespace {

using Half = c10::Half;
using BFloat16 = c10::BFloat16;

// Elements of T per row of D values in the pool: D, or D / 32 q8_0 blocks.
template <typename T>
constexpr int64_t pool_units(int64_t D) {
  if constexpr (std::is_same_v<T, KvQ8Block>) return D / 32;
  else return D;
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load16(const BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

// sum_i q[i] * k[i]
template <typename T>
float dot_row(const float* q, const T* k, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(k + i), acc);
  sum = _mm512_reduce_add_ps(acc);
#endif
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = i; j < n; ++j) sum += q[j] * k[j];
  } else {
    for (; i < n; ++i) sum += q[i] * static_cast<float>(k[i]);
  }
  return sum;
}

// out[g * stride] = scale * sum_i q[g * D + i] * k[i] for G query heads that share the key row k: G independent
// sums in flight, each chunk of k loaded (and widened) once for all G.
template <int G, typename T>
void dot_heads(const float* q, const T* k, int64_t D, float scale, float* out, int64_t stride) {
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
      const __m512 kc = load16(k + i);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + i), kc, acc[g]);
    }
    for (int g = 0; g < G; ++g) out[g * stride] = _mm512_reduce_add_ps(acc[g]) * scale;
    return;
  }
#endif
  for (int g = 0; g < G; ++g) out[g * stride] = dot_row(q + g * D, k, D) * scale;
}

// f(std::integral_constant<int, G>(), g) over a KV head's `group` query heads, G = 4 at a time from head g (the
// last G may be 1-3): the kernels below keep G heads' sums in registers, G a compile-time count.
template <typename F>
void for_head_blocks(int64_t group, F f) {
  int64_t g = 0;
  for (; g + 4 <= group; g += 4) f(std::integral_constant<int, 4>(), g);
  switch (group - g) {
    case 3: f(std::integral_constant<int, 3>(), g); break;
    case 2: f(std::integral_constant<int, 2>(), g); break;
    case 1: f(std::integral_constant<int, 1>(), g); break;
    default: break;
  }
}

// dot_heads for `group` query heads.
template <typename T>
void dot_group(const float* q, const T* k, int64_t D, int64_t group, float scale, float* out, int64_t stride) {
  for_head_blocks(group, [&](auto heads, int64_t g) {
    dot_heads<decltype(heads)::value>(q + g * D, k, D, scale, out + g * stride, stride);
  });
}

// out[g * out_stride + i] += sum_j w[g * w_stride + j] * v[j * row + i], i < 16 C, for G query heads over `count`
// value rows `row` elements apart: the G x C accumulators stay in registers for the whole run of rows, and each
// chunk of a row is loaded (and widened) once for all G heads.
template <int G, int C, typename T>
void add_weighted_rows_kernel(const T* v, int64_t row, int64_t count, const float* w, int64_t w_stride, float* out,
                              int64_t out_stride) {
#if defined(__AVX512F__)
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 vc[C];
    for (int c = 0; c < C; ++c) vc[c] = load16(v + j * row + 16 * c);
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
#endif
}

template <int G, typename T>
void add_weighted_rows_chunks(const T* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
                              float* out, int64_t out_stride) {
  for (int64_t i = 0; i < D; i += 64) {
    switch (std::min<int64_t>((D - i) / 16, 4)) {
      case 4: add_weighted_rows_kernel<G, 4>(v + i, row, count, w, w_stride, out + i, out_stride); break;
      case 3: add_weighted_rows_kernel<G, 3>(v + i, row, count, w, w_stride, out + i, out_stride); break;
      case 2: add_weighted_rows_kernel<G, 2>(v + i, row, count, w, w_stride, out + i, out_stride); break;
      default: add_weighted_rows_kernel<G, 1>(v + i, row, count, w, w_stride, out + i, out_stride); break;
    }
  }
}

// acc[i] += w * v[i]
template <typename T>
void add_scaled_row(float* acc, float w, const T* v, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 weight = _mm512_set1_ps(w);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(weight, load16(v + i), _mm512_loadu_ps(acc + i)));
#endif
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
    for (int64_t j = i; j < n; ++j) acc[j] += w * v[j];
  } else {
    for (; i < n; ++i) acc[i] += w * static_cast<float>(v[i]);
  }
}

// dst[i] = src[i], rounded to the pool's type (one token's row: the bfloat16 rounding stays scalar)
template <typename T>
void store_row(T* dst, const float* src, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(src, src + n, dst);
  } else {
    int64_t i = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, Half>) {
      for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
    }
#endif
    for (; i < n; ++i) dst[i] = T(src[i]);
  }
}

// out[g * out_stride + i] += sum_j w[g * w_stride + j] * v[j * row + i] (i < D) for `group` query heads sharing
// the value rows: the weighted sum of a run of a sequence's values (rows of one block of the pool).
template <typename T>
void add_weighted_rows(const T* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t group,
                       int64_t D, float* out, int64_t out_stride) {
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    for_head_blocks(group, [&](auto heads, int64_t g) {
      add_weighted_rows_chunks<decltype(heads)::value>(v, row, count, w + g * w_stride, w_stride, D,
                                                       out + g * out_stride, out_stride);
    });
    return;
  }
#endif
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t j = 0; j < count; ++j) add_scaled_row(out + g * out_stride, w[g * w_stride + j], v + j * row, D);
  }
}

// The same three for a q8_0 pool: a key row's dot products, a run of value rows' weighted sums (`row` in blocks) and
// the store, on the codes and scales (quant/kv_q8.h).
inline void dot_group(const float* q, const KvQ8Block* k, int64_t D, int64_t group, float scale, float* out,
                      int64_t stride) {
  for_head_blocks(group, [&](auto heads, int64_t g) {
    kv_q8::kv_q8_dot<decltype(heads)::value>(q + g * D, k, D, scale, out + g * stride, stride);
  });
}

inline void add_weighted_rows(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride,
                              int64_t group, int64_t D, float* out, int64_t out_stride) {
  for_head_blocks(group, [&](auto heads, int64_t g) {
    kv_q8::kv_q8_add_rows<decltype(heads)::value>(v, row, count, w + g * w_stride, w_stride, D, out + g * out_stride,
                                                  out_stride);
  });
}

inline void store_row(KvQ8Block* dst, const float* src, int64_t n) { kv_q8::kv_q8_quantize(src, n, dst); }

// Run f(T()) with T the element type of a KV cache tensor (float, Half, BFloat16, or KvQ8Block for an int8 pool of
// q8_0 blocks), checked.
template <typename F>
void with_pool_type(const torch::Tensor& cache, F f) {
  switch (cache.scalar_type()) {
    case torch::kFloat: f(float()); break;
    case torch::kHalf: f(Half()); break;
    case torch::kBFloat16: f(BFloat16()); break;
    case torch::kChar: f(KvQ8Block()); break;
    default: TORCH_CHECK(false, "the KV pool must be float32, float16, bfloat16 or q8_0 (int8)");
  }
}

// Check that a KV cache tensor is [blocks, block_size, kv_heads, row] with the row of head_dim values its type
// takes (head_dim; q8_0: head_dim / 32 blocks of 34 bytes).
inline void check_pool_rows(const torch::Tensor& cache, int64_t kv_heads, int64_t head_dim) {
  TORCH_CHECK(cache.dim() == 4 && cache.size(2) == kv_heads, "the KV pool must be [blocks, block, kv_heads, row]");
  if (cache.scalar_type() == torch::kChar) {
    TORCH_CHECK(head_dim % 32 == 0 && cache.size(3) == head_dim / 32 * static_cast<int64_t>(sizeof(KvQ8Block)),
                "a q8_0 pool's rows are head_dim / 32 blocks of 34 bytes");
  } else {
    TORCH_CHECK(cache.size(3) == head_dim, "the KV pool's rows must be head_dim wide");
  }
}

}  // namespace
