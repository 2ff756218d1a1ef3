// The torch entry points that restore a packed weight's rows to floats (quant/restore.h does the work): an embedding
// lookup (dequantize_rows), the dense weight (dequantize), and the bfloat16 GEMM of a prefill chunk
// (dense_linear_bf16).
#pragma once
#include "torch_api.h"

#include "quant/restore.h"
#include "quant_linear.h"

torch::Tensor dequantize_rows(const torch::Tensor& qweight, const torch::Tensor& scales,
                              const c10::optional<torch::Tensor>& mins_in,
                              const c10::optional<torch::Tensor>& supers_in, int64_t bits, int64_t group_size,
                              int64_t zero_point, int64_t arrangement, const torch::Tensor& rows_in);

// The dense float32 weight [N, K] (for large batches, where one float GEMM beats per-row integer dots): every row
// through the row restore.
torch::Tensor dequantize(const torch::Tensor& qweight_in, const torch::Tensor& scales_in,
                         const c10::optional<torch::Tensor>& mins_in, const c10::optional<torch::Tensor>& supers_in,
                         int64_t bits, int64_t group_size, int64_t zero_point, int64_t arrangement) {
  return dequantize_rows(qweight_in, scales_in, mins_in, supers_in, bits, group_size, zero_point, arrangement,
                         torch::arange(qweight_in.size(0)));
}

// Rows `rows` (int64, any shape) of a packed weight as float32 [*rows.shape, K]: an embedding lookup. Only the
// looked-up rows are read, in either layout (no copy of the weight is restored).
torch::Tensor dequantize_rows(const torch::Tensor& qweight, const torch::Tensor& scales,
                              const c10::optional<torch::Tensor>& mins_in,
                              const c10::optional<torch::Tensor>& supers_in, int64_t bits, int64_t group_size,
                              int64_t zero_point, int64_t arrangement, const torch::Tensor& rows_in) {
  const Layout L = make_layout(bits, group_size, arrangement);
  const WeightArgs w(qweight, scales, mins_in, supers_in, false);
  const torch::Tensor rows = rows_in.to(torch::kLong).contiguous();
  const int64_t N = w.qweight.size(0), K = L.in_features(w.qweight.size(1));
  const int64_t R = rows.numel();
  std::vector<int64_t> shape(rows.sizes().begin(), rows.sizes().end());
  shape.push_back(K);
  torch::Tensor out = torch::empty(shape, torch::kFloat);
  const int64_t* ids = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < R; ++i) TORCH_CHECK(ids[i] >= 0 && ids[i] < N, "row ", ids[i], " out of range for ", N, " rows");
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    RowRestorer restorer(w.view(), L, zero_point, arrangement == kInterleaved);
    for (int64_t i = begin; i < end; ++i) restorer.restore(ids[i], op + i * K);
  });
  return out;
}

// n floats as bfloat16, rounded to nearest even: the restore's last step where the CPU has no AVX-512 BF16
// (where it has, RowRestorer::restore_bf16 rounds as it restores)
void to_bfloat16(const float* in, int64_t n, at::BFloat16* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = static_cast<at::BFloat16>(in[k]);
}

// x [M, K] @ W.T as one bfloat16 GEMM (oneDNN) per band of weight rows, each band restored into a bfloat16 buffer
// that stays in the caches: for prefill chunks and large batches, where the GEMM beats per-row integer dots.
// The activations, the weights (dequantized exactly, then rounded) and the result pass through bfloat16. With
// `out` (float32 [M, N], any strides: a part's columns of a multi-part projection's output), the result is
// written there and returned, and no float32 temporary is made.
//
// Each thread takes its own share of the rows, band by band, and restores and multiplies them alone (a GEMM
// called inside the parallel region runs on its caller's thread): no band is restored by one core and read by
// another. Shared bands (restored by all threads, then one GEMM on all of them) made the prefill depend on where
// the host put the two cores: measured on the Zen 5 EPYC (2026-12-05, an 8B Q4_0 file, a 128-token prompt, in
// one process, alternating), 2.55-2.69 s with shared bands and 2.39-2.44 s with own ones where the cores shared an
// L3 (a cache line's round trip between them 146-152 ns), 3.45-3.51 s and 2.36-2.41 s where they did not (408-411
// ns). The results are the same bits.
torch::Tensor dense_linear_bf16(const torch::Tensor& x_in, const torch::Tensor& qweight, const torch::Tensor& scales,
                                const c10::optional<torch::Tensor>& mins_in,
                                const c10::optional<torch::Tensor>& supers_in, int64_t bits, int64_t group_size,
                                int64_t zero_point, int64_t arrangement, const c10::optional<torch::Tensor>& out) {
  const Layout L = make_layout(bits, group_size, arrangement);
  const WeightArgs w(qweight, scales, mins_in, supers_in, false);
  const int64_t N = w.qweight.size(0), K = L.in_features(w.qweight.size(1));
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == K, "x must be [M, ", K, "]");
  const torch::Tensor x = x_in.to(torch::kBFloat16).contiguous();
  // about 2 MiB of bfloat16 weights a band (an L2), a multiple of a pass's rows
  const int64_t band = std::max<int64_t>(kRowsPerPass, ((int64_t{1} << 20) / K) / kRowsPerPass * kRowsPerPass);
  torch::Tensor out_t = torch::empty({N, x.size(0)}, torch::kBFloat16);
  const int threads = at::get_num_threads();
  const int64_t passes = (N + kRowsPerPass - 1) / kRowsPerPass;
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    c10::InferenceMode guard(inference);  // (thread-local: the workers take the caller's)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = std::min(N, passes * t / threads * kRowsPerPass);
      const int64_t r1 = std::min(N, passes * (t + 1) / threads * kRowsPerPass);
      if (r0 >= r1) continue;
      torch::Tensor buffer = torch::empty({std::min(band, r1 - r0), K}, torch::kBFloat16);
      auto* bp = buffer.data_ptr<at::BFloat16>();
      RowRestorer restorer(w.view(), L, zero_point, arrangement == kInterleaved);
#if !(LC_VNNI && defined(__AVX512BF16__))
      std::vector<float> row(K);
#endif
      for (int64_t n0 = r0; n0 < r1; n0 += band) {
        const int64_t rows = std::min(band, r1 - n0);
        for (int64_t i = 0; i < rows; ++i) {
#if LC_VNNI && defined(__AVX512BF16__)
          restorer.restore_bf16(n0 + i, reinterpret_cast<uint16_t*>(bp) + i * K);
#else
          restorer.restore(n0 + i, row.data());
          to_bfloat16(row.data(), K, bp + i * K);
#endif
        }
        torch::Tensor band_out = out_t.narrow(0, n0, rows);
        at::mm_out(band_out, buffer.narrow(0, 0, rows), x.t());
      }
    }
  });
  if (out.has_value() && out->defined()) {
    TORCH_CHECK(out->scalar_type() == torch::kFloat && out->dim() == 2 && out->size(0) == x.size(0) && out->size(1) == N,
                "out must be float32 [", x.size(0), ", ", N, "]");
    torch::Tensor target = *out;
    target.copy_(out_t.t());
    return target;
  }
  return out_t.t().to(torch::kFloat);
}
