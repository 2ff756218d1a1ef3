// A whole decoder layer for one decode token on the CPU, in one OpenMP parallel region: the threads meet at
// barriers between the steps instead of being forked and joined for each of the ~8 ops, and Python calls
// once per layer. Same arithmetic as the per-op path (quant_linear.h, decode_attention.h, rms_norm.h).
#pragma once
#include <omp.h>
#include <torch/extension.h>

#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include "decode_attention.h"
#include "quant_linear.h"
#include "vector_math.h"

#if LC_VNNI
namespace {

// A PackedWeight's tensors and what the kernels need to know about them.
struct PackedRef {
  torch::Tensor qweight, scales, mins;
  Layout L;
  int64_t N = 0, K = 0, groups = 0, w_row = 0, chunks = 0, weight_bytes = 0, passes = 0;
  int32_t zero_point = 0;
  bool symmetric = true;
  __m512i scale_index;
  GemvFn gemv = nullptr;
  ActivationBuffers act;  // holds pointers into its own storage: a PackedRef is never copied

  PackedRef(torch::Tensor q, torch::Tensor s, c10::optional<torch::Tensor> m, int64_t bits, int64_t group_size,
            int64_t zp, bool precise)
      : qweight(std::move(q)), scales(std::move(s)), L(make_layout(bits, group_size)) {
    symmetric = !(m.has_value() && m->defined());
    if (!symmetric) mins = *m;
    N = qweight.size(0);
    K = L.u4 ? qweight.size(1) * 2 : qweight.size(1);
    groups = K / L.group_size;
    w_row = qweight.size(1);
    chunks = (K + L.chunk_values - 1) / L.chunk_values;
    weight_bytes = L.u4 ? groups * 16 : groups * L.group_size;
    passes = (N + kRowsPerPass - 1) / kRowsPerPass;
    zero_point = symmetric ? static_cast<int32_t>(zp) : 0;
    alignas(64) int32_t index_values[16];
    for (int lane = 0; lane < 16; ++lane) index_values[lane] = lane / (16 / L.groups_per_chunk);
    scale_index = _mm512_load_si512(index_values);
    gemv = pick_gemv(precise, symmetric, L.u4);
    act = ActivationBuffers(1, K, L);
  }
  PackedRef(const PackedRef&) = delete;
  PackedRef& operator=(const PackedRef&) = delete;

  // This thread's share of the activation's chunks.
  void quantize(int thread, int threads, const float* x, bool precise) {
    quantize_chunks(x, K, L, chunks * thread / threads, chunks * (thread + 1) / threads, precise, zero_point,
                    act.rows[0]);
  }

  // Output rows [pass_begin, pass_end) * kRowsPerPass.
  void multiply(int64_t pass_begin, int64_t pass_end, float* out, const float* bias) const {
    const uint8_t* wp = qweight.data_ptr<uint8_t>();
    const at::Half* sp = scales.data_ptr<at::Half>();
    const at::Half* mp = symmetric ? nullptr : mins.data_ptr<at::Half>();
    for (int64_t pass = pass_begin; pass < pass_end; ++pass) {
      const int64_t n = pass * kRowsPerPass;
      const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
      float dots[kRowsPerPass];
      gemv(wp + n * w_row, w_row, sp + n * groups, mp ? mp + n * groups : nullptr, groups, chunks, weight_bytes, L,
           scale_index, act.rows[0], count, dots);
      for (int r = 0; r < count; ++r) out[n + r] = bias ? dots[r] + bias[n + r] : dots[r];
    }
  }
};

// A projection whose output rows come from one or more PackedWeights, stacked: a GGUF file may store q, k
// and v (or gate and up) in different types, as Q4_K_M files do.
struct Projection {
  std::vector<std::unique_ptr<PackedRef>> parts;
  int64_t N = 0, K = 0, passes = 0;

  // parts: (qweight, scales[, mins]) each; formats: (bits, group_size, zero_point) each
  Projection(const std::vector<std::vector<torch::Tensor>>& tensors, const std::vector<int64_t>& formats,
             size_t first, size_t count, bool precise) {
    for (size_t i = first; i < first + count; ++i) {
      const auto& t = tensors[i];
      TORCH_CHECK(t.size() == 2 || t.size() == 3, "a part is (qweight, scales[, mins])");
      c10::optional<torch::Tensor> mins;
      if (t.size() == 3) mins = t[2];
      parts.push_back(std::make_unique<PackedRef>(t[0], t[1], mins, formats[3 * i], formats[3 * i + 1],
                                                  formats[3 * i + 2], precise));
      TORCH_CHECK(parts.size() == 1 || parts.back()->K == K, "the parts of a projection share in_features");
      K = parts.back()->K;
      N += parts.back()->N;
      passes += parts.back()->passes;
    }
  }

  void quantize(int thread, int threads, const float* x, bool precise) {
    for (auto& part : parts) part->quantize(thread, threads, x, precise);
  }

  // This thread's share of the passes over all parts (each part's rows land after the previous part's).
  void multiply(int thread, int threads, float* out, const float* bias) const {
    const int64_t begin = passes * thread / threads, end = passes * (thread + 1) / threads;
    int64_t first_pass = 0, first_row = 0;
    for (const auto& part : parts) {
      const int64_t lo = std::max<int64_t>(begin - first_pass, 0);
      const int64_t hi = std::min<int64_t>(end - first_pass, part->passes);
      if (lo < hi) part->multiply(lo, hi, out + first_row, bias ? bias + first_row : nullptr);
      first_pass += part->passes;
      first_row += part->N;
    }
  }
};

// x's RMSNorm into out (the sum of squares vectorized; the width is a few thousand at most).
void rms_norm_into(const float* x, const float* weight, int64_t width, float eps, float* out) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < width; ++i) squares += x[i] * x[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + eps);
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) out[i] = x[i] * inv * weight[i];
}

}  // namespace

class DecodeLayer {
 public:
  // parts: the (qweight, scales[, mins]) of every PackedWeight, projection by projection (qkv, o, gate_up,
  // down); part_counts: how many parts each of the four projections has; formats: (bits, group_size,
  // zero_point) per part. q_norm/k_norm: per-head RMSNorm weights (Qwen3), or None.
  DecodeLayer(torch::Tensor input_norm, torch::Tensor post_norm, double eps,
              std::vector<std::vector<torch::Tensor>> parts, std::vector<int64_t> part_counts,
              std::vector<int64_t> formats, c10::optional<torch::Tensor> qkv_bias,
              c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm, int64_t num_heads,
              int64_t num_kv_heads, int64_t head_dim, bool precise)
      : input_norm_(input_norm.contiguous()), post_norm_(post_norm.contiguous()), eps_(static_cast<float>(eps)),
        precise_(precise), heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim),
        qkv_(make(parts, formats, part_counts, 0)), o_(make(parts, formats, part_counts, 1)),
        gate_up_(make(parts, formats, part_counts, 2)), down_(make(parts, formats, part_counts, 3)) {
    if (qkv_bias.has_value() && qkv_bias->defined()) qkv_bias_ = qkv_bias->to(torch::kFloat).contiguous();
    if (q_norm.has_value() && q_norm->defined()) {
      TORCH_CHECK(k_norm.has_value() && k_norm->defined(), "q_norm comes with k_norm");
      q_norm_ = q_norm->to(torch::kFloat).contiguous();
      k_norm_ = k_norm->to(torch::kFloat).contiguous();
      TORCH_CHECK(q_norm_.numel() == head_dim_ && k_norm_.numel() == head_dim_, "q/k norms are per head");
    }
    hidden_ = o_.N;
    TORCH_CHECK(qkv_.N == (heads_ + 2 * kv_heads_) * head_dim_ && o_.K == heads_ * head_dim_ &&
                gate_up_.N == 2 * down_.K && down_.N == hidden_ && qkv_.K == hidden_ && gate_up_.K == hidden_,
                "DecodeLayer: inconsistent shapes");
    normed_.resize(hidden_);
    qkv_out_.resize(qkv_.N);
    attn_out_.resize(o_.K);
    o_out_.resize(hidden_);
    gate_up_out_.resize(gate_up_.N);
    product_.resize(down_.K);
  }

  // Per-call inputs shared by every layer of a token, and each thread's attention scratch.
  struct Step {
    const float* cos;
    const float* sin;
    int64_t half;  // rotary pairs: the width of cos/sin
    int64_t slot;
    const int32_t* table;
    int64_t length;
    std::vector<float>* scores;       // [threads]
    std::vector<int64_t>* key_rows;   // [threads]
  };

  // The layer inside a parallel region that every thread runs: res (the residual stream, [hidden]) gets
  // `incoming` added first when given (the previous layer's MLP output); the layer's MLP output goes to out.
  void run(int tid, int n, float* res, const float* incoming, float* out, const Step& step) {
    const PoolShape pool{k_cache_, v_cache_, heads_, kv_heads_, head_dim_, step.half, block_size_,
                         1.f / std::sqrt(static_cast<float>(head_dim_))};
    const DecodeToken token{qkv_out_.data(), attn_out_.data(), step.cos, step.sin, step.slot, step.table, step.length};
    const float* bias = qkv_bias_.defined() ? qkv_bias_.data_ptr<float>() : nullptr;
#pragma omp single
    {
      if (incoming) add_into(res, incoming, hidden_);
      rms_norm_into(res, input_norm_.data_ptr<float>(), hidden_, eps_, normed_.data());
    }
    qkv_.quantize(tid, n, normed_.data(), precise_);
#pragma omp barrier
    qkv_.multiply(tid, n, qkv_out_.data(), bias);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t h = 0; h < kv_heads_; ++h) {
      if (q_norm_.defined()) norm_heads(h);
      rope_and_store(token, pool, h);
    }
    // query heads, not KV heads, are shared out: 9 heads split 5/4 where 3 KV heads split 2/1
    for (int64_t qh = tid; qh < heads_; qh += n) attend_query_head(token, pool, qh, step.scores[tid], step.key_rows[tid]);
#pragma omp barrier
    o_.quantize(tid, n, attn_out_.data(), precise_);
#pragma omp barrier
    o_.multiply(tid, n, o_out_.data(), nullptr);
#pragma omp barrier
#pragma omp single
    {
      add_into(res, o_out_.data(), hidden_);
      rms_norm_into(res, post_norm_.data_ptr<float>(), hidden_, eps_, normed_.data());
    }
    gate_up_.quantize(tid, n, normed_.data(), precise_);
#pragma omp barrier
    gate_up_.multiply(tid, n, gate_up_out_.data(), nullptr);
#pragma omp barrier
    {
      const int64_t width = down_.K, begin = width * tid / n / 16 * 16, end = width * (tid + 1) / n / 16 * 16;
      silu_and_mul(gate_up_out_.data() + begin, gate_up_out_.data() + width + begin, product_.data() + begin,
                   (tid + 1 == n ? width : end) - begin);
    }
#pragma omp barrier
    down_.quantize(tid, n, product_.data(), precise_);
#pragma omp barrier
    down_.multiply(tid, n, out, nullptr);
#pragma omp barrier
  }

  // This layer's slice of the paged KV pool: [blocks, block_size, kv_heads, head_dim] float32 each.
  void bind_cache(const torch::Tensor& k_cache, const torch::Tensor& v_cache) {
    TORCH_CHECK(k_cache.scalar_type() == torch::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                k_cache.sizes() == v_cache.sizes() && k_cache.dim() == 4 && k_cache.size(2) == kv_heads_ &&
                k_cache.size(3) == head_dim_, "the KV pool must be contiguous float32 [blocks, block, kv_heads, D]");
    k_cache_tensor_ = k_cache;
    v_cache_tensor_ = v_cache;
    k_cache_ = k_cache.data_ptr<float>();
    v_cache_ = v_cache.data_ptr<float>();
    block_size_ = k_cache.size(1);
  }

  int64_t hidden() const { return hidden_; }

 private:
  Projection make(const std::vector<std::vector<torch::Tensor>>& parts, const std::vector<int64_t>& formats,
                  const std::vector<int64_t>& counts, size_t which) const {
    TORCH_CHECK(counts.size() == 4, "part_counts has one entry per projection");
    TORCH_CHECK(formats.size() == 3 * parts.size(), "formats has three entries per part");
    size_t first = 0;
    for (size_t i = 0; i < which; ++i) first += counts[i];
    TORCH_CHECK(counts[which] >= 1 && first + counts[which] <= parts.size(), "part_counts does not match parts");
    return Projection(parts, formats, first, counts[which], precise_);
  }

  // Qwen3's per-head RMSNorm of KV head h's key and its group of query heads, before the rotary.
  void norm_heads(int64_t h) {
    const int64_t D = head_dim_, group = heads_ / kv_heads_;
    for (int64_t g = 0; g < group; ++g) {
      float* q = qkv_out_.data() + (h * group + g) * D;
      rms_norm_into(q, q_norm_.data_ptr<float>(), D, eps_, q);
    }
    float* k = qkv_out_.data() + heads_ * D + h * D;
    rms_norm_into(k, k_norm_.data_ptr<float>(), D, eps_, k);
  }

  torch::Tensor input_norm_, post_norm_, qkv_bias_, q_norm_, k_norm_, k_cache_tensor_, v_cache_tensor_;
  float* k_cache_ = nullptr;
  float* v_cache_ = nullptr;
  int64_t block_size_ = 0;
  float eps_;
  bool precise_;
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0;
  Projection qkv_, o_, gate_up_, down_;
  std::vector<float> normed_, qkv_out_, attn_out_, o_out_, gate_up_out_, product_;
};

// Every decoder layer and the final norm for one decode token, in one OpenMP parallel region and one call
// from Python (per token, not per layer).
class DecodeStack {
 public:
  DecodeStack(std::vector<std::shared_ptr<DecodeLayer>> layers, torch::Tensor final_norm, double eps)
      : layers_(std::move(layers)), final_norm_(final_norm.to(torch::kFloat).contiguous()),
        eps_(static_cast<float>(eps)) {
    TORCH_CHECK(!layers_.empty(), "a stack needs layers");
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
    torch::Tensor residual = x.contiguous().clone();
    torch::Tensor out = torch::empty({1, hidden_}, torch::kFloat);
    float* res = residual.data_ptr<float>();
    const int threads = at::get_num_threads();
    if (static_cast<int>(scores_.size()) < threads) {
      scores_.resize(threads);
      key_rows_.resize(threads);
    }
    const DecodeLayer::Step step{cos.data_ptr<float>(), sin.data_ptr<float>(), cos.size(1),
                                 slot_mapping.data_ptr<int64_t>()[0], block_tables.data_ptr<int32_t>(),
                                 seq_lens.data_ptr<int32_t>()[0], scores_.data(), key_rows_.data()};
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), n = omp_get_num_threads();
      for (size_t i = 0; i < layers_.size(); ++i) {
        layers_[i]->run(tid, n, res, i == 0 ? nullptr : mlp_out_.data(), mlp_out_.data(), step);
      }
    }
    add_into(res, mlp_out_.data(), hidden_);
    rms_norm_into(res, final_norm_.data_ptr<float>(), hidden_, eps_, out.data_ptr<float>());
    return out;
  }

 private:
  std::vector<std::shared_ptr<DecodeLayer>> layers_;
  torch::Tensor final_norm_;
  float eps_;
  int64_t hidden_ = 0;
  bool bound_ = false;
  std::vector<float> mlp_out_;
  std::vector<std::vector<float>> scores_;  // attention scratch, one per thread
  std::vector<std::vector<int64_t>> key_rows_;
};
#endif
