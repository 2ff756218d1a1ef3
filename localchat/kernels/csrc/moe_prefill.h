// A batch's routed experts in one call (a prefill's mixture-of-experts MLP): every chosen (token, expert) pair's
// gated SiLU MLP on the integer panel kernels, the experts' work shared by the threads in one parallel region,
// where running the experts one after the other from Python paid a call, a gather, a scatter and a fork/join of
// the threads per expert and projection.
#pragma once
#include "torch_api.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "decode_projection.h"
#include "vector_math.h"

namespace {

// Weight passes (kRowsPerPass rows each) one work item multiplies: a band of an expert's rows, small enough that
// a prefill's few busy experts still split across the threads.
constexpr int64_t kMoeItemPasses = 32;

// One work item: passes [begin, end) of one expert's projection.
struct MoeItem {
  int64_t expert, begin, end;
};

// Whether every projection's parts read activation rows of one layout (a layer's experts share their types).
inline bool one_activation_layout(const std::vector<std::unique_ptr<Projection>>& projections) {
  const PackedRef& first = *projections[0]->parts[0];
  for (const auto& projection : projections) {
    for (const auto& part : projection->parts) {
      if (!same_activations(first, *part)) return false;
    }
  }
  return true;
}

// out[m, :] (rows of `out_stride` floats) = acts[m] against projection's rows, for the passes of `item`; the rows
// of the projection's parts land one after the other, as Projection::multiply_passes places them.
inline void multiply_item(const Projection& projection, const MoeItem& item, const ActivationRow* acts, int64_t rows,
                          float* out, int64_t out_stride, void* scratch) {
  int64_t first_pass = 0, first_row = 0;
  for (const auto& part : projection.parts) {
    const int64_t lo = std::max<int64_t>(item.begin - first_pass, 0);
    const int64_t hi = std::min<int64_t>(item.end - first_pass, part->passes);
    if (lo < hi) part->multiply_rows(acts, rows, lo, hi, out + first_row, out_stride, nullptr, scratch);
    first_pass += part->passes;
    first_row += part->N;
  }
}

// The work items of the experts with pairs: each expert's passes in bands of kMoeItemPasses.
inline std::vector<MoeItem> moe_items(const std::vector<std::unique_ptr<Projection>>& projections,
                                      const std::vector<int64_t>& offsets) {
  std::vector<MoeItem> items;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    if (offsets[e + 1] == offsets[e]) continue;
    for (int64_t begin = 0; begin < projections[e]->passes; begin += kMoeItemPasses) {
      items.push_back({static_cast<int64_t>(e), begin, std::min(projections[e]->passes, begin + kMoeItemPasses)});
    }
  }
  return items;
}

// Each item's rows: the activation rows of the pairs of its expert, multiplied into out[pair, :]. The threads
// claim the items one at a time: an item's cost follows its expert's rows, which routing spreads unevenly, so
// halves of the list cut in advance left one thread waiting for the other.
template <typename ActsOf>
void run_items(const std::vector<std::unique_ptr<Projection>>& projections, const std::vector<MoeItem>& items,
               const std::vector<int64_t>& offsets, ActsOf&& acts_of, float* out, int64_t out_stride) {
  const int64_t count = static_cast<int64_t>(items.size());
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), count), 1, [&](int64_t, int64_t) {
    std::vector<PanelLine> scratch(kPanelLines);
    std::vector<ActivationRow> acts;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      const MoeItem& item = items[i];
      const int64_t first = offsets[item.expert], rows = offsets[item.expert + 1] - first;
      acts.clear();
      for (int64_t p = first; p < first + rows; ++p) acts.push_back(acts_of(p));
      multiply_item(*projections[item.expert], item, acts.data(), rows, out + first * out_stride, out_stride,
                    scratch.data());
    }
  });
}

// hidden [T, H] float32; ids [T, k] int64 and weights [T, k] float32, each token's experts and routing weights;
// run [E] bool, the experts this call runs (the others' pairs are left out). Returns [T, H] float32: for each token,
// the sum over its slots whose expert runs here of weight * down(silu(gate) * up), added in ascending expert
// order. Each pair's products are the panel kernels', which give a row the same result whatever its batch, so
// an expert's output equals its projections' quant_linear on its rows. Every gate_up (and every down) must read
// activations of one layout (one_activation_layout; MoeMlp checks it once).
inline torch::Tensor moe_prefill(const std::vector<std::unique_ptr<Projection>>& gate_up,
                                 const std::vector<std::unique_ptr<Projection>>& down, const torch::Tensor& hidden_in,
                                 const torch::Tensor& ids_in, const torch::Tensor& weights_in,
                                 const torch::Tensor& run_in) {
  const int64_t experts = static_cast<int64_t>(gate_up.size()), H = down[0]->N, W = down[0]->K;
  const torch::Tensor hidden = hidden_in.to(torch::kFloat).contiguous();
  const torch::Tensor ids = ids_in.to(torch::kLong).contiguous();
  const torch::Tensor weights = weights_in.to(torch::kFloat).contiguous();
  const torch::Tensor run = run_in.to(torch::kBool).contiguous();
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == H, "moe_prefill: hidden must be [T, hidden]");
  TORCH_CHECK(ids.dim() == 2 && ids.size(0) == hidden.size(0) && weights.sizes() == ids.sizes(),
              "moe_prefill: ids and weights must be [T, k]");
  TORCH_CHECK(run.dim() == 1 && run.size(0) == experts, "moe_prefill: run must be [experts]");
  const int64_t T = hidden.size(0), k = ids.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* weight = weights.data_ptr<float>();
  const bool* runs = run.data_ptr<bool>();
  for (int64_t p = 0; p < T * k; ++p) TORCH_CHECK(0 <= id[p] && id[p] < experts, "moe_prefill: an expert id out of range");

  // the pairs (token * k + slot) this call runs, grouped by expert, by token within an expert
  std::vector<int64_t> offsets(experts + 1, 0);
  for (int64_t p = 0; p < T * k; ++p) offsets[id[p] + 1] += runs[id[p]];
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
  const int64_t P = offsets[experts];
  std::vector<int64_t> pairs(P), position(T * k, -1), next(offsets.begin(), offsets.end() - 1);
  for (int64_t p = 0; p < T * k; ++p) {
    if (runs[id[p]]) pairs[position[p] = next[id[p]]++] = p;
  }
  torch::Tensor out = torch::zeros({T, H}, torch::kFloat);
  if (P == 0) return out;

  // the tokens' activation rows, in the layout every gate_up reads
  const PackedRef& gate_up_like = *gate_up[0]->parts[0];
  ActivationBuffers token_acts(T, H, gate_up_like.L);
  const float* x = hidden.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) gate_up_like.quantize_into(x + t * H, token_acts.rows[t]);
  });
  std::vector<float> gate_ups(P * 2 * W);
  run_items(gate_up, moe_items(gate_up, offsets), offsets,
            [&](int64_t q) { return token_acts.rows[pairs[q] / k]; }, gate_ups.data(), 2 * W);

  // each pair's SiLU product, as the activation rows every down reads
  const PackedRef& down_like = *down[0]->parts[0];
  ActivationBuffers product_acts(P, W, down_like.L);
  at::parallel_for(0, P, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> product(W);
    for (int64_t q = begin; q < end; ++q) {
      const float* gate = gate_ups.data() + q * 2 * W;
      silu_and_mul(gate, gate + W, product.data(), W);
      down_like.quantize_into(product.data(), product_acts.rows[q]);
    }
  });
  std::vector<float> downs(P * H);
  run_items(down, moe_items(down, offsets), offsets, [&](int64_t q) { return product_acts.rows[q]; },
            downs.data(), H);

  // each token's weighted outputs, in ascending expert order
  float* o = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> slots(k);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < k; ++j) slots[j] = t * k + j;
      std::sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
      float* row = o + t * H;
      for (int64_t p : slots) {
        if (position[p] < 0) continue;
        const float* d = downs.data() + position[p] * H;
        const float w = weight[p];
        for (int64_t h = 0; h < H; ++h) row[h] += d[h] * w;
      }
    }
  });
  return out;
}

}  // namespace
