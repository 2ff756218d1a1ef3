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

#include "vector_math.h"

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

// exp(x - top) in place over n scores; returns their sum (the exp vectorized where AVX-512 or AVX2 is).
float exp_shifted(float* x, int64_t n, float top) {
  float total = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 shift = _mm512_set1_ps(top);
  __m512 sums = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), shift));
    _mm512_storeu_ps(x + i, e);
    sums = _mm512_add_ps(sums, e);
  }
  total = _mm512_reduce_add_ps(sums);
#elif LC_EXP256
  const __m256 shift = _mm256_set1_ps(top);
  alignas(32) float lanes[8];
  __m256 sums = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(x + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  _mm256_store_ps(lanes, sums);
  for (float lane : lanes) total += lane;
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - top);
    total += x[i];
  }
  return total;
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
  const float inv_total = 1.f / exp_shifted(scores.data(), t.length, top);
  float* o = t.out + qh * D;
  std::fill(o, o + D, 0.f);
  for (int64_t j = 0; j < t.length; ++j) {
    const float* vj = p.v_cache + key_rows[j];
    const float w = scores[j] * inv_total;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) o[i] += w * vj[i];
  }
}

// Keys ahead of the one in use whose rows are prefetched (see attend_partial).
constexpr int64_t kPrefetchKeys = 16;

// A share of one token's attention, for splitting a sequence's keys between threads: every query head
// (queries: [Hq * D], rotated) over keys [j0, j1). Keys are visited in pool order, each key's row (all KV heads,
// contiguous) read once for all query heads, so a block of the pool streams through in sequence. The current
// token's key and value (the last, not read from the pool: another thread may still be storing them) come as
// cur_k / cur_v [Hkv * D]. partials: [Hq][D + 2] = (m, l, acc) with m the top score, l = sum_j exp(s_j - m),
// acc = sum_j exp(s_j - m) v_j; an empty range gives m = -inf, l = 0.
void attend_partial(const float* queries, const DecodeToken& t, const PoolShape& p, int64_t j0, int64_t j1,
                    const float* cur_k, const float* cur_v, std::vector<float>& scores, float* partials) {
  const int64_t D = p.head_dim, Hq = p.num_heads, Hkv = p.num_kv_heads, group = Hq / Hkv;
  const int64_t n = std::max<int64_t>(j1 - j0, 0), pooled = t.length - 1, row = Hkv * D;
  for (int64_t qh = 0; qh < Hq; ++qh) {
    float* part = partials + qh * (D + 2);
    part[0] = -INFINITY;
    part[1] = 0.f;
    std::fill(part + 2, part + 2 + D, 0.f);
  }
  if (n == 0) return;
  scores.resize(Hq * n);
  auto key_row = [&](int64_t j, const float* pool, const float* current) {
    if (j >= pooled) return current;
    return pool + (static_cast<int64_t>(t.table[j / p.block_size]) * p.block_size + j % p.block_size) * row;
  };
  // a row a few keys ahead is fetched while this one is used: the rows of a block are contiguous, but blocks
  // sit anywhere in the pool, where no hardware prefetcher follows
  auto prefetch = [&](int64_t j, const float* pool) {
    if (j >= j1 || j >= pooled) return;
    const char* r = reinterpret_cast<const char*>(key_row(j, pool, nullptr));
    for (int64_t b = 0; b < row * 4; b += 64) __builtin_prefetch(r + b);
  };
  for (int64_t j = j0; j < j1; ++j) {
    const float* k = key_row(j, p.k_cache, cur_k);
    prefetch(j + kPrefetchKeys, p.k_cache);
    for (int64_t qh = 0; qh < Hq; ++qh) scores[qh * n + j - j0] = dot(queries + qh * D, k + qh / group * D, D) * p.scale;
  }
  for (int64_t qh = 0; qh < Hq; ++qh) {
    float* s = scores.data() + qh * n;
    float top = -INFINITY;
    for (int64_t i = 0; i < n; ++i) top = std::max(top, s[i]);
    partials[qh * (D + 2)] = top;
    partials[qh * (D + 2) + 1] = exp_shifted(s, n, top);
  }
  for (int64_t j = j0; j < j1; ++j) {
    const float* v = key_row(j, p.v_cache, cur_v);
    prefetch(j + kPrefetchKeys, p.v_cache);
    for (int64_t qh = 0; qh < Hq; ++qh) {
      float* acc = partials + qh * (D + 2) + 2;
      const float* vh = v + qh / group * D;
      const float w = scores[qh * n + j - j0];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += w * vh[d];
    }
  }
}

// The attention output [D] of one query head from the partials of `count` key ranges, `stride` floats apart.
void merge_partials(const float* partials, int64_t count, int64_t stride, int64_t D, float* out) {
  float top = -INFINITY;
  for (int64_t c = 0; c < count; ++c) top = std::max(top, partials[c * stride]);
  float total = 0.f;
  std::fill(out, out + D, 0.f);
  for (int64_t c = 0; c < count; ++c) {
    const float* part = partials + c * stride;
    if (part[1] == 0.f) continue;
    const float w = std::exp(part[0] - top);
    total += w * part[1];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] += w * part[2 + d];
  }
  const float inv = 1.f / total;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) out[d] *= inv;
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
