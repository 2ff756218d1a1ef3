// A mixture-of-experts MLP in the CPU decode stack (decode_layer.h).
#pragma once
#include "torch_api.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "decode_projection.h"
#include "moe_prefill.h"
#include "vector_math.h"

namespace {

// What a thread of the decode region keeps for a mixture-of-experts layer: the chosen experts (by id) and their
// weights, the router's probabilities, the chosen experts' SiLU products [k][width], and the activation rows of
// the MLP's input and of each chosen expert's product.
struct MoeScratch {
  std::vector<int64_t> experts;
  std::vector<float> expert_weights, probs, expert_products;
  std::vector<SharedActivations> expert_inputs;
};

// A sparse mixture-of-experts MLP for one decode token (Qwen3-MoE, Mixtral, ...): a float32 router picks the
// top_k experts from the softmax of its logits (renormalized over them when `normalize`), each chosen expert's
// gated SiLU MLP runs, and their outputs are summed with the routing weights, in expert order as transformers
// adds them. The threads share the router's rows, then every chosen expert's gate_up rows, then their down
// rows (a barrier after each); each thread routes for itself (the same arithmetic, so the same experts) and
// adds the weighted sum to its own copy of the residual stream.
class MoeMlp {
 public:
  // router: [experts, hidden] float32; parts: (qweight, scales, mins, supers) of every expert's parts, expert by
  // expert, gate_up's then down's; part_counts: (gate_up parts, down parts) per expert; formats: (bits,
  // group_size, zero_point, arrangement) per part; precise: whether gate_up's and down's activations take two
  // int8 codes each.
  MoeMlp(torch::Tensor router, std::vector<std::vector<torch::Tensor>> parts, std::vector<int64_t> part_counts,
         std::vector<int64_t> formats, int64_t top_k, bool normalize, std::vector<bool> precise)
      : router_(router.to(torch::kFloat).contiguous()), top_k_(top_k), normalize_(normalize) {
    TORCH_CHECK(router_.dim() == 2, "the router is [experts, hidden]");
    const int64_t experts = router_.size(0);
    TORCH_CHECK(part_counts.size() == static_cast<size_t>(2 * experts), "two part counts per expert");
    TORCH_CHECK(precise.size() == 2, "precise: gate_up's and down's");
    TORCH_CHECK(formats.size() == kFormatFields * parts.size(), "formats has four entries per part");
    TORCH_CHECK(1 <= top_k && top_k <= experts, "top_k must be in 1..experts");
    size_t first = 0;
    for (int64_t e = 0; e < experts; ++e) {
      const size_t gate_up = part_counts[2 * e], down = part_counts[2 * e + 1];
      TORCH_CHECK(gate_up >= 1 && down >= 1 && first + gate_up + down <= parts.size(), "part counts do not match parts");
      gate_up_.push_back(std::make_unique<Projection>(parts, formats, first, gate_up, precise[0]));
      down_.push_back(std::make_unique<Projection>(parts, formats, first + gate_up, down, precise[1]));
      first += gate_up + down;
      TORCH_CHECK(gate_up_.back()->N == 2 * down_.back()->K && gate_up_.back()->K == router_.size(1) &&
                  down_.back()->N == router_.size(1) && down_.back()->K == down_[0]->K,
                  "MoeMlp: inconsistent expert shapes");
    }
    width_ = down_[0]->K;
    batchable_ = one_activation_layout(gate_up_) && one_activation_layout(down_);
    logits_.resize(experts);
    gate_up_out_.resize(top_k * 2 * width_);
    down_out_.resize(top_k * hidden());
  }

  int64_t hidden() const { return router_.size(1); }

  // Whether forward_batch runs these experts: their projections read activations of one layout each (gate_up's,
  // down's), known at construction.
  bool batchable() const { return batchable_; }

  // A batch's routed experts at once (a prefill): see moe_prefill.h. `run` [experts] picks the experts run here.
  torch::Tensor forward_batch(const torch::Tensor& hidden, const torch::Tensor& ids, const torch::Tensor& weights,
                              const torch::Tensor& run) const {
    TORCH_CHECK(batchable_, "moe_prefill: the experts' projections read activations of several layouts");
    return moe_prefill(gate_up_, down_, hidden, ids, weights, run);
  }

  void reserve(int threads, MoeScratch& s) {
    for (auto& p : gate_up_) p->reserve_claims(threads);
    for (auto& p : down_) p->reserve_claims(threads);
    s.experts.resize(std::max<size_t>(s.experts.size(), top_k_));
    s.expert_weights.resize(std::max<size_t>(s.expert_weights.size(), top_k_));
    s.expert_products.resize(std::max<size_t>(s.expert_products.size(), top_k_ * width_));
    s.probs.resize(std::max<size_t>(s.probs.size(), router_.size(0)));
    if (s.expert_inputs.size() < static_cast<size_t>(top_k_ + 1)) s.expert_inputs.resize(top_k_ + 1);
  }

  // `normed`: this thread's normalized input; the weighted sum of the chosen experts' outputs is added to `res`.
  // barrier() is the region's; gate_up_done() and down_done() mark the phases (for profiling).
  template <typename Barrier, typename GateUpDone, typename DownDone>
  void run(int tid, int n, MoeScratch& s, const float* normed, float* res, Barrier&& barrier,
           GateUpDone&& gate_up_done, DownDone&& down_done) {
    const int64_t experts = router_.size(0), H = hidden(), W = width_;
    const float* router = router_.data_ptr<float>();
    for (int64_t e = experts * tid / n; e < experts * (tid + 1) / n; ++e) {
      logits_[e] = dot(router + e * H, normed, H);
    }
    barrier();
    route(s);
    SharedActivations& input = s.expert_inputs[0];
    input.reset(normed);
    for (int64_t j = 0; j < top_k_; ++j) {
      gate_up_[s.experts[j]]->multiply(tid, n, input, gate_up_out_.data() + j * 2 * W, nullptr);
    }
    gate_up_done();
    barrier();
    for (int64_t j = 0; j < top_k_; ++j) gate_up_[s.experts[j]]->release(tid);
    for (int64_t j = 0; j < top_k_; ++j) {
      const float* gate = gate_up_out_.data() + j * 2 * W;
      float* product = s.expert_products.data() + j * W;
      silu_and_mul(gate, gate + W, product, W);
      SharedActivations& inputs = s.expert_inputs[j + 1];
      inputs.reset(product);
      down_[s.experts[j]]->multiply(tid, n, inputs, down_out_.data() + j * H, nullptr);
    }
    down_done();
    barrier();
    for (int64_t j = 0; j < top_k_; ++j) down_[s.experts[j]]->release(tid);
    for (int64_t h = 0; h < H; ++h) {
      float sum = 0.f;
      for (int64_t j = 0; j < top_k_; ++j) sum += s.expert_weights[j] * down_out_[j * H + h];
      res[h] += sum;
    }
  }

 private:
  // The top_k experts of the softmax of the router's logits and their weights, into s.experts and
  // s.expert_weights in ascending expert order (the order transformers adds their outputs in).
  void route(MoeScratch& s) const {
    const int64_t experts = router_.size(0);
    float top = logits_[0];
    for (int64_t e = 1; e < experts; ++e) top = std::max(top, logits_[e]);
    float total = 0.f;
    std::vector<float>& probs = s.probs;
    for (int64_t e = 0; e < experts; ++e) total += probs[e] = std::exp(logits_[e] - top);
    std::vector<std::pair<float, int64_t>> chosen(top_k_, {-1.f, -1});
    for (int64_t e = 0; e < experts; ++e) {  // top_k by insertion: the largest first, the lower id on a tie
      const float p = probs[e] / total;
      if (p <= chosen.back().first) continue;
      int64_t j = top_k_ - 1;
      while (j > 0 && chosen[j - 1].first < p) {
        chosen[j] = chosen[j - 1];
        --j;
      }
      chosen[j] = {p, e};
    }
    float sum = 0.f;
    for (const auto& c : chosen) sum += c.first;
    std::sort(chosen.begin(), chosen.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    for (int64_t j = 0; j < top_k_; ++j) {
      s.experts[j] = chosen[j].second;
      s.expert_weights[j] = normalize_ ? chosen[j].first / sum : chosen[j].first;
    }
  }

  static float dot(const float* a, const float* b, int64_t n) {
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
  }

  torch::Tensor router_;
  int64_t top_k_;
  bool normalize_;
  int64_t width_ = 0;
  bool batchable_ = false;
  std::vector<std::unique_ptr<Projection>> gate_up_, down_;
  std::vector<float> logits_, gate_up_out_, down_out_;
};

}  // namespace
