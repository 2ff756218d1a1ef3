// The quantized projections of the CPU decode stack (decode_layer.h): a PackedWeight as the kernels see it
// (PackedRef), the rows of several stacked into one projection the threads share (Projection), and the activation
// rows of an input that the weights reading it in the same layout share: a thread's own of one token's
// (SharedActivations), or those of several tokens the threads quantize together (TokenActivations).
#pragma once
#include "torch_api.h"

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
  PanelFn panel = nullptr;
  // the tensors' data, as pass_view takes it (read per pass: Tensor::data_ptr checks its type each call)
  const uint8_t* codes = nullptr;
  const void* scale_data = nullptr;
  const void* min_data = nullptr;
  const void* super_data = nullptr;

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
    panel = pick_panel(precise, symmetric, k_scales, L);
    codes = qweight.data_ptr<uint8_t>();
    scale_data = scales.data_ptr();
    min_data = symmetric ? nullptr : mins.data_ptr();
    super_data = k_scales ? supers.data_ptr<at::Half>() : nullptr;
  }
  PackedRef(const PackedRef&) = delete;
  PackedRef& operator=(const PackedRef&) = delete;

  // The bytes one product reads: codes, scales, mins and super-scales.
  int64_t bytes() const {
    int64_t total = qweight.nbytes() + scales.nbytes();
    if (!symmetric) total += mins.nbytes();
    if (k_scales) total += supers.nbytes();
    return total;
  }

  // x quantized as this weight's products read it (see same_activations)
  void quantize_into(const float* x, ActivationRow& row) const {
    quantize_chunks(x, K, L, 0, chunks, precise, zero_point, row);
  }

  // The view of the pass whose first row is n.
  PassView view(int64_t n) const {
    return pass_view(codes, scale_data, min_data, super_data, n, N, w_row, groups, interleaved);
  }

  // Output rows [pass_begin, pass_end) * kRowsPerPass of one activation row (quantized for this weight), the GEMV's.
  void multiply(const ActivationRow& row, int64_t pass_begin, int64_t pass_end, float* out,
                const float* bias) const {
    gemv_passes(gemv, [this](int64_t n) { return view(n); }, N, w_row, groups, chunks, weight_bytes, L, row,
                pass_begin, pass_end, out, bias);
  }

  // ... of `rows` activation rows, into out[m * out_stride + row] (panel_passes; scratch: kPanelRows *
  // kPanelScratchPerRow bytes, 64-byte aligned).
  void multiply_rows(const ActivationRow* acts, int64_t rows, int64_t pass_begin, int64_t pass_end, float* out,
                     int64_t out_stride, const float* bias, void* scratch) const {
    panel_passes(panel, [this](int64_t n) { return view(n); }, N, groups, chunks, weight_bytes, L, acts, rows,
                 pass_begin, pass_end, out, out_stride, bias, scratch);
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
// layer's experts share their layouts, and so do the layers of a stack, so a thread quantizes an input once per
// layout, not once per weight, into buffers that stay in its caches from one projection to the next.
class SharedActivations {
 public:
  void reset(const float* x) {
    input_ = x;
    for (auto& entry : entries_) entry->ready = false;
  }

  int64_t rows() const { return 1; }

  const ActivationRow* rows_for(const PackedRef& weight) {
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
    return found->buffers.rows.data();
  }

  void* panel_scratch() { return nullptr; }  // (one row: the GEMV's)

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

// A 64-byte line of the panel kernel's accumulators (kPanelRows * kPanelScratchPerRow bytes of them a thread).
struct alignas(64) PanelLine {
  uint8_t bytes[64];
};
constexpr int64_t kPanelLines = kPanelRows * kPanelScratchPerRow / sizeof(PanelLine);

// Per part, DecodeLayer's `formats` holds (bits, group_size, zero_point, arrangement).
constexpr size_t kFormatFields = 4;

// How many passes a thread claims at a time from a range of a projection (its own, or another thread's once
// its own is done).
constexpr int64_t kClaimPasses = 8;

// The passes claimed so far from one thread's range, on a cache line of its own.
struct alignas(64) Claims {
  std::atomic<int64_t> next{0};
};

// The most PackedWeights one projection stacks (q, k and v take three).
constexpr size_t kMaxParts = 8;

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
    TORCH_CHECK(count <= kMaxParts, "a projection stacks at most ", kMaxParts, " weights");
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

  // Room for the threads' claims.
  void reserve_claims(int threads) {
    if (claim_slots < threads) {
      claims = std::make_unique<Claims[]>(threads);
      claim_slots = threads;
    }
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

  // The product of the input's rows (out: [inputs.rows(), N]), its rows shared by the threads: each claims
  // kClaimPasses at a time from its own range, then from the others' until every range is claimed, so a thread the
  // machine slowed down (a vCPU's neighbours, an interrupt) does not keep the other waiting at the barrier. Each
  // thread claims from its own range's start and a helper takes the next claim, so both read contiguous runs of
  // the weight. Every thread passes its own activations of the same input.
  // Inputs: SharedActivations (a thread's own), or TokenRows (the tokens' rows the threads quantized together).
  template <typename Inputs>
  void multiply(int thread, int threads, Inputs& inputs, float* out, const float* bias) {
    const ActivationRow* acts[kMaxParts];  // each part's activation rows, looked up once, not per claim
    for (size_t i = 0; i < parts.size(); ++i) acts[i] = inputs.rows_for(*parts[i]);
    const int64_t rows = inputs.rows();
    void* scratch = inputs.panel_scratch();
    for (int k = 0; k < threads; ++k) {
      const int owner = (thread + k) % threads;
      const int64_t begin = first_pass_of(owner, threads), end = first_pass_of(owner + 1, threads);
      std::atomic<int64_t>& next = claims[owner].next;
      for (;;) {
        const int64_t first = begin + next.fetch_add(kClaimPasses, std::memory_order_relaxed);
        if (first >= end) break;
        multiply_passes(acts, rows, scratch, first, std::min(end, first + kClaimPasses), out, bias);
      }
    }
  }

  // Ready for the next product: each thread resets its own range's claims after the barrier that follows a
  // product, so the next barrier publishes the reset before the projection is used again.
  void release(int thread) { claims[thread].next.store(0, std::memory_order_relaxed); }

  // Passes [begin, end) over all parts (each part's rows land after the previous part's), from `rows` activation
  // rows in each part's layout (acts[part]): the GEMV for one row, the panel (scratch) for several.
  void multiply_passes(const ActivationRow* const* acts, int64_t rows, void* scratch, int64_t begin, int64_t end,
                       float* out, const float* bias) const {
    int64_t first_pass = 0, first_row = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const PackedRef& part = *parts[i];
      const int64_t lo = std::max<int64_t>(begin - first_pass, 0);
      const int64_t hi = std::min<int64_t>(end - first_pass, part.passes);
      const float* b = bias ? bias + first_row : nullptr;
      if (lo < hi && rows == 1) {
        part.multiply(*acts[i], lo, hi, out + first_row, b);
      } else if (lo < hi) {
        part.multiply_rows(acts[i], rows, lo, hi, out + first_row, N, b, scratch);
      }
      first_pass += part.passes;
      first_row += part.N;
    }
  }
};

// The activation rows of several tokens' input to a projection, which the threads quantize together (each its
// share of the tokens, then a barrier) and then all read: one set of rows per activation layout of the stack's
// projections, made outside the parallel region (add), so the region only writes rows into them.
class TokenActivations {
 public:
  // Room for `rows` tokens in the layouts of `projection`'s parts. Called outside the region.
  void add(const Projection& projection, int64_t rows) {
    for (const auto& part : projection.parts) {
      Entry* entry = find(*part);
      if (!entry) {
        entries_.push_back(std::make_unique<Entry>(*part));
        entry = entries_.back().get();
      }
      if (static_cast<int64_t>(entry->buffers.rows.size()) < rows) entry->buffers = ActivationBuffers(rows, part->K, part->L);
    }
  }

  // Tokens [m0, m1) of x (rows `stride` floats apart) quantized in each layout that `projection`'s parts read.
  void quantize(const Projection& projection, const float* x, int64_t stride, int64_t m0, int64_t m1) {
    for (size_t i = 0; i < projection.parts.size(); ++i) {
      const PackedRef& part = *projection.parts[i];
      bool done = false;  // by an earlier part of the same layout
      for (size_t j = 0; j < i; ++j) done = done || same_activations(*projection.parts[j], part);
      if (done) continue;
      Entry* entry = find(part);
      for (int64_t m = m0; m < m1; ++m) part.quantize_into(x + m * stride, entry->buffers.rows[m]);
    }
  }

  const ActivationRow* rows_for(const PackedRef& weight) { return find(weight)->buffers.rows.data(); }

 private:
  struct Entry {
    explicit Entry(const PackedRef& weight) : like(&weight) {}
    const PackedRef* like;
    ActivationBuffers buffers;
  };

  Entry* find(const PackedRef& weight) {
    for (auto& entry : entries_) {
      if (same_activations(*entry->like, weight)) return entry.get();
    }
    return nullptr;
  }

  std::vector<std::unique_ptr<Entry>> entries_;
};

// A thread's view of the tokens' TokenActivations, as Projection::multiply reads its inputs.
struct TokenRows {
  TokenActivations& activations;
  int64_t count;
  void* scratch;  // this thread's panel accumulators (kPanelLines)

  int64_t rows() const { return count; }
  const ActivationRow* rows_for(const PackedRef& weight) { return activations.rows_for(weight); }
  void* panel_scratch() { return scratch; }
};

}  // namespace
