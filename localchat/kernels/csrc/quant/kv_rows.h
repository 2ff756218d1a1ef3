// The paged KV pool's float32, float16 and bfloat16 row functions of this build (quant/generic/kv_rows.h describes
// RowType and each function): written once here against the vector API (quant/vec.h), kWidth values at a time,
// 16-bit ones widened in registers, and a run of value rows keeping its G heads' sums of kColumns vectors of columns
// in registers. The ISA builds take these; the generic build the plain C++ ones. Nothing here needs torch.
#pragma once
#include <iterator>

#include "generic/kv_rows.h"
#include "vec.h"

namespace {
namespace vec {

// p[0, kWidth) of a row of type R as float32 (exact)
template <RowType R>
inline F32 load_row(const RowElement<R>* p) {
  if constexpr (R == RowType::kFloat) return load(p);
  else if constexpr (R == RowType::kHalf) return load_f16(p);
  else return load_bf16(p);
}

template <RowType R>
float dot_row(const float* q, const RowElement<R>* k, int64_t n) {
  int64_t i = 0;
  F32 acc = zero();
  for (; i + kWidth <= n; i += kWidth) acc = fma(load(q + i), load_row<R>(k + i), acc);
  float sum = reduce_add(acc);
  for (; i < n; ++i) sum += q[i] * widen<R>(k[i]);
  return sum;
}

// G independent sums in flight, each vector of k loaded (and widened) once for all G.
template <int G, RowType R>
void dot_heads(const float* q, const RowElement<R>* k, int64_t D, float scale, float* out, int64_t stride) {
  if (D % kWidth == 0) {
    F32 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = zero();
    for (int64_t i = 0; i < D; i += kWidth) {
      const F32 kc = load_row<R>(k + i);
      for (int g = 0; g < G; ++g) acc[g] = fma(load(q + g * D + i), kc, acc[g]);
    }
    for (int g = 0; g < G; ++g) out[g * stride] = reduce_add(acc[g]) * scale;
    return;
  }
  for (int g = 0; g < G; ++g) out[g * stride] = dot_row<R>(q + g * D, k, D) * scale;
}

// dot_heads for up to kDotKeys keys, each score the same bits: the keys widened once into float32 for the G heads,
// then each head's dot products over kWidth keys at a time, column by column (kWidth sums in flight, the query's
// vector loaded once for all of them), and the keys' lane sums reduced together (reduce_add_lanes), where one key
// at a time spends most of a short dot product on its own reduction. A chunk of fewer keys repeats its first row in
// the lanes past them (their sums are dropped).
template <int G, RowType R>
void dot_keys(const float* q, const RowElement<R>* const* k, int count, int64_t D, float scale, float* out,
              int64_t stride) {
  constexpr int64_t kMaxD = 256;
  static_assert(kDotKeys % kWidth == 0, "a chunk of keys is whole vectors of sums");
  if (!kChunkDots || D % kWidth != 0 || D > kMaxD) {
    for (int j = 0; j < count; ++j) dot_heads<G, R>(q, k[j], D, scale, out + j, stride);
    return;
  }
  alignas(64) float widened[R == RowType::kFloat ? 1 : kDotKeys * kMaxD];
  const float* rows[kDotKeys];
  for (int j = 0; j < count; ++j) {
    if constexpr (R == RowType::kFloat) {
      rows[j] = k[j];
    } else {
      float* row = widened + j * D;
      for (int64_t i = 0; i < D; i += kWidth) store(row + i, load_row<R>(k[j] + i));
      rows[j] = row;
    }
  }
  for (int j = count; j < kDotKeys; ++j) rows[j] = rows[0];
  for (int g = 0; g < G; ++g) {
    const float* qg = q + g * D;
    for (int j0 = 0; j0 < count; j0 += kWidth) {
      F32 acc[kWidth];
      for (int j = 0; j < kWidth; ++j) acc[j] = zero();
      for (int64_t i = 0; i < D; i += kWidth) {
        const F32 qi = load(qg + i);
        for (int j = 0; j < kWidth; ++j) acc[j] = fma(qi, load(rows[j0 + j] + i), acc[j]);
      }
      Partial parts[kWidth];
      for (int j = 0; j < kWidth; ++j) parts[j] = partial_sum(acc[j]);
      const F32 sums = mul(reduce_add_lanes(parts), splat(scale));
      float* o = out + g * stride + j0;
      const int n = std::min(kWidth, count - j0);
      if (n == kWidth) {
        store(o, sums);
      } else {
        alignas(64) float lanes[kWidth];
        store(lanes, sums);
        std::copy(lanes, lanes + n, o);
      }
    }
  }
}

template <RowType R>
void add_scaled_row(float* acc, float w, const RowElement<R>* v, int64_t n) {
  int64_t i = 0;
  const F32 weight = splat(w);
  for (; i + kWidth <= n; i += kWidth) store(acc + i, fma(weight, load_row<R>(v + i), load(acc + i)));
  generic::add_scaled_row<R>(acc + i, w, v + i, n - i);
}

// out[g * out_stride + kWidth c + l] += sum_j w[g * w_stride + j] * vc[c][l] for C vectors of columns, where
// rows(j, vc) loads row j's (the G x C sums stay in registers for the whole run, and each row's vectors are loaded
// once for all G heads). kv_q8.h's value sums take it too.
template <int G, int C, typename Rows>
void add_columns(Rows rows, int64_t count, const float* w, int64_t w_stride, float* out, int64_t out_stride) {
  F32 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) acc[g][c] = zero();
  }
  for (int64_t j = 0; j < count; ++j) {
    F32 vc[C];
    rows(j, vc);
    for (int g = 0; g < G; ++g) {
      const F32 wg = splat(w[g * w_stride + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = fma(wg, vc[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      float* o = out + g * out_stride + kWidth * c;
      store(o, add(load(o), acc[g][c]));
    }
  }
}

// add_columns over `columns` vectors of columns (1 to kColumns).
template <int G, typename Rows, int C = kColumns>
void add_columns_upto(int64_t columns, Rows rows, int64_t count, const float* w, int64_t w_stride, float* out,
                      int64_t out_stride) {
  if constexpr (C > 1) {
    if (columns < C) return add_columns_upto<G, Rows, C - 1>(columns, rows, count, w, w_stride, out, out_stride);
  }
  add_columns<G, C>(rows, count, w, w_stride, out, out_stride);
}

template <int G, RowType R>
void add_rows(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
              float* out, int64_t out_stride) {
  if (D % kWidth == 0) {
    for (int64_t i = 0; i < D; i += kWidth * kColumns) {
      const auto rows = [first = v + i, row](int64_t j, auto& vc) {
        for (size_t c = 0; c < std::size(vc); ++c) vc[c] = load_row<R>(first + j * row + kWidth * c);
      };
      add_columns_upto<G>((D - i) / kWidth, rows, count, w, w_stride, out + i, out_stride);
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
    for (; i + kWidth <= n; i += kWidth) store_f16(dst + i, load(src + i));
  }
  generic::store_row<R>(dst + i, src + i, n - i);
}

}  // namespace vec

namespace kv_rows {
#if LC_VEC
using vec::add_rows;
using vec::add_scaled_row;
using vec::dot_heads;
using vec::dot_keys;
using vec::dot_row;
using vec::store_row;
#else
using generic::add_rows;
using generic::add_scaled_row;
using generic::dot_heads;
using generic::dot_keys;
using generic::dot_row;
using generic::store_row;
#endif
}  // namespace kv_rows
}  // namespace
