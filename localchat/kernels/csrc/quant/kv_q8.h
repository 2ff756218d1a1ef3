// The q8_0 KV pool's row functions of this build (quant/generic/kv_q8.h describes KvQ8Block and each function):
// written once here against the vector API (quant/vec.h), kWidth codes at a time widened to floats and multiplied by
// their block's scale in registers; the codes are the generic quantize's bit for bit. The ISA builds take these; the
// generic build the plain C++ ones. Nothing here needs torch.
#pragma once
#include "generic/kv_q8.h"
#include "kv_rows.h"

namespace {
namespace vec {

inline void kv_q8_quantize(const float* x, int64_t n, KvQ8Block* out) {
  constexpr int kVectors = 32 / kWidth;
  for (int64_t b = 0; b < n / 32; ++b) {
    F32 v[kVectors];
    for (int c = 0; c < kVectors; ++c) v[c] = load(x + 32 * b + kWidth * c);
    F32 top = abs(v[0]);
    for (int c = 1; c < kVectors; ++c) top = max(abs(v[c]), top);
    const float d = reduce_max(top) / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
    out[b].d = float_to_half(d);
    const F32 scale = splat(inverse);
    for (int c = 0; c < kVectors; ++c) v[c] = mul(v[c], scale);
    store_codes32(out[b].qs, v);
  }
}

template <int G>
void kv_q8_dot(const float* q, const KvQ8Block* k, int64_t D, float scale, float* out, int64_t stride) {
  F32 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = zero();
  for (int64_t b = 0; b < D / 32; ++b) {
    const F32 d = splat(half_to_float(k[b].d));
    for (int h = 0; h < 32 / kWidth; ++h) {
      const F32 kc = mul(load_i8(k[b].qs + kWidth * h), d);
      for (int g = 0; g < G; ++g) acc[g] = fma(load(q + g * D + 32 * b + kWidth * h), kc, acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) out[g * stride] = reduce_add(acc[g]) * scale;
}

// kv_rows.h's add_columns over runs of kColumns vectors of columns: a run starts a block or lies in one (quant/vec.h
// asserts it), so each row's scale is read once a block.
template <int G>
void kv_q8_add_rows(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
                    float* out, int64_t out_stride) {
  for (int64_t i = 0; i < D; i += kWidth * kColumns) {  // (D is a multiple of 32)
    const auto rows = [first = v + i / 32, row, offset = i % 32](int64_t j, auto& vc) {
      const KvQ8Block* block = first + j * row;
      F32 d = splat(half_to_float(block->d));
      for (size_t c = 0; c < std::size(vc); ++c) {
        if (c > 0 && (kWidth * c) % 32 == 0) {  // the run's second block
          ++block;
          d = splat(half_to_float(block->d));
        }
        vc[c] = mul(load_i8(block->qs + (offset + kWidth * c) % 32), d);
      }
    };
    add_columns_upto<G>((D - i) / kWidth, rows, count, w, w_stride, out + i, out_stride);
  }
}

}  // namespace vec

namespace kv_q8 {
#if LC_VEC
using vec::kv_q8_add_rows;
using vec::kv_q8_dot;
using vec::kv_q8_quantize;
#else
using generic::kv_q8_add_rows;
using generic::kv_q8_dot;
using generic::kv_q8_quantize;
#endif
}  // namespace kv_q8
}  // namespace
