// A whole decoder layer for one decode token on the CPU, in one OpenMP parallel region: the threads meet at
// five barriers per layer (after each projection and after attention) instead of being forked and joined for
// each of the ~8 ops, and Python calls once per token. Each thread keeps its own copy of the residual stream
// and normalizes and quantizes every projection's input itself (a few microseconds of duplicated work), so
// nothing serial runs between the projections. Same arithmetic as the per-op path (quant_linear.h,
// decode_attention.h, rms_norm.h).
#pragma once
#include <omp.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <torch/extension.h>

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
// What each thread of the decode region keeps for itself: its copy of the residual stream, the normalized input
// of the next projection, SiLU's product, the current token's rotated keys and queries, the attention
// output (all heads, merged) and attention scores, and (when profiling) the cycles it spent in each phase.
struct ThreadScratch {
  std::vector<float> residual, normed, product, keys, queries, attention;
  MoeScratch moe;  // a mixture-of-experts layer's
  std::vector<char> keys_ready;
  std::vector<float> scores;
  std::vector<uint16_t> current;  // a 16-bit or q8_0 pool's copy of the current token's keys and values [2][Hkv * D]
  std::vector<uint64_t> cycles;  // [kPhases], when profiling
};
// Phases of a layer, for DecodeStack.profile(): each projection with its input's norm and quantization,
// attention, and the waits at the barriers.
enum Phase { kQkv, kAttention, kO, kGateUp, kDown, kBarrier, kPhases };

}  // namespace

class DecodeLayer {
 public:
  // parts: the (qweight, scales, mins, supers) of every PackedWeight (empty tensors where absent), projection
  // by projection (qkv, o, gate_up, down); part_counts: how many parts each of the four projections has; formats: (bits, group_size,
  // zero_point, arrangement) per part. q_norm/k_norm: per-head RMSNorm weights (Qwen3), or None. precise: per
  // projection, whether its activations take two int8 codes each (else one).
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
    qkv_out_.resize(qkv_.N);
    o_out_.resize(hidden_);
    gate_up_out_.resize(gate_up_.N);
  }

  // A mixture-of-experts MLP instead of the dense one (a layer built with the qkv and o projections only).
  void set_moe(std::shared_ptr<MoeMlp> moe) {
    TORCH_CHECK(gate_up_.parts.empty(), "set_moe: the layer has a dense MLP");
    TORCH_CHECK(moe && moe->hidden() == hidden_, "set_moe: the experts' width does not match the layer");
    moe_ = std::move(moe);
  }

  // Per-call inputs shared by every layer of a token.
  struct Step {
    const float* cos;
    const float* sin;
    int64_t half;  // rotary pairs: the width of cos/sin
    int64_t slot;
    const int32_t* table;
    int64_t length;
  };

  // Room for this many threads' activation rows, and for a thread's scratch. Called outside the region.
  void reserve(int threads, ThreadScratch& s) {
    TORCH_CHECK(moe_ || !gate_up_.parts.empty(), "DecodeLayer: no MLP (set_moe first)");
    for (Projection* p : {&qkv_, &o_, &gate_up_, &down_}) p->reserve(threads);
    if (moe_) moe_->reserve(threads, s.moe);
    s.residual.resize(hidden_);
    s.normed.resize(hidden_);
    s.product.resize(std::max<int64_t>(static_cast<int64_t>(s.product.size()), down_.K));
    s.keys.resize(std::max<int64_t>(static_cast<int64_t>(s.keys.size()), kv_heads_ * head_dim_));
    s.keys_ready.resize(std::max<int64_t>(static_cast<int64_t>(s.keys_ready.size()), kv_heads_));
    s.queries.resize(std::max<int64_t>(static_cast<int64_t>(s.queries.size()), heads_ * head_dim_));
    s.attention.resize(std::max<int64_t>(static_cast<int64_t>(s.attention.size()), heads_ * head_dim_));
    partials_.resize(std::max<size_t>(partials_.size(), threads * heads_ * (head_dim_ + 2)));
  }

  // The layer inside a parallel region that every thread runs. s.residual (this thread's copy of the residual
  // stream) gets `incoming` added first when given (the previous layer's MLP output, shared); the layer's MLP
  // output goes to out (shared), and true is returned, unless the layer added it to s.residual itself (the
  // experts' sum, which each thread forms anyway). Every shared buffer is written by one step and read after the
  // next barrier.
  bool run(int tid, int n, ThreadScratch& s, const float* incoming, float* out, const Step& step) {
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
    float* res = s.residual.data();
    float* normed = s.normed.data();
    if (incoming) add_into(res, incoming, hidden_);
    rms_norm_into(res, input_norm_.data_ptr<float>(), hidden_, eps_, normed);
    qkv_.quantize(tid, normed);
    qkv_.multiply(tid, n, qkv_out_.data(), qkv_bias_.defined() ? qkv_bias_.data_ptr<float>() : nullptr);
    phase(kQkv);
    barrier();
    qkv_.release(tid);
    attend(tid, n, s, step);
    phase(kAttention);
    barrier();
    o_.quantize(tid, merge_attention(n, s));
    o_.multiply(tid, n, o_out_.data(), nullptr);
    phase(kO);
    barrier();
    o_.release(tid);
    add_into(res, o_out_.data(), hidden_);
    rms_norm_into(res, post_norm_.data_ptr<float>(), hidden_, eps_, normed);
    if (moe_) {
      moe_->run(tid, n, s.moe, normed, res, barrier, [&] { phase(kGateUp); }, [&] { phase(kDown); });
      return false;
    }
    gate_up_.quantize(tid, normed);
    gate_up_.multiply(tid, n, gate_up_out_.data(), nullptr);
    phase(kGateUp);
    barrier();
    gate_up_.release(tid);
    silu_and_mul(gate_up_out_.data(), gate_up_out_.data() + down_.K, s.product.data(), down_.K);
    down_.quantize(tid, s.product.data());
    down_.multiply(tid, n, out, nullptr);
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

  // KV head h's key of the current token, (normed,) rotated, in this thread's scratch.
  const float* rotated_key(ThreadScratch& s, int64_t h, const Step& step) {
    const int64_t D = head_dim_;
    float* k = s.keys.data() + h * D;
    if (!s.keys_ready[h]) {
      const float* src = qkv_out_.data() + heads_ * D + h * D;
      if (q_norm_.defined()) rms_norm_into(src, k_norm_.data_ptr<float>(), D, eps_, k);
      else std::copy(src, src + D, k);
      rotate(k, step.cos, step.sin, step.half);
      s.keys_ready[h] = 1;
    }
    return k;
  }

  // The sequence's keys are split into one range per thread, and each thread attends every query head over
  // its range (flash-decoding's split): the threads share the work evenly whatever the head counts, and each
  // reads only its part of the KV pool. Each thread rotates the queries (and the current token's keys) for
  // itself from qkv_out; the partials are merged after the barrier (merge_attention). KV heads tid, tid + n,
  // ... are this thread's to store into the pool; no thread reads the current slot from it.
  void attend(int tid, int n, ThreadScratch& s, const Step& step) {
    with_pool_type(k_cache_tensor_, [&](auto element) { attend_over<decltype(element)>(tid, n, s, step); });
  }

  template <typename T>
  void attend_over(int tid, int n, ThreadScratch& s, const Step& step) {
    const PoolShape<T> pool{static_cast<T*>(k_cache_), static_cast<T*>(v_cache_), heads_, kv_heads_, head_dim_,
                            step.half, block_size_, 1.f / std::sqrt(static_cast<float>(head_dim_))};
    const DecodeToken token{qkv_out_.data(), nullptr, step.cos, step.sin, step.slot, step.table, step.length};
    const int64_t D = head_dim_, E = pool_units<T>(D), row = kv_heads_ * E;
    const int64_t j0 = step.length * tid / n, j1 = step.length * (tid + 1) / n;
    const float* values = qkv_out_.data() + (heads_ + kv_heads_) * D;
    std::fill(s.keys_ready.begin(), s.keys_ready.begin() + kv_heads_, 0);
    float* queries = s.queries.data();
    for (int64_t qh = 0; qh < heads_; ++qh) {
      const float* src = qkv_out_.data() + qh * D;
      float* q = queries + qh * D;
      if (q_norm_.defined()) rms_norm_into(src, q_norm_.data_ptr<float>(), D, eps_, q);
      else std::copy(src, src + D, q);
      rotate(q, step.cos, step.sin, step.half);
    }
    // the current token's key and value as the pool will hold them (rounded to its type)
    const T* cur_k = nullptr;
    const T* cur_v = nullptr;
    if (j0 < j1 && j1 == step.length) {
      for (int64_t h = 0; h < kv_heads_; ++h) rotated_key(s, h, step);
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
    attend_partial(queries, token, pool, 0, kv_heads_, j0, j1, cur_k, cur_v, s.scores,
                   partials_.data() + tid * heads_ * (D + 2));
    if (step.slot < 0) return;
    for (int64_t h = tid; h < kv_heads_; h += n) {
      store_row(pool.k_cache + (step.slot * kv_heads_ + h) * E, rotated_key(s, h, step), D);
      store_row(pool.v_cache + (step.slot * kv_heads_ + h) * E, values + h * D, D);
    }
  }

  // The attention output of every query head, from all threads' partials, into this thread's scratch.
  const float* merge_attention(int n, ThreadScratch& s) {
    const int64_t D = head_dim_;
    for (int64_t qh = 0; qh < heads_; ++qh) {
      merge_partials(partials_.data() + qh * (D + 2), n, heads_ * (D + 2), D, s.attention.data() + qh * D);
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
  std::vector<float> qkv_out_, partials_, o_out_, gate_up_out_;
};

// Every decoder layer and the final norm for one decode token, in one OpenMP parallel region and one call
// from Python (per token, not per layer).
class DecodeStack {
 public:
  DecodeStack(std::vector<std::shared_ptr<DecodeLayer>> layers, torch::Tensor final_norm, double eps)
      : layers_(std::move(layers)), final_norm_(final_norm.to(torch::kFloat).contiguous()),
        eps_(static_cast<float>(eps)) {
    TORCH_CHECK(!layers_.empty(), "a stack needs layers");
    for (const auto& layer : layers_) TORCH_CHECK(layer->has_mlp(), "DecodeStack: a layer has no MLP (set_moe)");
    hidden_ = layers_[0]->hidden();
    TORCH_CHECK(final_norm_.numel() == hidden_, "the final norm must match the hidden size");
    mlp_out_.resize(hidden_);
  }

  void bind_caches(const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches) {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one cache per layer");
    for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->bind_cache(k_caches[i], v_caches[i]);
    bound_ = true;
  }

  // x: [1, hidden] float32 (the token's embedding). Returns the final norm of the last residual, [1, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens) {
    TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.size(1) == hidden_ && x.scalar_type() == torch::kFloat,
                "one float32 token");
    TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kInt &&
                seq_lens.scalar_type() == torch::kInt && cos.scalar_type() == torch::kFloat &&
                cos.is_contiguous() && sin.is_contiguous() && block_tables.is_contiguous(), "metadata dtypes");
    TORCH_CHECK(bound_, "DecodeStack: bind_caches first");
    const torch::Tensor input = x.contiguous();
    torch::Tensor out = torch::empty({1, hidden_}, torch::kFloat);
    const int threads = at::get_num_threads();
    if (static_cast<int>(scratch_.size()) < threads) {
      scratch_.resize(threads);
      for (auto& layer : layers_) {
        for (auto& s : scratch_) layer->reserve(threads, s);
      }
    }
    for (auto& s : scratch_) s.cycles.assign(profiling_ ? kPhases : 0, 0);
    const DecodeLayer::Step step{cos.data_ptr<float>(), sin.data_ptr<float>(), cos.size(1),
                                 slot_mapping.data_ptr<int64_t>()[0], block_tables.data_ptr<int32_t>(),
                                 seq_lens.data_ptr<int32_t>()[0]};
    const float* embedding = input.data_ptr<float>();
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), n = omp_get_num_threads();
      ThreadScratch& s = scratch_[tid];
      std::copy(embedding, embedding + hidden_, s.residual.data());
      bool pending = false;  // the previous layer's MLP output waits in mlp_out_
      for (size_t i = 0; i < layers_.size(); ++i) {
        pending = layers_[i]->run(tid, n, s, pending ? mlp_out_.data() : nullptr, mlp_out_.data(), step);
      }
      if (tid == 0) last_pending_ = pending;
    }
    float* res = scratch_[0].residual.data();
    if (last_pending_) add_into(res, mlp_out_.data(), hidden_);
    rms_norm_into(res, final_norm_.data_ptr<float>(), hidden_, eps_, out.data_ptr<float>());
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
  std::vector<std::shared_ptr<DecodeLayer>> layers_;
  torch::Tensor final_norm_;
  float eps_;
  int64_t hidden_ = 0;
  bool bound_ = false;
  bool profiling_ = false;
  bool last_pending_ = false;
  std::vector<float> mlp_out_;
  std::vector<ThreadScratch> scratch_;
  std::vector<uint64_t> totals_;
};
