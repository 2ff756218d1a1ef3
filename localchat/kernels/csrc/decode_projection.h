// The quantized projections of the CPU decode stack (decode_layer.h): a PackedWeight as the kernels see it
// (PackedRef), the rows of several stacked into one projection the threads share (Projection), and activation
// rows one input shares between the weights that read it in the same layout (SharedActivations).
#pragma once
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#include "quant_linear.h"

namespace {

// A PackedWeight's tensors and what the kernels need to know about them.
struct PackedRef {
  torch::Tensor qweight, scales, mins, supers;
  Layout L;
  int64_t N = 0, K = 0, groups = 0, w_row = 0, chunks = 0, weight_bytes = 0, passes = 0;
  int32_t zero_point = 0;
  bool symmetric = true;
  bool interleaved = false;
  bool k_scales = false;  // scales/mins are K-quant sub-scales (bytes) with supers (d, dmin)
  bool precise = true;    // two int8 codes per activation (quant_linear.h), else one
  GemvFn gemv = nullptr;
  ActivationBuffers act;  // holds pointers into its own storage: a PackedRef is never copied

  // m, u: undefined or empty when absent
  PackedRef(torch::Tensor q, torch::Tensor s, torch::Tensor m, torch::Tensor u, int64_t bits, int64_t group_size,
            int64_t zp, int64_t arrangement, bool precise_codes)
      : qweight(std::move(q)), scales(std::move(s)), L(make_layout(bits, group_size, arrangement)) {
    interleaved = arrangement == kInterleaved;
    precise = precise_codes;
    symmetric = !(m.defined() && m.numel() > 0);
    k_scales = u.defined() && u.numel() > 0;
    if (!symmetric) mins = m;
    if (k_scales) supers = u;
    // the checks quant_linear makes
    (void)WeightArgs(qweight, scales, symmetric ? c10::optional<torch::Tensor>() : mins,
                     k_scales ? c10::optional<torch::Tensor>(supers) : c10::optional<torch::Tensor>(), false);
    N = qweight.size(0);
    K = L.in_features(qweight.size(1));
    groups = K / L.group_size;
    w_row = qweight.size(1);
    chunks = (K + L.chunk_values - 1) / L.chunk_values;
    weight_bytes = L.code_bytes(K);
    passes = (N + kRowsPerPass - 1) / kRowsPerPass;
    zero_point = symmetric ? static_cast<int32_t>(zp) : 0;
    gemv = pick_gemv(precise, symmetric, k_scales, L);
  }
  PackedRef(const PackedRef&) = delete;
  PackedRef& operator=(const PackedRef&) = delete;

  // One activation row per thread (each thread quantizes the whole input for itself).
  void reserve(int threads) {
    if (static_cast<int>(act.rows.size()) < threads) act = ActivationBuffers(threads, K, L);
  }

  // The bytes one product reads: codes, scales, mins and super-scales.
  int64_t bytes() const {
    int64_t total = qweight.nbytes() + scales.nbytes();
    if (!symmetric) total += mins.nbytes();
    if (k_scales) total += supers.nbytes();
    return total;
  }

  void quantize(int thread, const float* x) { quantize_into(x, act.rows[thread]); }

  // x quantized as this weight's products read it (see same_activations)
  void quantize_into(const float* x, ActivationRow& row) const {
    quantize_chunks(x, K, L, 0, chunks, precise, zero_point, row);
  }

  // Output rows [pass_begin, pass_end) * kRowsPerPass, from this thread's activation row.
  void multiply(int thread, int64_t pass_begin, int64_t pass_end, float* out, const float* bias) const {
    multiply(act.rows[thread], pass_begin, pass_end, out, bias);
  }

  // ... from an activation row quantized for this weight elsewhere (SharedActivations)
  void multiply(const ActivationRow& row, int64_t pass_begin, int64_t pass_end, float* out,
                const float* bias) const {
    const uint8_t* wp = qweight.data_ptr<uint8_t>();
    const void* sp = scales.data_ptr();
    const void* mp = symmetric ? nullptr : mins.data_ptr();
    const at::Half* up = k_scales ? supers.data_ptr<at::Half>() : nullptr;
    for (int64_t pass = pass_begin; pass < pass_end; ++pass) {
      const int64_t n = pass * kRowsPerPass;
      const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
      float dots[kRowsPerPass];
      gemv(pass_view(wp, sp, mp, up, n, N, w_row, groups, interleaved), w_row, groups, chunks,
           weight_bytes, L, row, count, dots);
      for (int r = 0; r < count; ++r) out[n + r] = bias ? dots[r] + bias[n + r] : dots[r];
    }
  }
};

// Whether two weights read the same activation row for the same input: it depends on the weight's layout (its
// chunks and groups), the precision of the codes, and the zero point folded into the row's sums.
bool same_activations(const PackedRef& a, const PackedRef& b) {
  return a.K == b.K && a.precise == b.precise && a.zero_point == b.zero_point && a.L.nibbles == b.L.nibbles &&
         a.L.u6 == b.L.u6 && a.L.group_size == b.L.group_size && a.L.chunk_values == b.L.chunk_values &&
         a.L.act_chunk_bytes == b.L.act_chunk_bytes && a.L.file == b.L.file;
}

// One thread's activation rows of one input, one per distinct activation layout of the weights that read it: a
// layer's experts share their layouts, so a thread quantizes the input once per layout, not once per expert, and
// the experts hold no activation buffers of their own.
class SharedActivations {
 public:
  void reset(const float* x) {
    input_ = x;
    for (auto& entry : entries_) entry->ready = false;
  }

  const ActivationRow& row_for(const PackedRef& weight) {
    Entry* found = nullptr;
    for (auto& entry : entries_) {
      if (same_activations(*entry->like, weight)) found = entry.get();
    }
    if (!found) {  // a layout first met: its buffers are kept for the next inputs
      entries_.push_back(std::make_unique<Entry>(weight));
      found = entries_.back().get();
    }
    if (!found->ready) {
      weight.quantize_into(input_, found->buffers.rows[0]);
      found->ready = true;
    }
    return found->buffers.rows[0];
  }

 private:
  struct Entry {
    explicit Entry(const PackedRef& weight) : like(&weight), buffers(1, weight.K, weight.L) {}
    const PackedRef* like;
    ActivationBuffers buffers;  // holds pointers into its own storage: an Entry is never moved
    bool ready = false;
  };
  std::vector<std::unique_ptr<Entry>> entries_;
  const float* input_ = nullptr;
};

// Per part, DecodeLayer's `formats` holds (bits, group_size, zero_point, arrangement).
constexpr size_t kFormatFields = 4;

// How many passes a thread claims at a time from a range of a projection (its own, or another thread's once
// its own is done).
constexpr int64_t kClaimPasses = 8;

// The passes claimed so far from one thread's range, on a cache line of its own.
struct alignas(64) Claims {
  std::atomic<int64_t> next{0};
};

// A projection whose output rows come from one or more PackedWeights, stacked: a GGUF file may store q, k
// and v (or gate and up) in different types, as Q4_K_M files do.
struct Projection {
  std::vector<std::unique_ptr<PackedRef>> parts;
  int64_t N = 0, K = 0, passes = 0;
  double bytes = 0.0;  // what one product reads of the parts' tensors
  std::unique_ptr<Claims[]> claims;  // one per thread
  int claim_slots = 0;

  Projection() = default;
  // parts: (qweight, scales, mins, supers) each, the last two empty when absent; formats: (bits, group_size,
  // zero_point, arrangement) each
  Projection(const std::vector<std::vector<torch::Tensor>>& tensors, const std::vector<int64_t>& formats,
             size_t first, size_t count, bool precise) {
    for (size_t i = first; i < first + count; ++i) {
      const auto& t = tensors[i];
      TORCH_CHECK(t.size() == 4, "a part is (qweight, scales, mins, supers), the last two empty when absent");
      const int64_t* f = formats.data() + kFormatFields * i;
      parts.push_back(std::make_unique<PackedRef>(t[0], t[1], t[2], t[3], f[0], f[1], f[2], f[3], precise));
      TORCH_CHECK(parts.size() == 1 || parts.back()->K == K, "the parts of a projection share in_features");
      K = parts.back()->K;
      N += parts.back()->N;
      passes += parts.back()->passes;
      bytes += static_cast<double>(parts.back()->bytes());
    }
  }

  void reserve(int threads) {
    for (auto& part : parts) part->reserve(threads);
    reserve_claims(threads);
  }

  // Room for the threads' claims only: a projection whose activations come from SharedActivations (an expert's).
  void reserve_claims(int threads) {
    if (claim_slots < threads) {
      claims = std::make_unique<Claims[]>(threads);
      claim_slots = threads;
    }
  }

  void quantize(int thread, const float* x) {
    for (auto& part : parts) part->quantize(thread, x);
  }

  // The first pass of thread `thread` of `threads`: the threads share the parts' bytes evenly, not their passes,
  // since parts of different types differ in bytes per row (a Q4_K_M file's q and k are Q4_K, its v often Q6_K,
  // and an even split of passes left the thread with v about 3 ms a token behind on an 8B model).
  int64_t first_pass_of(int thread, int threads) const {
    if (thread >= threads) return passes;
    const double target = bytes * thread / threads;
    double before = 0.0;
    int64_t first = 0;
    for (const auto& part : parts) {
      const double part_bytes = static_cast<double>(part->bytes());
      if (before + part_bytes > target) {
        const double share = (target - before) / part_bytes;
        return first + std::min<int64_t>(part->passes, std::llround(share * part->passes));
      }
      before += part_bytes;
      first += part->passes;
    }
    return passes;
  }

  // The product's rows, shared by the threads: each claims kClaimPasses at a time from its own range, then
  // from the others' until every range is claimed, so a thread the machine slowed down (a vCPU's neighbours,
  // an interrupt) does not keep the other waiting at the barrier. Each thread claims from its own range's
  // start and a helper takes the next claim, so both read contiguous runs of the weight.
  void multiply(int thread, int threads, float* out, const float* bias, SharedActivations* shared = nullptr) {
    for (int k = 0; k < threads; ++k) {
      const int owner = (thread + k) % threads;
      const int64_t begin = first_pass_of(owner, threads), end = first_pass_of(owner + 1, threads);
      std::atomic<int64_t>& next = claims[owner].next;
      for (;;) {
        const int64_t first = begin + next.fetch_add(kClaimPasses, std::memory_order_relaxed);
        if (first >= end) break;
        multiply_passes(thread, first, std::min(end, first + kClaimPasses), out, bias, shared);
      }
    }
  }

  // Ready for the next product: each thread resets its own range's claims after the barrier that follows a
  // product, so the next barrier publishes the reset before the projection is used again.
  void release(int thread) { claims[thread].next.store(0, std::memory_order_relaxed); }

  // Passes [begin, end) over all parts (each part's rows land after the previous part's), with this thread's
  // activation row (the part's own, or the shared one for its layout).
  void multiply_passes(int thread, int64_t begin, int64_t end, float* out, const float* bias,
                       SharedActivations* shared) const {
    int64_t first_pass = 0, first_row = 0;
    for (const auto& part : parts) {
      const int64_t lo = std::max<int64_t>(begin - first_pass, 0);
      const int64_t hi = std::min<int64_t>(end - first_pass, part->passes);
      float* rows = out + first_row;
      const float* b = bias ? bias + first_row : nullptr;
      if (lo < hi && shared) part->multiply(shared->row_for(*part), lo, hi, rows, b);
      else if (lo < hi) part->multiply(thread, lo, hi, rows, b);
      first_pass += part->passes;
      first_row += part->N;
    }
  }
};

}  // namespace
