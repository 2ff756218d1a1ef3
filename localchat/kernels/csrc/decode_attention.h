// One call per layer for a batch of decodes on the CPU (one query token per sequence): rotary embedding
// of q and k (neox halves), the store of k and v into the paged pool, and attention of every query head
// over its sequence's keys. The torch reference path runs about 25 small ops for the same work, each
// costing more in dispatch than in arithmetic at batch 1. Options as kernels/attention.py has them: a
// sliding window (only its keys are read), a softcap on the scores, and a sink logit per query head.
#pragma once
#include "torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kv_rows.h"
#include "vector_math.h"

namespace {

void rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
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

// T: the pool's element type, float, Half, BFloat16 or KvQ8Block (kv_rows.h); a row of head_dim values is
// pool_units<T>(head_dim) of them.
template <typename T>
struct PoolShape {
  T* k_cache;
  T* v_cache;
  int64_t num_heads, num_kv_heads, head_dim, half, block_size;
  float scale;
  int64_t window = 0;            // a query sees its last `window` keys (0: all of them)
  float softcap = 0.f;           // scores s become softcap * tanh(s / softcap) (0: as they are)
  const float* sinks = nullptr;  // [num_heads] one more logit in each head's softmax sum, without a value
};

// Rotary for KV head h of one token and its group of query heads, and the store of its key and value.
template <typename T>
void rope_and_store(const DecodeToken& t, const PoolShape<T>& p, int64_t h) {
  const int64_t D = p.head_dim, E = pool_units<T>(D), Hq = p.num_heads, Hkv = p.num_kv_heads, group = Hq / Hkv;
  float* q = t.qkv + h * group * D;
  float* k = t.qkv + Hq * D + h * D;
  const float* v = t.qkv + (Hq + Hkv) * D + h * D;
  for (int64_t g = 0; g < group; ++g) rotate(q + g * D, t.cos, t.sin, p.half);
  rotate(k, t.cos, t.sin, p.half);
  if (t.slot >= 0) {
    store_row(p.k_cache + (t.slot * Hkv + h) * E, k, D);
    store_row(p.v_cache + (t.slot * Hkv + h) * E, v, D);
  }
}

// s[i] = cap * tanh(s[i] / cap) over n scores: tanh as a rational function (Eigen's, within 4e-7 relative),
// which the compiler vectorizes, where std::tanh would stay a scalar call per score.
void softcap_scores(float* s, int64_t n, float cap) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(std::max(s[i] / cap, -7.90531110763549805f), 7.90531110763549805f), x2 = x * x;
    float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    s[i] = cap * (x * p / q);
  }
}

// One token's part in attend_ranges: its rotated queries ([Hq * D]), its view of the pool, its key range [j0, j1),
// its own key and value (cur_k / cur_v: a row of Hkv * D values rounded to the pool's type, the last key, not read
// from the pool: another thread may still be storing them), and where its partials go.
template <typename T>
struct RangeRow {
  const float* queries;
  DecodeToken token;
  int64_t j0, j1;
  const T* cur_k;
  const T* cur_v;
  float* partials;
};

// Tokens attend_ranges takes at once.
constexpr int64_t kRangeRows = 16;

// The KV heads [h0, h1) (and their query heads) of `count` (at most kRangeRows) tokens over their key ranges, for
// splitting a sequence's keys between threads or its heads between tasks. Each token's partials:
// [(h1 - h0) * group][D + 2] = (m, l, acc) with m the top score (scores capped if p.softcap is set),
// l = sum_j exp(s_j - m), acc = sum_j exp(s_j - m) v_j; an empty range gives m = -inf, l = 0.
//
// Keys are visited in pool order a chunk of kDotKeys at a time, each chunk's rows read once for all the tokens and
// query heads while it is in the L1 cache, and each token's dot products of the chunk reduced together (dot_keys).
// Values go a run at a time (the keys in one block of the pool, whose rows are contiguous), each token's head
// group's sums kept in registers over its run (kv_rows.h), while the next block's rows are prefetched: blocks sit
// anywhere in the pool, where no hardware prefetcher follows. Several tokens are a speculative verify's drafted
// rows, whose ranges nearly coincide: together they read the range from memory once. Each token's partials are
// the same bits as on its own (the same scores, and the same runs summed in the same order).
template <typename T>
void attend_ranges(const PoolShape<T>& p, int64_t h0, int64_t h1, const RangeRow<T>* rows, int64_t count,
                   std::vector<float>& scores) {
  const int64_t D = p.head_dim, E = pool_units<T>(D), Hkv = p.num_kv_heads, group = p.num_heads / Hkv;
  const int64_t heads = (h1 - h0) * group, row = Hkv * E;
  // each head's scores `stride` floats apart: a multiple of 16 that is not one of 1024, so that the heads' rows
  // do not all fall into the same sets of the L1 cache, as they do 4 KiB apart
  int64_t stride[kRangeRows], offset[kRangeRows], total = 0, lo = INT64_MAX, hi = 0;
  for (int64_t m = 0; m < count; ++m) {
    const RangeRow<T>& r = rows[m];
    for (int64_t i = 0; i < heads; ++i) {
      float* part = r.partials + i * (D + 2);
      part[0] = -INFINITY;
      part[1] = 0.f;
      std::fill(part + 2, part + 2 + D, 0.f);
    }
    const int64_t n = std::max<int64_t>(r.j1 - r.j0, 0);
    stride[m] = (n + 15) / 16 * 16 + 16;
    offset[m] = total;
    total += heads * stride[m];
    if (n > 0) lo = std::min(lo, r.j0), hi = std::max(hi, r.j1);
  }
  if (lo >= hi) return;
  scores.resize(total);
  auto key_row = [&](const RangeRow<T>& r, int64_t j, const T* pool, const T* current) {
    if (j >= r.token.length - 1) return current;
    return pool + (static_cast<int64_t>(r.token.table[j / p.block_size]) * p.block_size + j % p.block_size) * row;
  };
  // the pool's rows of keys [j, j + n) within the first token's range, head h's
  auto prefetch = [&](const T* pool, int64_t j, int64_t n, int64_t h) {
    const RangeRow<T>& r = rows[0];
    const int64_t end = std::min({j + n, r.j1, r.token.length - 1});
    for (j = std::max(j, r.j0); j < end; ++j) prefetch_lines(key_row(r, j, pool, nullptr) + h * E, E * sizeof(T));
  };
  // a chunk's keys, head by head: the head's rows of the next chunk prefetched, then its dot products
  for (int64_t c0 = lo / kDotKeys * kDotKeys; c0 < hi; c0 += kDotKeys) {
    const T* keys[kRangeRows][kDotKeys];
    for (int64_t m = 0; m < count; ++m) {
      const RangeRow<T>& r = rows[m];
      for (int64_t j = std::max(c0, r.j0); j < std::min(c0 + kDotKeys, r.j1); ++j) {
        keys[m][j - c0] = key_row(r, j, p.k_cache, r.cur_k);
      }
    }
    for (int64_t h = h0; h < h1; ++h) {
      prefetch(p.k_cache, c0 + kDotKeys, kDotKeys, h);
      for (int64_t m = 0; m < count; ++m) {
        const RangeRow<T>& r = rows[m];
        const int64_t a = std::max(c0, r.j0), b = std::min(c0 + kDotKeys, r.j1);
        if (a >= b) continue;
        dot_group_keys(r.queries + h * group * D, keys[m] + (a - c0), h * E, static_cast<int>(b - a), D, group,
                       p.scale, scores.data() + offset[m] + (h - h0) * group * stride[m] + a - r.j0, stride[m]);
      }
    }
  }
  for (int64_t m = 0; m < count; ++m) {
    const int64_t n = std::max<int64_t>(rows[m].j1 - rows[m].j0, 0);
    for (int64_t i = 0; i < heads && n > 0; ++i) {
      float* s = scores.data() + offset[m] + i * stride[m];
      if (p.softcap > 0.f) softcap_scores(s, n, p.softcap);
      const float top = max_of(s, n);
      rows[m].partials[i * (D + 2)] = top;
      rows[m].partials[i * (D + 2) + 1] = exp_shifted(s, n, top);
    }
  }
  // a token's run [a, e) of value rows (from v), head h's
  auto add_run = [&](int64_t m, int64_t h, const T* v, int64_t a, int64_t e) {
    const RangeRow<T>& r = rows[m];
    const int64_t first = (h - h0) * group;
    add_weighted_rows(v + h * E, row, e - a, scores.data() + offset[m] + first * stride[m] + a - r.j0, stride[m],
                      group, D, r.partials + first * (D + 2) + 2, D + 2);
  };
  // a block's value runs, head by head: the head's rows of the next block prefetched, then each token's run
  // (the pool's rows, then its own value where its range ends with it)
  const int64_t bs = p.block_size;
  for (int64_t b0 = lo / bs * bs; b0 < hi; b0 += bs) {
    for (int64_t h = h0; h < h1; ++h) {
      prefetch(p.v_cache, b0 + bs, bs, h);
      for (int64_t m = 0; m < count; ++m) {
        const RangeRow<T>& r = rows[m];
        const int64_t pooled = r.token.length - 1, a = std::max(b0, r.j0), e = std::min(b0 + bs, r.j1);
        if (a >= e) continue;
        if (a < std::min(e, pooled)) add_run(m, h, key_row(r, a, p.v_cache, nullptr), a, std::min(e, pooled));
        if (pooled >= a && pooled < e) add_run(m, h, r.cur_v, pooled, pooled + 1);
      }
    }
  }
}

// attend_ranges for one token's KV heads [h0, h1) over keys [j0, j1).
template <typename T>
void attend_partial(const float* queries, const DecodeToken& t, const PoolShape<T>& p, int64_t h0, int64_t h1,
                    int64_t j0, int64_t j1, const T* cur_k, const T* cur_v, std::vector<float>& scores,
                    float* partials) {
  const RangeRow<T> one{queries, t, j0, j1, cur_k, cur_v, partials};
  attend_ranges(p, h0, h1, &one, 1, scores);
}

// The attention output [D] of one query head from the partials of `count` key ranges, `stride` floats apart,
// with the head's sink logit, if any, in the softmax sum.
void merge_partials(const float* partials, int64_t count, int64_t stride, int64_t D, float* out,
                    float sink = -INFINITY) {
  float top = sink;
  for (int64_t c = 0; c < count; ++c) top = std::max(top, partials[c * stride]);
  float total = sink > -INFINITY ? std::exp(sink - top) : 0.f;
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

// Rotary and the store for KV head h of one token, then its query heads' attention over the sequence's keys (those
// in the window, if there is one).
// current: scratch for the token's key and value as the pool holds them; partials: scratch.
template <typename T>
void attend_kv_head(const DecodeToken& t, const PoolShape<T>& p, int64_t h, std::vector<float>& scores,
                    std::vector<T>& current, std::vector<float>& partials) {
  rope_and_store(t, p, h);
  const int64_t D = p.head_dim, E = pool_units<T>(D), Hq = p.num_heads, Hkv = p.num_kv_heads, group = Hq / Hkv;
  const int64_t row = Hkv * E;
  current.resize(2 * row);
  store_row(current.data() + h * E, t.qkv + Hq * D + h * D, D);
  store_row(current.data() + row + h * E, t.qkv + (Hq + Hkv) * D + h * D, D);
  partials.resize(group * (D + 2));
  const int64_t first = p.window > 0 ? std::max<int64_t>(t.length - p.window, 0) : 0;
  attend_partial(t.qkv, t, p, h, h + 1, first, t.length, current.data(), current.data() + row, scores,
                 partials.data());
  for (int64_t g = 0; g < group; ++g) {
    const int64_t head = h * group + g;
    merge_partials(partials.data() + g * (D + 2), 1, D + 2, D, t.out + head * D,
                   p.sinks ? p.sinks[head] : -INFINITY);
  }
}

// decode_attention over a pool of element type T.
template <typename T>
void decode_attention_over(torch::Tensor& qkv, torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& cos,
                           const torch::Tensor& sin, const torch::Tensor& slot_mapping, const torch::Tensor& tables,
                           const torch::Tensor& seq_lens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           double scale, int64_t window, double softcap, const float* sinks, torch::Tensor& out) {
  const int64_t tokens = qkv.size(0), row = qkv.size(1);
  const PoolShape<T> pool{static_cast<T*>(k_cache.data_ptr()), static_cast<T*>(v_cache.data_ptr()), num_heads,
                          num_kv_heads, head_dim, cos.size(1), k_cache.size(1), static_cast<float>(scale), window,
                          static_cast<float>(softcap), sinks};
  float* qkv_p = qkv.data_ptr<float>();
  float* out_p = out.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  at::parallel_for(0, tokens * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, partials;
    std::vector<T> current;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / num_kv_heads, h = task % num_kv_heads;
      const DecodeToken token{qkv_p + t * row, out_p + t * num_heads * head_dim, cos.data_ptr<float>() + t * pool.half,
                              sin.data_ptr<float>() + t * pool.half, slots[t],
                              tables.data_ptr<int32_t>() + t * tables.size(1), lens[t]};
      attend_kv_head(token, pool, h, scores, current, partials);
    }
  });
}

}  // namespace

// qkv: [T, (Hq + 2 Hkv) * D] float32, rotated in place; caches: [blocks, block_size, Hkv, D] float32, float16 or
// bfloat16, or int8 [blocks, block_size, Hkv, D / 32 * 34] of q8_0 blocks (kernels/kv_quant.py);
// cos/sin: [T, rotary_dim / 2]; slot_mapping: [T] int64; block_tables: [T, max_blocks] int32;
// seq_lens: [T] int32 (keys per sequence, this token's included); window: a query sees its last `window` keys (0:
// all); softcap: scores s become softcap * tanh(s / softcap) (0: none); sinks: None or [Hq] float32, a logit per
// query head added to its softmax sum. Returns [T, Hq * D].
torch::Tensor decode_attention(torch::Tensor qkv, torch::Tensor k_cache, torch::Tensor v_cache,
                               const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slot_mapping,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens, int64_t num_heads,
                               int64_t num_kv_heads, int64_t head_dim, double scale, int64_t window, double softcap,
                               const c10::optional<torch::Tensor>& sinks) {
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32");
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "the KV pool must be contiguous, k and v of one type");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == torch::kFloat, "cos/sin: float32");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kInt &&
              seq_lens.scalar_type() == torch::kInt, "metadata dtypes");
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * head_dim, "qkv width does not match the heads");
  check_pool_rows(k_cache, num_kv_heads, head_dim);
  check_pool_rows(v_cache, num_kv_heads, head_dim);
  TORCH_CHECK(window >= 0 && softcap >= 0, "window and softcap: 0 (off) or positive");
  TORCH_CHECK(!sinks || (sinks->scalar_type() == torch::kFloat && sinks->is_contiguous() && sinks->numel() == num_heads),
              "sinks: [num_heads] contiguous float32");
  const float* sink_logits = sinks ? sinks->data_ptr<float>() : nullptr;
  const torch::Tensor tables = block_tables.contiguous();
  torch::Tensor out = torch::empty({qkv.size(0), num_heads * head_dim}, torch::kFloat);
  with_pool_type(k_cache, [&](auto element) {
    decode_attention_over<decltype(element)>(qkv, k_cache, v_cache, cos, sin, slot_mapping, tables, seq_lens,
                                             num_heads, num_kv_heads, head_dim, scale, window, softcap, sink_logits, out);
  });
  return out;
}
