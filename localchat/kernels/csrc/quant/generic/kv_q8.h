// The q8_0 KV pool's rows in plain C++ (kernels/kv_quant.py has their torch reference): a KV head's row of D values
// (D a multiple of 32) is D / 32 of llama.cpp's Q8_0 blocks, a float16 scale d = max|x| / 127 and 32 int8 codes
// round(x * (1 / d)) (to nearest even). Attention reads the codes as they are: a key's dot product with a query and
// a value's weighted sum take each code times its block's scale (exact in float32), never a dequantized copy of a
// row. The vector loops of quant/kv_q8.h (every ISA's, on its vector API) give the same codes bit for bit and the
// same sums to float rounding (the standalone kernel test checks both); quant/kv_q8.h picks them or these.
#pragma once
#include "../common.h"

namespace {

// One block of a q8_0 row, as llama.cpp's block_q8_0 (34 bytes).
struct KvQ8Block {
  uint16_t d;  // float16 scale
  int8_t qs[32];
};
static_assert(sizeof(KvQ8Block) == 34, "a q8_0 block is 34 bytes");

namespace generic {

// The scale of a block of 32 values: max|x| / 127, and its inverse (0 for a block of zeros).
inline void kv_q8_scale(const float* x, float& d, float& inverse) {
  float top = 0.f;
  for (int i = 0; i < 32; ++i) top = std::max(top, std::fabs(x[i]));
  d = top / 127.f;
  inverse = d > 0.f ? 1.f / d : 0.f;
}

// x[0, n) (n a multiple of 32) as n / 32 blocks.
inline void kv_q8_quantize(const float* x, int64_t n, KvQ8Block* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float d, inverse;
    kv_q8_scale(x + 32 * b, d, inverse);
    out[b].d = float_to_half(d);
    for (int i = 0; i < 32; ++i) out[b].qs[i] = static_cast<int8_t>(std::nearbyint(x[32 * b + i] * inverse));
  }
}

// out[g * stride] = scale * sum_i q[g * D + i] * k_i for G query heads sharing the key row k (D values), summed in 16
// lanes (lane i % 16) as the AVX-512 build's vector loop does.
template <int G>
void kv_q8_dot(const float* q, const KvQ8Block* k, int64_t D, float scale, float* out, int64_t stride) {
  float acc[G][16] = {};
  for (int64_t b = 0; b < D / 32; ++b) {
    const float d = half_to_float(k[b].d);
    for (int i = 0; i < 32; ++i) {
      const float value = static_cast<float>(k[b].qs[i]) * d;
      for (int g = 0; g < G; ++g) acc[g][i % 16] += q[g * D + 32 * b + i] * value;
    }
  }
  for (int g = 0; g < G; ++g) {
    float sum = 0.f;
    for (float lane : acc[g]) sum += lane;
    out[g * stride] = sum * scale;
  }
}

// out[g * out_stride + i] += sum_j w[g * w_stride + j] * v_j[i] (i < D) for G query heads over `count` value rows
// `row` blocks apart (a run of one block of the pool): each head's sums over the run first, then added to out.
template <int G>
void kv_q8_add_rows(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
                    float* out, int64_t out_stride) {
  for (int64_t b = 0; b < D / 32; ++b) {
    float acc[G][32] = {};
    for (int64_t j = 0; j < count; ++j) {
      const KvQ8Block& block = v[j * row + b];
      const float d = half_to_float(block.d);
      for (int g = 0; g < G; ++g) {
        const float weight = w[g * w_stride + j];
        for (int i = 0; i < 32; ++i) acc[g][i] += weight * (static_cast<float>(block.qs[i]) * d);
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < 32; ++i) out[g * out_stride + 32 * b + i] += acc[g][i];
    }
  }
}

}  // namespace generic
}  // namespace
