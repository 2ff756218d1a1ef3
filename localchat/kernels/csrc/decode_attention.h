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

// One decode token's view of the pool and its shapes.
struct DecodeToken {
  float* qkv;          // [(Hq + 2 Hkv) * D], rotated in place
  float* out;          // [Hq * D]
  const float* cos;    // [half]
  const float* sin;
  int64_t slot;        // where this token's k/v go (-1: nowhere)
  const int32_t* table;
  int64_t length;      // keys to attend to, this token's included
};

struct PoolShape {
  float* k_cache;
  float* v_cache;
  int64_t num_heads, num_kv_heads, head_dim, half, block_size;
  float scale;
};

// Rotary for KV head h of one token and its group of query heads, and the store of its key and value.
void rope_and_store(const DecodeToken& t, const PoolShape& p, int64_t h) {
  const int64_t D = p.head_dim, Hq = p.num_heads, Hkv = p.num_kv_heads, group = Hq / Hkv;
  float* q = t.qkv + h * group * D;
  float* k = t.qkv + Hq * D + h * D;
  const float* v = t.qkv + (Hq + Hkv) * D + h * D;
  for (int64_t g = 0; g < group; ++g) rotate(q + g * D, t.cos, t.sin, p.half);
  rotate(k, t.cos, t.sin, p.half);
  if (t.slot >= 0) {
    std::copy(k, k + D, p.k_cache + (t.slot * Hkv + h) * D);
    std::copy(v, v + D, p.v_cache + (t.slot * Hkv + h) * D);
  }
}

// Attention of query head qh (already rotated) over its sequence's keys, which are all in the pool.
void attend_query_head(const DecodeToken& t, const PoolShape& p, int64_t qh, std::vector<float>& scores,
                       std::vector<int64_t>& key_rows) {
  const int64_t D = p.head_dim, Hkv = p.num_kv_heads, h = qh / (p.num_heads / Hkv);
  // the pool rows of this sequence's keys, in order (one lookup per block, not per key)
  scores.resize(t.length);
  key_rows.resize(t.length);
  for (int64_t j = 0; j < t.length; j += p.block_size) {
    const int64_t base = static_cast<int64_t>(t.table[j / p.block_size]) * p.block_size;
    for (int64_t i = 0; i < p.block_size && j + i < t.length; ++i) key_rows[j + i] = ((base + i) * Hkv + h) * D;
  }
  const float* q = t.qkv + qh * D;
  float top = -INFINITY;
  for (int64_t j = 0; j < t.length; ++j) {
    scores[j] = dot(q, p.k_cache + key_rows[j], D) * p.scale;
    top = std::max(top, scores[j]);
  }
  float total = 0.f;
  for (int64_t j = 0; j < t.length; ++j) {
    scores[j] = std::exp(scores[j] - top);
    total += scores[j];
  }
  const float inv_total = 1.f / total;
  float* o = t.out + qh * D;
  std::fill(o, o + D, 0.f);
  for (int64_t j = 0; j < t.length; ++j) {
    const float* vj = p.v_cache + key_rows[j];
    const float w = scores[j] * inv_total;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) o[i] += w * vj[i];
  }
}

// Both, for KV head h and its query heads.
void attend_kv_head(const DecodeToken& t, const PoolShape& p, int64_t h, std::vector<float>& scores,
                    std::vector<int64_t>& key_rows) {
  rope_and_store(t, p, h);
  const int64_t group = p.num_heads / p.num_kv_heads;
  for (int64_t g = 0; g < group; ++g) attend_query_head(t, p, h * group + g, scores, key_rows);
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
  const int64_t row = (num_heads + 2 * num_kv_heads) * head_dim;
  TORCH_CHECK(qkv.size(1) == row, "qkv width does not match the heads");
  const torch::Tensor tables = block_tables.contiguous();
  const PoolShape pool{k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), num_heads, num_kv_heads, head_dim,
                       cos.size(1), k_cache.size(1), static_cast<float>(scale)};
  torch::Tensor out = torch::empty({T, num_heads * head_dim}, torch::kFloat);
  float* qkv_p = qkv.data_ptr<float>();
  float* out_p = out.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  at::parallel_for(0, T * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int64_t> key_rows;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / num_kv_heads, h = task % num_kv_heads;
      const DecodeToken token{qkv_p + t * row, out_p + t * num_heads * head_dim, cos.data_ptr<float>() + t * pool.half,
                              sin.data_ptr<float>() + t * pool.half, slots[t],
                              tables.data_ptr<int32_t>() + t * tables.size(1), lens[t]};
      attend_kv_head(token, pool, h, scores, key_rows);
    }
  });
  return out;
}
