// A whole decoder layer for one decode token on the CPU, in one OpenMP parallel region: the threads meet at
// barriers between the steps instead of being forked and joined for each of the ~8 ops, and Python calls
// once per layer. Same arithmetic as the per-op path (quant_linear.h, decode_attention.h, rms_norm.h).
#pragma once
#include <omp.h>
#include <torch/extension.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "decode_attention.h"
#include "quant_linear.h"

#if LC_VNNI
namespace {

// A PackedWeight's tensors and what the kernels need to know about them.
struct PackedRef {
  torch::Tensor qweight, scales, mins;
  Layout L;
  int64_t N = 0, K = 0, groups = 0, w_row = 0, chunks = 0, weight_bytes = 0;
  int32_t zero_point = 0;
  bool symmetric = true;
  __m512i scale_index;
  GemvFn gemv = nullptr;
  ActivationBuffers act;

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
    zero_point = symmetric ? static_cast<int32_t>(zp) : 0;
    alignas(64) int32_t index_values[16];
    for (int lane = 0; lane < 16; ++lane) index_values[lane] = lane / (16 / L.groups_per_chunk);
    scale_index = _mm512_load_si512(index_values);
    gemv = pick_gemv(precise, symmetric, L.u4);
    act = ActivationBuffers(1, K, L);
  }

  void quantize(const float* x, bool precise) { quantize_row(x, K, L, chunks, precise, zero_point, act.rows[0]); }

  // This thread's share of the output rows.
  void multiply(int thread, int threads, float* out, const float* bias) const {
    const int64_t passes = (N + kRowsPerPass - 1) / kRowsPerPass;
    const uint8_t* wp = qweight.data_ptr<uint8_t>();
    const at::Half* sp = scales.data_ptr<at::Half>();
    const at::Half* mp = symmetric ? nullptr : mins.data_ptr<at::Half>();
    for (int64_t pass = passes * thread / threads; pass < passes * (thread + 1) / threads; ++pass) {
      const int64_t n = pass * kRowsPerPass;
      const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
      float dots[kRowsPerPass];
      gemv(wp + n * w_row, w_row, sp + n * groups, mp ? mp + n * groups : nullptr, groups, chunks, weight_bytes, L,
           scale_index, act.rows[0], count, dots);
      for (int r = 0; r < count; ++r) out[n + r] = bias ? dots[r] + bias[n + r] : dots[r];
    }
  }
};

void rms_norm_into(const float* x, const float* weight, int64_t width, float eps, float* out) {
  float squares = 0.f;
  for (int64_t i = 0; i < width; ++i) squares += x[i] * x[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + eps);
  for (int64_t i = 0; i < width; ++i) out[i] = x[i] * inv * weight[i];
}

}  // namespace

class DecodeLayer {
 public:
  DecodeLayer(torch::Tensor input_norm, torch::Tensor post_norm, double eps, std::vector<torch::Tensor> qkv,
              std::vector<torch::Tensor> o, std::vector<torch::Tensor> gate_up, std::vector<torch::Tensor> down,
              std::vector<int64_t> formats, c10::optional<torch::Tensor> qkv_bias, int64_t num_heads,
              int64_t num_kv_heads, int64_t head_dim, bool precise)
      : input_norm_(input_norm.contiguous()), post_norm_(post_norm.contiguous()), eps_(static_cast<float>(eps)),
        precise_(precise), heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim),
        qkv_(make(qkv, formats, 0)), o_(make(o, formats, 3)), gate_up_(make(gate_up, formats, 6)),
        down_(make(down, formats, 9)) {
    if (qkv_bias.has_value() && qkv_bias->defined()) qkv_bias_ = qkv_bias->to(torch::kFloat).contiguous();
    hidden_ = o_.N;
    TORCH_CHECK(qkv_.N == (heads_ + 2 * kv_heads_) * head_dim_ && o_.K == heads_ * head_dim_ &&
                gate_up_.N == 2 * down_.K && down_.N == hidden_, "DecodeLayer: inconsistent shapes");
    normed_.resize(hidden_);
    qkv_out_.resize(qkv_.N);
    attn_out_.resize(o_.K);
    o_out_.resize(hidden_);
    gate_up_out_.resize(gate_up_.N);
    product_.resize(down_.K);
  }

  // x: [1, hidden]; residual: [1, hidden] or None (the first layer). Returns (mlp output, new residual).
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                                   torch::Tensor k_cache, torch::Tensor v_cache, const torch::Tensor& cos,
                                                   const torch::Tensor& sin, const torch::Tensor& slot_mapping,
                                                   const torch::Tensor& block_tables, const torch::Tensor& seq_lens) {
    TORCH_CHECK(x.size(0) == 1 && x.is_contiguous() && x.scalar_type() == torch::kFloat, "one float32 token");
    torch::Tensor sum = (residual.has_value() && residual->defined()) ? (*residual + x) : x.clone();
    torch::Tensor out = torch::empty({1, hidden_}, torch::kFloat);
    float* res = sum.data_ptr<float>();
    float* outp = out.data_ptr<float>();
    const PoolShape pool{k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), heads_, kv_heads_, head_dim_,
                         cos.size(1), k_cache.size(1), 1.f / std::sqrt(static_cast<float>(head_dim_))};
    const DecodeToken token{qkv_out_.data(), attn_out_.data(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                            slot_mapping.data_ptr<int64_t>()[0], block_tables.data_ptr<int32_t>(),
                            seq_lens.data_ptr<int32_t>()[0]};
    const float* bias = qkv_bias_.defined() ? qkv_bias_.data_ptr<float>() : nullptr;
    const int threads = at::get_num_threads();
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), n = omp_get_num_threads();
#pragma omp single
      {
        rms_norm_into(res, input_norm_.data_ptr<float>(), hidden_, eps_, normed_.data());
        qkv_.quantize(normed_.data(), precise_);
      }
      qkv_.multiply(tid, n, qkv_out_.data(), bias);
#pragma omp barrier
#pragma omp single
      for (int64_t h = 0; h < kv_heads_; ++h) rope_and_store(token, pool, h);
      {  // query heads, not KV heads, are shared out: 9 heads split 5/4 where 3 KV heads split 2/1
        std::vector<float> scores;
        std::vector<int64_t> key_rows;
        for (int64_t qh = tid; qh < heads_; qh += n) attend_query_head(token, pool, qh, scores, key_rows);
      }
#pragma omp barrier
#pragma omp single
      o_.quantize(attn_out_.data(), precise_);
      o_.multiply(tid, n, o_out_.data(), nullptr);
#pragma omp barrier
#pragma omp single
      {
        for (int64_t i = 0; i < hidden_; ++i) res[i] += o_out_[i];
        rms_norm_into(res, post_norm_.data_ptr<float>(), hidden_, eps_, normed_.data());
        gate_up_.quantize(normed_.data(), precise_);
      }
      gate_up_.multiply(tid, n, gate_up_out_.data(), nullptr);
#pragma omp barrier
#pragma omp single
      {
        const int64_t width = down_.K;
        for (int64_t i = 0; i < width; ++i) {
          const float g = gate_up_out_[i];
          product_[i] = g / (1.f + std::exp(-g)) * gate_up_out_[width + i];
        }
        down_.quantize(product_.data(), precise_);
      }
      down_.multiply(tid, n, outp, nullptr);
    }
    return {out, sum};
  }

 private:
  // formats: per projection (bits, group_size, zero_point); parts: (qweight, scales[, mins])
  PackedRef make(const std::vector<torch::Tensor>& parts, const std::vector<int64_t>& formats, size_t at) const {
    c10::optional<torch::Tensor> mins;
    if (parts.size() > 2) mins = parts[2];
    return PackedRef(parts[0], parts[1], mins, formats[at], formats[at + 1], formats[at + 2], precise_);
  }

  torch::Tensor input_norm_, post_norm_, qkv_bias_;
  float eps_;
  bool precise_;
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0;
  PackedRef qkv_, o_, gate_up_, down_;
  std::vector<float> normed_, qkv_out_, attn_out_, o_out_, gate_up_out_, product_;
};
#endif
