// The paged KV pool's rows on the CPU, float32, float16, bfloat16 or q8_0: the loads, the dot product with a
// float32 query, the weighted sum into a float32 accumulator, and the store. A 16-bit pool reads half the bytes per
// key (decode attention over a long context is bound by them); its rows are widened to float32 as they are read,
// and rounded to nearest even when stored, as torch's .to() rounds. A q8_0 pool (kernels/kv_quant.py) reads 0.53x
// of float16's: its rows are blocks of int8 codes and a scale (quant/kv_q8.h), quantized when stored and read as
// codes times their scale; pointers into it count blocks (pool_units), not values.
#pragma once
#include "torch_api.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "quant/kv_q8.h"
#include "quant/kv_rows.h"

namespace {

using Half = c10::Half;
using BFloat16 = c10::BFloat16;

// Elements of T per row of D values in the pool: D, or D / 32 q8_0 blocks.
template <typename T>
constexpr int64_t pool_units(int64_t D) {
  if constexpr (std::is_same_v<T, KvQ8Block>) return D / 32;
  else return D;
}

// The row functions' type for a pool of T (float, Half or BFloat16), and a row of T as they read it (c10::Half and
// c10::BFloat16 are their 16 bits).
template <typename T>
constexpr RowType row_type() {
  if constexpr (std::is_same_v<T, Half>) return RowType::kHalf;
  else if constexpr (std::is_same_v<T, BFloat16>) return RowType::kBFloat16;
  else return RowType::kFloat;
}

template <typename T>
RowElement<row_type<T>()>* elements(T* row) {
  static_assert(sizeof(T) == sizeof(RowElement<row_type<T>()>), "a row element is its bits");
  return reinterpret_cast<RowElement<row_type<T>()>*>(row);
}

template <typename T>
const RowElement<row_type<T>()>* elements(const T* row) {
  return elements(const_cast<T*>(row));
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

// out[g * stride + j] = scale * sum_i q[g * D + i] * k_j[i] for `group` query heads that share the `count` (at most
// kDotKeys) key rows k_j = rows[j] + offset: G heads at a time, each key's chunks loaded (and widened) once for all
// G, the keys' sums reduced together (quant/kv_rows.h: dot_heads' bits, key by key).
template <typename T>
void dot_group_keys(const float* q, const T* const* rows, int64_t offset, int count, int64_t D, int64_t group,
                    float scale, float* out, int64_t stride) {
  const RowElement<row_type<T>()>* k[kDotKeys];
  for (int j = 0; j < count; ++j) k[j] = elements(rows[j] + offset);
  for_head_blocks(group, [&](auto heads, int64_t g) {
    kv_rows::dot_keys<decltype(heads)::value, row_type<T>()>(q + g * D, k, count, D, scale, out + g * stride, stride);
  });
}

// dst[i] = src[i], rounded to the pool's type
template <typename T>
void store_row(T* dst, const float* src, int64_t n) {
  kv_rows::store_row<row_type<T>()>(elements(dst), src, n);
}

// out[g * out_stride + i] += sum_j w[g * w_stride + j] * v[j * row + i] (i < D) for `group` query heads sharing
// the value rows: the weighted sum of a run of a sequence's values (rows of one block of the pool), G heads at a
// time, their sums kept in registers over the run where the ISA can (quant/kv_rows.h).
template <typename T>
void add_weighted_rows(const T* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t group,
                       int64_t D, float* out, int64_t out_stride) {
  for_head_blocks(group, [&](auto heads, int64_t g) {
    kv_rows::add_rows<decltype(heads)::value, row_type<T>()>(elements(v), row, count, w + g * w_stride, w_stride, D,
                                                             out + g * out_stride, out_stride);
  });
}

// The same three for a q8_0 pool: a chunk of key rows' dot products (key by key, on the codes and scales), a run of
// value rows' weighted sums (`row` in blocks) and the store (quant/kv_q8.h).
inline void dot_group_keys(const float* q, const KvQ8Block* const* rows, int64_t offset, int count, int64_t D,
                           int64_t group, float scale, float* out, int64_t stride) {
  for (int j = 0; j < count; ++j) {
    for_head_blocks(group, [&](auto heads, int64_t g) {
      kv_q8::kv_q8_dot<decltype(heads)::value>(q + g * D, rows[j] + offset, D, scale, out + g * stride + j, stride);
    });
  }
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
