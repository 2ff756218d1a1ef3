// The paged KV pool's float32, float16 and bfloat16 rows in plain C++ (kv_rows.h uses them; a q8_0 pool's rows are
// kv_q8.h's): a key row's dot product with a float32 query, the weighted sum of value rows into float32
// accumulators, and the store of a float32 row. A 16-bit row is read as its bits (RowElement: c10::Half and
// c10::BFloat16 hold nothing else) and widened to float32 exactly; a row is stored rounded to nearest even, as
// torch's .to() rounds (float16: float_to_half; bfloat16: c10's round_to_nearest_even, NaN as 0x7FC0). The vector
// loops of quant/kv_rows.h (every ISA's, on its vector API) store the same bits and sum in other lanes (float
// rounding; the standalone kernel test checks both); quant/kv_rows.h picks them or these.
#pragma once
#include "../common.h"

namespace {

// A pool row's element type.
enum class RowType { kFloat, kHalf, kBFloat16 };
template <RowType R>
using RowElement = std::conditional_t<R == RowType::kFloat, float, uint16_t>;

inline float bfloat16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, 4);
  return out;
}

inline uint16_t float_to_bfloat16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16);
}

// An element of a row of type R as float32 (exact), and a float32 rounded to R.
template <RowType R>
inline float widen(RowElement<R> x) {
  if constexpr (R == RowType::kFloat) return x;
  else if constexpr (R == RowType::kHalf) return half_to_float(x);
  else return bfloat16_to_float(x);
}

template <RowType R>
inline RowElement<R> narrow(float x) {
  if constexpr (R == RowType::kFloat) return x;
  else if constexpr (R == RowType::kHalf) return float_to_half(x);
  else return float_to_bfloat16(x);
}

// Key rows a dot_keys call takes at most (a chunk of a sequence's keys).
constexpr int kDotKeys = 16;

namespace generic {

// sum_i q[i] * k[i]
template <RowType R>
float dot_row(const float* q, const RowElement<R>* k, int64_t n) {
  float sum = 0.f;
  if constexpr (R == RowType::kFloat) {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += q[i] * k[i];
  } else {
    for (int64_t i = 0; i < n; ++i) sum += q[i] * widen<R>(k[i]);
  }
  return sum;
}

// out[g * stride] = scale * sum_i q[g * D + i] * k[i] for G query heads that share the key row k.
template <int G, RowType R>
void dot_heads(const float* q, const RowElement<R>* k, int64_t D, float scale, float* out, int64_t stride) {
  for (int g = 0; g < G; ++g) out[g * stride] = dot_row<R>(q + g * D, k, D) * scale;
}

// out[g * stride + j] = scale * sum_i q[g * D + i] * k[j][i] for G query heads and count (at most kDotKeys) key
// rows k[j]: dot_heads for each key.
template <int G, RowType R>
void dot_keys(const float* q, const RowElement<R>* const* k, int count, int64_t D, float scale, float* out,
              int64_t stride) {
  for (int j = 0; j < count; ++j) dot_heads<G, R>(q, k[j], D, scale, out + j, stride);
}

// acc[i] += w * v[i]
template <RowType R>
void add_scaled_row(float* acc, float w, const RowElement<R>* v, int64_t n) {
  if constexpr (R == RowType::kFloat) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) acc[i] += w * v[i];
  } else {
    for (int64_t i = 0; i < n; ++i) acc[i] += w * widen<R>(v[i]);
  }
}

// out[g * out_stride + i] += sum_j w[g * w_stride + j] * v[j * row + i] (i < D) for G query heads over `count`
// value rows `row` elements apart (a run of one block of the pool).
template <int G, RowType R>
void add_rows(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
              float* out, int64_t out_stride) {
  for (int g = 0; g < G; ++g) {
    for (int64_t j = 0; j < count; ++j) add_scaled_row<R>(out + g * out_stride, w[g * w_stride + j], v + j * row, D);
  }
}

// dst[i] = src[i], rounded to the row's type
template <RowType R>
void store_row(RowElement<R>* dst, const float* src, int64_t n) {
  if constexpr (R == RowType::kFloat) {
    std::copy(src, src + n, dst);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = narrow<R>(src[i]);
  }
}

}  // namespace generic
}  // namespace
