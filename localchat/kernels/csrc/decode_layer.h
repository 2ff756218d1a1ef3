// Whole decoder layers for the tokens of one CPU forward pass (one decode, a few sequences' decodes, or a
// sequence's last few tokens: speculative decoding's verification), in one OpenMP parallel region: the threads
// meet at five barriers per layer (after each projection and after attention) instead of being forked and joined
// for each of the ~8 ops, and Python calls once per pass. Each thread keeps its own copy of the residual stream
// and normalizes every projection's input itself, and for one token quantizes it itself too (a few microseconds
// of duplicated work), so nothing serial runs between the projections; several tokens' are quantized by the
// threads together, a share each, behind one more barrier per projection (and one between storing the tokens'
// keys and attention). Same arithmetic as the per-op path (quant_linear.h, decode_attention.h, rms_norm.h).
#pragma once
#include <omp.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include "torch_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include "decode_attention.h"
#include "decode_moe.h"
#include "decode_projection.h"
#include "quant_linear.h"
#include "vector_math.h"

namespace {

// A cycle counter for DecodeStack.profile: the time-stamp counter on x86, the virtual counter on ARM (the profile
// converts counts to time by the counter's measured rate).
inline uint64_t cycle_count() {
#if defined(__x86_64__)
  return __rdtsc();
#elif defined(__aarch64__)
  uint64_t ticks;
  asm volatile("mrs %0, cntvct_el0" : "=r"(ticks));
  return ticks;
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// x's RMSNorm into out (the sum of squares vectorized; the width is a few thousand at most).
void rms_norm_into(const float* x, const float* weight, int64_t width, float eps, float* out) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < width; ++i) squares += x[i] * x[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + eps);
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) out[i] = x[i] * inv * weight[i];
}
// The most tokens one DecodeStack.forward runs: each projection reads its weights once for all of them (the panel
// kernel, kPanelRows rows a pass). Measured on the default model (docs/benchmarks-history.md, 2026-12-06): 32
// sequences' decodes in 61.5 ms on the stack, 68.6 op by op.
constexpr int64_t kMaxStackRows = kPanelRows;
// A token's keys are attended in key_splits(length) ranges of about equal size (flash-decoding's split), shared
// out between the threads and merged in range order. The ranges depend on the length alone, so a token's
// attention, and its logits, come out bit for bit the same whatever the thread count and whatever else the pass
// holds. At least kMinSplitKeys keys a range keeps the merge a small part of the work.
constexpr int64_t kKeySplits = 32, kMinSplitKeys = 64;

int64_t key_splits(int64_t length) {
  return std::clamp<int64_t>((length + kMinSplitKeys - 1) / kMinSplitKeys, 1, kKeySplits);
}

// Range c of `splits` over `length` keys: its first key (its end is the next range's first).
int64_t split_start(int64_t length, int64_t c, int64_t splits) { return length * c / splits; }

// One task of several tokens' attention: range c of the tokens [m0, m1) of one sequence, following each other.
struct RangeTask {
  int64_t m0, m1, c;
};

// What each thread of the decode region keeps for itself: its copy of the residual stream and the normalized input
// of the next projection ([rows][hidden] each), SiLU's products, one token's rotated keys and queries, the attention
// outputs (all heads, merged, [rows][Hq * D]) and attention scores, one token's activation rows, and (when
// profiling) the cycles it spent in each phase.
struct ThreadScratch {
  std::vector<float> residual, normed, product, keys, queries, attention;
  SharedActivations inputs;      // one token's
  std::vector<PanelLine> panel;  // several tokens': the panel kernel's accumulators
  MoeScratch moe;  // a mixture-of-experts layer's
  std::vector<char> keys_ready;
  std::vector<float> scores;
  std::vector<uint16_t> current;  // a 16-bit or q8_0 pool's copy of one token's keys and values [2][Hkv * D]
  std::vector<uint64_t> cycles;  // [kPhases], when profiling
  std::vector<RangeTask> range_tasks;  // several tokens' attention: its tasks, in order (attend_rows)
  std::vector<int64_t> range_starts;   // each thread's first task
};

// What the threads share while a layer runs, used by every layer in turn (one runs at a time): the projections'
// outputs ([rows][N] each), the attention partials ([rows][kKeySplits][Hq][D + 2]), and for several tokens the
// activation rows of a projection's input, their rotated queries and their keys and values as the pool holds
// them ([rows][2] rows of Hkv * D values, in its type).
struct LayerShared {
  std::vector<float> qkv, o, gate_up, partials, queries, current;
  TokenActivations tokens;
  std::unique_ptr<Claims[]> range_claims;  // several tokens' attention: the tasks taken from each thread's share
  int range_slots = 0;
};

// The tokens of one forward pass: per token its rotary row, the pool slot of its key and value (-1: none), its
// sequence's block table, and its length (the keys it attends to, its own the last).
struct StackRows {
  int64_t count;
  const float* cos;  // [count][half]
  const float* sin;
  int64_t half;  // rotary pairs
  const int64_t* slots;
  const int32_t* const* tables;
  const int64_t* lengths;
};

// Phases of a layer, for DecodeStack.profile(): each projection with its input's norm and quantization,
// attention, and the waits at the barriers.
enum Phase { kQkv, kAttention, kO, kGateUp, kDown, kBarrier, kPhases };

template <typename T>
void grow(std::vector<T>& v, int64_t size) {
  if (static_cast<int64_t>(v.size()) < size) v.resize(size);
}

}  // namespace

class DecodeLayer {
 public:
  // parts: the (qweight, scales, mins, supers) of every PackedWeight (empty tensors where absent), projection
  // by projection (qkv, o, gate_up, down); part_counts: how many parts each of the four projections has; formats: (bits,
  // group_size, zero_point, arrangement) per part. q_norm/k_norm: per-head RMSNorm weights (Qwen3), or None. precise:
  // per projection, whether its activations take two int8 codes each (else one).
  DecodeLayer(torch::Tensor input_norm, torch::Tensor post_norm, double eps,
              std::vector<std::vector<torch::Tensor>> parts, std::vector<int64_t> part_counts,
              std::vector<int64_t> formats, c10::optional<torch::Tensor> qkv_bias,
              c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, int64_t num_heads,
              int64_t num_kv_heads, int64_t head_dim, std::vector<bool> precise)
      : input_norm_(input_norm.contiguous()), post_norm_(post_norm.contiguous()), eps_(static_cast<float>(eps)),
        precise_(std::move(precise)), heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim),
        qkv_(make(parts, formats, part_counts, 0)), o_(make(parts, formats, part_counts, 1)),
        gate_up_(dense_mlp(part_counts) ? make(parts, formats, part_counts, 2) : Projection()),
        down_(dense_mlp(part_counts) ? make(parts, formats, part_counts, 3) : Projection()) {
    if (qkv_bias.has_value() && qkv_bias->defined()) qkv_bias_ = qkv_bias->to(torch::kFloat).contiguous();
    if (q_norm.has_value() && q_norm->defined()) {
      TORCH_CHECK(k_norm.has_value() && k_norm->defined(), "q_norm comes with k_norm");
      q_norm_ = q_norm->to(torch::kFloat).contiguous();
      k_norm_ = k_norm->to(torch::kFloat).contiguous();
      TORCH_CHECK(q_norm_.numel() == head_dim_ && k_norm_.numel() == head_dim_, "q/k norms are per head");
    }
    hidden_ = o_.N;
    TORCH_CHECK(qkv_.N == (heads_ + 2 * kv_heads_) * head_dim_ && o_.K == heads_ * head_dim_ && qkv_.K == hidden_,
                "DecodeLayer: inconsistent shapes");
    TORCH_CHECK(!dense_mlp(part_counts) || (gate_up_.N == 2 * down_.K && down_.N == hidden_ && gate_up_.K == hidden_),
                "DecodeLayer: inconsistent MLP shapes");
  }

  // A mixture-of-experts MLP instead of the dense one (a layer built with the qkv and o projections only).
  void set_moe(std::shared_ptr<MoeMlp> moe) {
    TORCH_CHECK(gate_up_.parts.empty(), "set_moe: the layer has a dense MLP");
    TORCH_CHECK(moe && moe->hidden() == hidden_, "set_moe: the experts' width does not match the layer");
    moe_ = std::move(moe);
  }

  // Room for this many threads and tokens, in a thread's scratch and in the shared buffers. Called outside the
  // region.
  void reserve(int threads, int64_t rows, ThreadScratch& s, LayerShared& b) {
    TORCH_CHECK(moe_ || !gate_up_.parts.empty(), "DecodeLayer: no MLP (set_moe first)");
    for (Projection* p : {&qkv_, &o_, &gate_up_, &down_}) {
      p->reserve_claims(threads);
      if (rows > 1) b.tokens.add(*p, rows);
    }
    if (moe_) moe_->reserve(threads, s.moe);
    if (b.range_slots < threads) {
      b.range_claims = std::make_unique<Claims[]>(threads);
      b.range_slots = threads;
    }
    grow(s.range_starts, threads + 1);
    const int64_t D = head_dim_, row = kv_heads_ * D;
    grow(s.residual, rows * hidden_);
    grow(s.normed, rows * hidden_);
    grow(s.product, rows * down_.K);
    grow(s.keys, row);
    grow(s.keys_ready, kv_heads_);
    grow(s.queries, heads_ * D);
    grow(s.attention, rows * heads_ * D);
    grow(s.panel, kPanelLines);
    grow(b.qkv, rows * qkv_.N);
    grow(b.o, rows * hidden_);
    grow(b.gate_up, rows * gate_up_.N);
    grow(b.partials, rows * kKeySplits * heads_ * (D + 2));
    grow(b.queries, rows * heads_ * D);
    grow(b.current, rows * 2 * row);  // floats: room for any pool type
  }

  // The layer inside a parallel region that every thread runs, for rows.count tokens. s.residual (this thread's
  // copy of the residual stream) gets `incoming` added first when given (the previous layer's MLP output,
  // shared); the layer's MLP output goes to out (shared), and true is returned, unless the layer added it to
  // s.residual itself (the experts' sum, which each thread forms anyway). Every shared buffer is written by one
  // step and read after the next barrier.
  bool run(int tid, int n, ThreadScratch& s, LayerShared& b, const float* incoming, float* out,
           const StackRows& rows) {
    uint64_t* cycles = s.cycles.empty() ? nullptr : s.cycles.data();
    uint64_t mark = cycles ? cycle_count() : 0;
    auto phase = [&](Phase which) {
      if (!cycles) return;
      const uint64_t now = cycle_count();
      cycles[which] += now - mark;
      mark = now;
    };
    auto barrier = [&]() {
#pragma omp barrier
      phase(kBarrier);
    };
    const int64_t M = rows.count, H = hidden_;
    // the product of a projection with its input x ([M][width], this thread's copy): one token's activation rows
    // quantized by each thread for itself, several tokens' shared between the threads (a barrier more)
    auto project = [&](Projection& p, const float* x, int64_t width, float* y, const float* bias, Phase which) {
      if (M == 1) {
        s.inputs.reset(x);
        p.multiply(tid, n, s.inputs, y, bias);
        return;
      }
      b.tokens.quantize(p, x, width, M * tid / n, M * (tid + 1) / n);
      phase(which);
      barrier();
      TokenRows inputs{b.tokens, M, s.panel.data()};
      p.multiply(tid, n, inputs, y, bias);
    };
    float* res = s.residual.data();
    float* normed = s.normed.data();
    for (int64_t m = 0; m < M; ++m) {
      if (incoming) add_into(res + m * H, incoming + m * H, H);
      rms_norm_into(res + m * H, input_norm_.data_ptr<float>(), H, eps_, normed + m * H);
    }
    project(qkv_, normed, H, b.qkv.data(), qkv_bias_.defined() ? qkv_bias_.data_ptr<float>() : nullptr, kQkv);
    phase(kQkv);
    barrier();
    qkv_.release(tid);
    if (M == 1) {
      with_pool_type(k_cache_tensor_, [&](auto element) { attend<decltype(element)>(tid, n, s, b, rows); });
    } else {  // every token's key and value into the pool, then every token's attention
      with_pool_type(k_cache_tensor_, [&](auto element) { store_rows<decltype(element)>(tid, n, s, b, rows); });
      phase(kAttention);
      barrier();
      with_pool_type(k_cache_tensor_, [&](auto element) { attend_rows<decltype(element)>(tid, n, s, b, rows); });
    }
    phase(kAttention);
    barrier();
    if (M > 1) b.range_claims[tid].next.store(0, std::memory_order_relaxed);  // (used again after barriers)
    project(o_, merge_attention(s, b, rows), heads_ * head_dim_, b.o.data(), nullptr, kO);
    phase(kO);
    barrier();
    o_.release(tid);
    for (int64_t m = 0; m < M; ++m) {
      add_into(res + m * H, b.o.data() + m * H, H);
      rms_norm_into(res + m * H, post_norm_.data_ptr<float>(), H, eps_, normed + m * H);
    }
    if (moe_) {  // token by token, each through its own experts
      for (int64_t m = 0; m < M; ++m) {
        moe_->run(tid, n, s.moe, normed + m * H, res + m * H, barrier, [&] { phase(kGateUp); },
                  [&] { phase(kDown); });
      }
      return false;
    }
    project(gate_up_, normed, H, b.gate_up.data(), nullptr, kGateUp);
    phase(kGateUp);
    barrier();
    gate_up_.release(tid);
    const int64_t W = down_.K;
    for (int64_t m = 0; m < M; ++m) {
      const float* gate = b.gate_up.data() + m * 2 * W;
      silu_and_mul(gate, gate + W, s.product.data() + m * W, W);
    }
    project(down_, s.product.data(), W, out, nullptr, kDown);
    phase(kDown);
    barrier();
    down_.release(tid);
    return true;
  }

  // This layer's slice of the paged KV pool: [blocks, block_size, kv_heads, head_dim] float32, float16 or bfloat16, or
  // int8 [blocks, block_size, kv_heads, head_dim / 32 * 34] of q8_0 blocks.
  void bind_cache(const torch::Tensor& k_cache, const torch::Tensor& v_cache) {
    with_pool_type(k_cache, [](auto) {});  // checks the type
    TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                k_cache.sizes() == v_cache.sizes(), "the KV pool must be contiguous, k and v alike");
    check_pool_rows(k_cache, kv_heads_, head_dim_);
    k_cache_tensor_ = k_cache;
    v_cache_tensor_ = v_cache;
    k_cache_ = k_cache.data_ptr();
    v_cache_ = v_cache.data_ptr();
    block_size_ = k_cache.size(1);
  }

  int64_t hidden() const { return hidden_; }
  int64_t block_size() const { return block_size_; }
  bool has_mlp() const { return moe_ || !gate_up_.parts.empty(); }

 private:
  // part_counts names four projections, or two (qkv, o) where experts are the MLP (set_moe)
  static bool dense_mlp(const std::vector<int64_t>& counts) {
    TORCH_CHECK(counts.size() == 4 || counts.size() == 2, "part_counts has one entry per projection");
    return counts.size() == 4;
  }

  Projection make(const std::vector<std::vector<torch::Tensor>>& parts, const std::vector<int64_t>& formats,
                  const std::vector<int64_t>& counts, size_t which) const {
    TORCH_CHECK(precise_.size() == counts.size(), "precise has one entry per projection");
    TORCH_CHECK(formats.size() == kFormatFields * parts.size(), "formats has four entries per part");
    size_t first = 0;
    for (size_t i = 0; i < which; ++i) first += counts[i];
    TORCH_CHECK(counts[which] >= 1 && first + counts[which] <= parts.size(), "part_counts does not match parts");
    return Projection(parts, formats, first, counts[which], precise_[which]);
  }

  template <typename T>
  PoolShape<T> pool(int64_t half) const {
    return {static_cast<T*>(k_cache_), static_cast<T*>(v_cache_), heads_, kv_heads_, head_dim_, half, block_size_,
            1.f / std::sqrt(static_cast<float>(head_dim_))};
  }

  // One head of a token's queries or keys (D floats of its qkv row), normed (Qwen3's per-head `norm`, when
  // defined) and rotated, into dst.
  void rotated_head(const float* src, const torch::Tensor& norm, const float* cos, const float* sin, int64_t half,
                    float* dst) const {
    if (norm.defined()) rms_norm_into(src, norm.data_ptr<float>(), head_dim_, eps_, dst);
    else std::copy(src, src + head_dim_, dst);
    rotate(dst, cos, sin, half);
  }

  // KV head h's key of the single token, (normed,) rotated, in this thread's scratch.
  const float* rotated_key(ThreadScratch& s, const LayerShared& b, int64_t h, const StackRows& rows) {
    const int64_t D = head_dim_;
    float* k = s.keys.data() + h * D;
    if (!s.keys_ready[h]) {
      rotated_head(b.qkv.data() + heads_ * D + h * D, k_norm_, rows.cos, rows.sin, rows.half, k);
      s.keys_ready[h] = 1;
    }
    return k;
  }

  // One token: its keys are split into key_splits(length) ranges, a run of them to each thread, and each thread
  // attends every query head over its ranges: the threads share the work evenly whatever the head counts, and
  // each reads only its part of the KV pool. Each thread rotates the queries (and the token's keys) for itself
  // from the qkv output; the partials are merged after the barrier (merge_attention). KV heads tid, tid + n, ...
  // are this thread's to store into the pool; no thread reads the token's own slot from it.
  template <typename T>
  void attend(int tid, int n, ThreadScratch& s, LayerShared& b, const StackRows& rows) {
    const PoolShape<T> pool = this->pool<T>(rows.half);
    const int64_t slot = rows.slots[0], length = rows.lengths[0], splits = key_splits(length);
    const DecodeToken token{nullptr, nullptr, rows.cos, rows.sin, slot, rows.tables[0], length};
    const int64_t D = head_dim_, E = pool_units<T>(D), row = kv_heads_ * E;
    const int64_t c0 = splits * tid / n, c1 = splits * (tid + 1) / n;
    const float* values = b.qkv.data() + (heads_ + kv_heads_) * D;
    std::fill(s.keys_ready.begin(), s.keys_ready.begin() + kv_heads_, 0);
    float* queries = s.queries.data();
    if (c0 < c1) {
      for (int64_t qh = 0; qh < heads_; ++qh) {
        rotated_head(b.qkv.data() + qh * D, q_norm_, rows.cos, rows.sin, rows.half, queries + qh * D);
      }
    }
    // the token's key and value as the pool will hold them (rounded to its type), for the last range's thread
    const T* cur_k = nullptr;
    const T* cur_v = nullptr;
    if (c0 < c1 && c1 == splits) {
      for (int64_t h = 0; h < kv_heads_; ++h) rotated_key(s, b, h, rows);
      if constexpr (std::is_same_v<T, float>) {
        cur_k = s.keys.data();
        cur_v = values;
      } else {
        s.current.resize((2 * row * sizeof(T) + 1) / sizeof(uint16_t));
        T* current = reinterpret_cast<T*>(s.current.data());
        store_row(current, s.keys.data(), kv_heads_ * D);
        store_row(current + row, values, kv_heads_ * D);
        cur_k = current;
        cur_v = current + row;
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      attend_partial(queries, token, pool, 0, kv_heads_, split_start(length, c, splits),
                     split_start(length, c + 1, splits), cur_k, cur_v, s.scores,
                     b.partials.data() + c * heads_ * (D + 2));
    }
    if (slot < 0) return;
    for (int64_t h = tid; h < kv_heads_; h += n) {
      store_row(pool.k_cache + (slot * kv_heads_ + h) * E, rotated_key(s, b, h, rows), D);
      store_row(pool.v_cache + (slot * kv_heads_ + h) * E, values + h * D, D);
    }
  }

  // Several tokens, before their attention (a barrier between): every (token, KV head) pair's rotated key and
  // value into the pool (where the token has a slot) and into b.current, rounded to the pool's type, and the
  // head's query group rotated into b.queries; the threads share the pairs. A token then reads the keys of the
  // tokens before it in this pass from the pool, as the per-op path does, and its own from b.current.
  template <typename T>
  void store_rows(int tid, int n, ThreadScratch& s, LayerShared& b, const StackRows& rows) {
    const PoolShape<T> pool = this->pool<T>(rows.half);
    const int64_t D = head_dim_, E = pool_units<T>(D), row = kv_heads_ * E, group = heads_ / kv_heads_;
    const int64_t items = rows.count * kv_heads_;
    T* current = reinterpret_cast<T*>(b.current.data());
    for (int64_t i = items * tid / n; i < items * (tid + 1) / n; ++i) {
      const int64_t m = i / kv_heads_, h = i % kv_heads_, slot = rows.slots[m];
      const float* qkv = b.qkv.data() + m * qkv_.N;
      const float* cos = rows.cos + m * rows.half;
      const float* sin = rows.sin + m * rows.half;
      float* key = s.keys.data();
      rotated_head(qkv + (heads_ + h) * D, k_norm_, cos, sin, rows.half, key);
      const float* value = qkv + (heads_ + kv_heads_ + h) * D;
      T* cur = current + m * 2 * row;
      store_row(cur + h * E, key, D);
      store_row(cur + row + h * E, value, D);
      if (slot >= 0) {
        store_row(pool.k_cache + (slot * kv_heads_ + h) * E, key, D);
        store_row(pool.v_cache + (slot * kv_heads_ + h) * E, value, D);
      }
      for (int64_t qh = h * group; qh < (h + 1) * group; ++qh) {
        rotated_head(qkv + qh * D, q_norm_, cos, sin, rows.half, b.queries.data() + (m * heads_ + qh) * D);
      }
    }
  }

  // Several tokens' attention: each token's keys split into ranges as one token's are (attend), so a token's
  // partials, and its output, are the same whatever else the pass holds. The tokens of one sequence that follow
  // each other (a speculative verify's drafted rows) go range by range: range c of each of them in one task, one
  // attend_ranges call, which reads each chunk of the keys and values they share once for all of them, where token
  // by token each read the whole context again. The threads share the tasks by their keys (a task goes to the
  // thread whose share of all the pass's keys it starts in), each taking its own from the front, then helping the
  // others with theirs (Projection::multiply's claims): on a verify, given halves of the keys, the older half's
  // thread ran up to 12% longer.
  template <typename T>
  void attend_rows(int tid, int n, ThreadScratch& s, LayerShared& b, const StackRows& rows) {
    const PoolShape<T> pool = this->pool<T>(rows.half);
    const int64_t D = head_dim_, row = kv_heads_ * pool_units<T>(D);
    const T* current = reinterpret_cast<const T*>(b.current.data());
    int64_t total = 0;
    for (int64_t m = 0; m < rows.count; ++m) total += rows.lengths[m];
    std::vector<RangeTask>& tasks = s.range_tasks;
    tasks.clear();
    std::fill(s.range_starts.begin(), s.range_starts.begin() + n + 1, -1);
    int64_t before = 0;  // the keys of the tokens before m0
    for (int64_t m0 = 0, m1; m0 < rows.count; m0 = m1) {
      // tokens [m0, m1): each one position on from the one before, in the same blocks (its sequence, or one
      // sharing its cached prefix: either way only the order of the work changes)
      for (m1 = m0 + 1; m1 < rows.count && rows.lengths[m1] == rows.lengths[m1 - 1] + 1 &&
                        rows.tables[m1][0] == rows.tables[m0][0];
           ++m1) {
      }
      int64_t keys = 0, most = 0;
      for (int64_t m = m0; m < m1; ++m) {
        keys += rows.lengths[m];
        most = std::max(most, key_splits(rows.lengths[m]));
      }
      for (int64_t c = 0; c < most; ++c) {
        const int64_t owner = (before + keys * c / most) * n / total;
        for (int64_t t = owner; t >= 0 && s.range_starts[t] < 0; --t) s.range_starts[t] = tasks.size();
        tasks.push_back({m0, m1, c});
      }
      before += keys;
    }
    for (int64_t t = 0; t <= n; ++t) {
      if (s.range_starts[t] < 0) s.range_starts[t] = tasks.size();
    }
    for (int k = 0; k < n; ++k) {
      const int owner = (tid + k) % n;
      const int64_t begin = s.range_starts[owner], end = s.range_starts[owner + 1];
      for (;;) {
        const int64_t i = begin + b.range_claims[owner].next.fetch_add(1, std::memory_order_relaxed);
        if (i >= end) break;
        const RangeTask& task = tasks[i];
        RangeRow<T> ranges[kRangeRows];
        int64_t count = 0;
        for (int64_t m = task.m0; m < task.m1; ++m) {
          const int64_t length = rows.lengths[m], splits = key_splits(length);
          if (task.c >= splits) continue;
          const DecodeToken token{nullptr, nullptr, rows.cos + m * rows.half, rows.sin + m * rows.half,
                                  rows.slots[m], rows.tables[m], length};
          const T* cur = current + m * 2 * row;
          ranges[count++] = {b.queries.data() + m * heads_ * D, token, split_start(length, task.c, splits),
                             split_start(length, task.c + 1, splits), cur, cur + row,
                             b.partials.data() + (m * kKeySplits + task.c) * heads_ * (D + 2)};
          if (count == kRangeRows) {
            attend_ranges(pool, 0, kv_heads_, ranges, count, s.scores);
            count = 0;
          }
        }
        if (count > 0) attend_ranges(pool, 0, kv_heads_, ranges, count, s.scores);
      }
    }
  }

  // The attention output of every token's query heads, from its ranges' partials, into this thread's scratch.
  const float* merge_attention(ThreadScratch& s, const LayerShared& b, const StackRows& rows) {
    const int64_t D = head_dim_, width = heads_ * (D + 2);
    for (int64_t m = 0; m < rows.count; ++m) {
      const int64_t splits = key_splits(rows.lengths[m]);
      for (int64_t qh = 0; qh < heads_; ++qh) {
        merge_partials(b.partials.data() + m * kKeySplits * width + qh * (D + 2), splits, width, D,
                       s.attention.data() + (m * heads_ + qh) * D);
      }
    }
    return s.attention.data();
  }

  torch::Tensor input_norm_, post_norm_, qkv_bias_, q_norm_, k_norm_, k_cache_tensor_, v_cache_tensor_;
  void* k_cache_ = nullptr;  // of k_cache_tensor_'s type
  void* v_cache_ = nullptr;
  int64_t block_size_ = 0;
  float eps_;
  std::vector<bool> precise_;  // per projection (qkv, o, gate_up, down)
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0;
  Projection qkv_, o_, gate_up_, down_;  // gate_up_ and down_ without parts where moe_ is the MLP
  std::shared_ptr<MoeMlp> moe_;
};

// Every decoder layer and the final norm for the tokens of one forward pass (up to kMaxStackRows, from any batch:
// decodes and the last tokens of sequences alike), in one OpenMP parallel region and one call from Python.
class DecodeStack {
 public:
  DecodeStack(std::vector<std::shared_ptr<DecodeLayer>> layers, torch::Tensor final_norm, double eps)
      : layers_(std::move(layers)), final_norm_(final_norm.to(torch::kFloat).contiguous()),
        eps_(static_cast<float>(eps)) {
    TORCH_CHECK(!layers_.empty(), "a stack needs layers");
    for (const auto& layer : layers_) TORCH_CHECK(layer->has_mlp(), "DecodeStack: a layer has no MLP (set_moe)");
    hidden_ = layers_[0]->hidden();
    TORCH_CHECK(final_norm_.numel() == hidden_, "the final norm must match the hidden size");
    mlp_out_.resize(kMaxStackRows * hidden_);
  }

  void bind_caches(const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches) {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one cache per layer");
    for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->bind_cache(k_caches[i], v_caches[i]);
    bound_ = true;
  }

  // x: [T, hidden] float32, the embeddings of T tokens (1 <= T <= kMaxStackRows) of S sequences, as the model
  // runner orders them: sequence s's are tokens query_start_loc[s] .. query_start_loc[s + 1], the last of its
  // seq_lens[s] tokens, whose keys are in the blocks block_tables[s]. cos/sin: [T, half]; slot_mapping: [T].
  // Returns the final norm of each token's last residual, [T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc) {
    TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kMaxStackRows && x.size(1) == hidden_ &&
                x.scalar_type() == torch::kFloat, "1 to max_rows() float32 tokens");
    TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kInt &&
                seq_lens.scalar_type() == torch::kInt && query_start_loc.scalar_type() == torch::kInt &&
                cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat, "metadata dtypes");
    TORCH_CHECK(bound_, "DecodeStack: bind_caches first");
    const int64_t T = x.size(0);
    TORCH_CHECK(cos.dim() == 2 && cos.size(0) == T && sin.sizes() == cos.sizes() && slot_mapping.numel() == T,
                "cos, sin and slot_mapping have one row per token");
    const torch::Tensor input = x.contiguous(), cos_rows = cos.contiguous(), sin_rows = sin.contiguous();
    plan(slot_mapping, block_tables, seq_lens, query_start_loc, T);
    torch::Tensor out = torch::empty({T, hidden_}, torch::kFloat);
    const int threads = at::get_num_threads();
    if (static_cast<int>(scratch_.size()) < threads) {
      scratch_.resize(threads);
      for (auto& layer : layers_) {
        for (auto& s : scratch_) layer->reserve(threads, kMaxStackRows, s, shared_);
      }
    }
    for (auto& s : scratch_) s.cycles.assign(profiling_ ? kPhases : 0, 0);
    const StackRows rows{T, cos_rows.data_ptr<float>(), sin_rows.data_ptr<float>(), cos_rows.size(1),
                         slots_.data_ptr<int64_t>(), tables_.data(), lengths_.data()};
    const float* embedding = input.data_ptr<float>();
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), n = omp_get_num_threads();
      ThreadScratch& s = scratch_[tid];
      std::copy(embedding, embedding + T * hidden_, s.residual.data());
      bool pending = false;  // the previous layer's MLP output waits in mlp_out_
      for (size_t i = 0; i < layers_.size(); ++i) {
        pending = layers_[i]->run(tid, n, s, shared_, pending ? mlp_out_.data() : nullptr, mlp_out_.data(), rows);
      }
      if (tid == 0) last_pending_ = pending;
    }
    for (int64_t m = 0; m < T; ++m) {
      float* res = scratch_[0].residual.data() + m * hidden_;
      if (last_pending_) add_into(res, mlp_out_.data() + m * hidden_, hidden_);
      rms_norm_into(res, final_norm_.data_ptr<float>(), hidden_, eps_, out.data_ptr<float>() + m * hidden_);
    }
    if (profiling_) {
      if (totals_.size() < static_cast<size_t>(threads) * kPhases) totals_.resize(threads * kPhases, 0);
      for (int t = 0; t < threads; ++t) {
        for (int ph = 0; ph < kPhases; ++ph) totals_[t * kPhases + ph] += scratch_[t].cycles[ph];
      }
    }
    return out;
  }

  // Start (or stop) counting each thread's time-stamp-counter cycles per phase: qkv, attention, o, gate_up,
  // down, barrier waits. Returns the totals counted so far, [threads][phases], and resets them.
  std::vector<std::vector<int64_t>> profile(bool enable) {
    std::vector<std::vector<int64_t>> result;
    for (size_t t = 0; t * kPhases < totals_.size(); ++t) {
      result.emplace_back(totals_.begin() + t * kPhases, totals_.begin() + (t + 1) * kPhases);
    }
    profiling_ = enable;
    totals_.assign(static_cast<size_t>(at::get_num_threads()) * kPhases, 0);
    return result;
  }

 private:
  // Each token's block table and length from its sequence's (token t of sequence s, whose queries end at q_end,
  // has length seq_lens[s] - (q_end - 1 - t)), checked against the tables' width.
  void plan(const torch::Tensor& slot_mapping, const torch::Tensor& block_tables_in, const torch::Tensor& seq_lens_in,
            const torch::Tensor& query_start_loc_in, int64_t T) {
    block_tables_ = block_tables_in.contiguous();
    slots_ = slot_mapping.contiguous();
    const torch::Tensor seq_lens = seq_lens_in.contiguous(), starts = query_start_loc_in.contiguous();
    const int64_t S = seq_lens.numel();
    TORCH_CHECK(starts.numel() == S + 1 && block_tables_.dim() == 2 && block_tables_.size(0) == S,
                "query_start_loc [S + 1] and block_tables [S, blocks] for seq_lens [S]");
    const int32_t* lens = seq_lens.data_ptr<int32_t>();
    const int32_t* start = starts.data_ptr<int32_t>();
    const int64_t width = block_tables_.size(1), capacity = width * layers_[0]->block_size();
    TORCH_CHECK(start[0] == 0 && start[S] == T, "query_start_loc must run from 0 to the token count");
    tables_.resize(T);
    lengths_.resize(T);
    for (int64_t seq = 0; seq < S; ++seq) {
      TORCH_CHECK(start[seq] < start[seq + 1] && start[seq + 1] - start[seq] <= lens[seq] && lens[seq] <= capacity,
                  "each sequence has 1 to seq_lens queries, and its keys fit its block table");
      for (int64_t t = start[seq]; t < start[seq + 1]; ++t) {
        tables_[t] = block_tables_.data_ptr<int32_t>() + seq * width;
        lengths_[t] = lens[seq] - (start[seq + 1] - 1 - t);
      }
    }
  }

  std::vector<std::shared_ptr<DecodeLayer>> layers_;
  torch::Tensor final_norm_, block_tables_, slots_;
  float eps_;
  int64_t hidden_ = 0;
  bool bound_ = false;
  bool profiling_ = false;
  bool last_pending_ = false;
  std::vector<float> mlp_out_;
  std::vector<ThreadScratch> scratch_;
  LayerShared shared_;
  std::vector<const int32_t*> tables_;
  std::vector<int64_t> lengths_;
  std::vector<uint64_t> totals_;
};
