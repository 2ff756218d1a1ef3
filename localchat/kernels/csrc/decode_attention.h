// One call per layer for a batch of decodes on the CPU (one query token per sequence): rotary embedding
// of q and k (neox halves), the store of k and v into the paged pool, and attention of every query head
// over its sequence's keys. The torch reference path runs about 25 small ops for the same work, each
// costing more in dispatch than in arithmetic at batch 1.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

void rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

// qkv: [T, (Hq + 2 Hkv) * D] float32, rotated in place; caches: [blocks, block_size, Hkv, D] float32;
// cos/sin: [T, rotary_dim / 2]; slot_mapping: [T] int64; block_tables: [T, max_blocks] int32;
// seq_lens: [T] int32 (keys per sequence, this token's included). Returns [T, Hq * D].
torch::Tensor decode_attention(torch::Tensor qkv, torch::Tensor k_cache, torch::Tensor v_cache,
                               const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slot_mapping,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens, int64_t num_heads,
                               int64_t num_kv_heads, int64_t head_dim, double scale) {
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32");
  TORCH_CHECK(k_cache.scalar_type() == torch::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "the KV pool must be contiguous float32");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == torch::kFloat, "cos/sin: float32");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kInt &&
              seq_lens.scalar_type() == torch::kInt, "metadata dtypes");
  const int64_t T = qkv.size(0);
  const int64_t D = head_dim, Hq = num_heads, Hkv = num_kv_heads, group = Hq / Hkv;
  const int64_t row = (Hq + 2 * Hkv) * D;
  TORCH_CHECK(qkv.size(1) == row, "qkv width does not match the heads");
  const int64_t half = cos.size(1);
  const int64_t block_size = k_cache.size(1);
  const int64_t max_blocks = block_tables.size(1);
  const torch::Tensor tables = block_tables.contiguous();
  float* qkv_p = qkv.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const float* cos_p = cos.data_ptr<float>();
  const float* sin_p = sin.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int32_t* table_p = tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  torch::Tensor out = torch::empty({T, Hq * D}, torch::kFloat);
  float* out_p = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, T * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int64_t> key_rows;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / Hkv, h = task % Hkv;
      float* q = qkv_p + t * row + h * group * D;
      float* k = qkv_p + t * row + Hq * D + h * D;
      const float* v = qkv_p + t * row + (Hq + Hkv) * D + h * D;
      const float* c = cos_p + t * half;
      const float* s = sin_p + t * half;
      for (int64_t g = 0; g < group; ++g) rotate(q + g * D, c, s, half);
      rotate(k, c, s, half);
      if (slots[t] >= 0) {
        std::copy(k, k + D, kc + (slots[t] * Hkv + h) * D);
        std::copy(v, v + D, vc + (slots[t] * Hkv + h) * D);
      }
      const int64_t length = lens[t];
      scores.resize(length);
      const int32_t* table = table_p + t * max_blocks;
      // the pool rows of this sequence's keys, in order (one lookup per block, not per key)
      key_rows.resize(length);
      for (int64_t j = 0; j < length; j += block_size) {
        const int64_t base = static_cast<int64_t>(table[j / block_size]) * block_size;
        for (int64_t i = 0; i < block_size && j + i < length; ++i) key_rows[j + i] = ((base + i) * Hkv + h) * D;
      }
      for (int64_t g = 0; g < group; ++g) {
        const float* qh = q + g * D;
        float top = -INFINITY;
        for (int64_t j = 0; j < length; ++j) {
          scores[j] = dot(qh, kc + key_rows[j], D) * fscale;
          top = std::max(top, scores[j]);
        }
        float total = 0.f;
        for (int64_t j = 0; j < length; ++j) {
          scores[j] = std::exp(scores[j] - top);
          total += scores[j];
        }
        const float inv_total = 1.f / total;
        float* o = out_p + t * Hq * D + (h * group + g) * D;
        std::fill(o, o + D, 0.f);
        for (int64_t j = 0; j < length; ++j) {
          const float* vj = vc + key_rows[j];
          const float p = scores[j] * inv_total;
#pragma omp simd
          for (int64_t i = 0; i < D; ++i) o[i] += p * vj[i];
        }
      }
    }
  });
  return out;
}
