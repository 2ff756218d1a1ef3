// Quantized projections on the CPU: y = x @ W.T for a PackedWeight W (localchat/kernels/packed_weight.py), the
// torch entry points. The kernels and the types they share are in quant/ (quant/common.h explains the arithmetic and
// the layouts, docs/kernels.md how they are organized): this file checks a weight's tensors, quantizes the
// activations, and runs the kernel dispatch.h picks, a pass of rows at a time (a decode) or in panels (a batch).
#pragma once
#include "torch_api.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "quant/dispatch.h"
#include "quant/restore.h"
#include "vector_math.h"

namespace {

// Interleave (back=false) or restore (back=true) the rows of a 2-D contiguous uint8 or float16 tensor in place,
// `unit` elements at a time (64 for codes, kGroupBlock for scales and mins).
void interleave_rows_inplace(torch::Tensor& t, int64_t unit, bool back) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), "interleave_rows: a contiguous 2-D tensor");
  const int64_t blocks = t.size(0) / kRowsPerPass, width = t.size(1);
  auto run = [&](auto* base) {
    using T = std::remove_pointer_t<decltype(base)>;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> scratch(kRowsPerPass * width);
      for (int64_t b = begin; b < end; ++b) interleave_block(base + b * kRowsPerPass * width, width, unit, back, scratch.data());
    });
  };
  if (t.scalar_type() == torch::kUInt8) run(t.data_ptr<uint8_t>());
  else if (t.scalar_type() == torch::kHalf) run(t.data_ptr<at::Half>());
  else TORCH_CHECK(false, "interleave_rows: uint8 or float16");
}

}  // namespace

// A PackedWeight's tensors in the interleaved layout (back=false) or back to row-major (back=true), in place.
void interleave_weight(torch::Tensor qweight, torch::Tensor scales, const c10::optional<torch::Tensor>& mins,
                       const c10::optional<torch::Tensor>& supers, bool back) {
  interleave_rows_inplace(qweight, kChunkBytes, back);
  interleave_rows_inplace(scales, kGroupBlock, back);
  const bool k_scales = supers.has_value() && supers->defined();
  if (mins.has_value() && mins->defined()) {
    torch::Tensor m = *mins;
    interleave_rows_inplace(m, k_scales ? kGroupBlock / 2 : kGroupBlock, back);  // K-quant mins: half as wide
  }
  if (supers.has_value() && supers->defined()) {
    torch::Tensor u = *supers;
    interleave_rows_inplace(u, kSupersPerBlock, back);
  }
}

namespace {

// A packed weight's tensors as the kernels read them, checked; row-major copies when `restore`.
struct WeightArgs {
  torch::Tensor qweight, scales, mins, supers;
  bool has_mins = false, k_scales = false;

  WeightArgs(const torch::Tensor& q, const torch::Tensor& s, const c10::optional<torch::Tensor>& m,
             const c10::optional<torch::Tensor>& u, bool restore)
      : qweight(q), scales(s) {
    has_mins = m.has_value() && m->defined();
    k_scales = u.has_value() && u->defined();
    if (has_mins) mins = *m;
    if (k_scales) supers = *u;
    if (restore) {
      qweight = qweight.clone();
      scales = scales.clone();
      c10::optional<torch::Tensor> mc, uc;
      if (has_mins) mc = mins = mins.clone();
      if (k_scales) uc = supers = supers.clone();
      interleave_weight(qweight, scales, mc, uc, true);
    }
    TORCH_CHECK(qweight.scalar_type() == torch::kUInt8 && qweight.is_contiguous(), "qweight must be contiguous uint8");
    const auto param_type = k_scales ? torch::kUInt8 : torch::kHalf;
    TORCH_CHECK(scales.scalar_type() == param_type && scales.is_contiguous(),
                k_scales ? "K-quant sub-scales must be contiguous uint8" : "scales must be contiguous float16");
    if (has_mins && !k_scales) {
      TORCH_CHECK(mins.scalar_type() == param_type && mins.is_contiguous() && mins.sizes() == scales.sizes(),
                  "mins must be contiguous, typed and shaped like scales");
    }
    if (k_scales) {
      TORCH_CHECK(has_mins, "K-quant scales come with mins");
      TORCH_CHECK(mins.scalar_type() == torch::kUInt8 && mins.is_contiguous() && mins.dim() == 2 &&
                      mins.size(0) == scales.size(0) && mins.size(1) * 2 == scales.size(1),
                  "K-quant mins must be contiguous uint8 [rows, groups / 2]");
      TORCH_CHECK(scales.size(1) % 8 == 0 && supers.scalar_type() == torch::kHalf && supers.is_contiguous() &&
                      supers.size(0) == scales.size(0) && supers.size(1) == super_row(scales.size(1)),
                  "supers must be contiguous float16 [rows, groups / 4] ((d, dmin) per 8 groups)");
    }
  }

  // the arrays as the kernels read them
  WeightView view() const {
    return {qweight.data_ptr<uint8_t>(), scales.data_ptr(), has_mins ? mins.data_ptr() : nullptr,
            k_scales ? reinterpret_cast<const uint16_t*>(supers.data_ptr<at::Half>()) : nullptr, qweight.size(0),
            qweight.size(1)};
  }
};

// The products of a weight's passes [pass_begin, pass_end) (view(n): the pass whose first row is n), the loops
// quant_linear and the decode stack's projections (decode_projection.h) share. One activation row: the GEMV a
// pass at a time, into out[row].
template <typename View>
void gemv_passes(GemvFn gemv, View&& view, int64_t N, int64_t w_row, int64_t groups, int64_t chunks,
                 int64_t weight_bytes, const Layout& L, const ActivationRow& row, int64_t pass_begin, int64_t pass_end,
                 float* out, const float* bias) {
  for (int64_t pass = pass_begin; pass < pass_end; ++pass) {
    const int64_t n = pass * kRowsPerPass;
    const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
    float dots[kRowsPerPass];
    gemv(view(n), w_row, groups, chunks, weight_bytes, L, row, count, dots);
    for (int r = 0; r < count; ++r) out[n + r] = bias ? dots[r] + bias[n + r] : dots[r];
  }
}

// ... of `rows` activation rows, into out[m * out_stride + row]: the panel kernel reads each pass once for up to
// kPanelRows of them (their accumulators in scratch: kPanelRows * kPanelScratchPerRow bytes, 64-byte aligned).
template <typename View>
void panel_passes(PanelFn panel, View&& view, int64_t N, int64_t groups, int64_t chunks, int64_t weight_bytes,
                  const Layout& L, const ActivationRow* acts, int64_t rows, int64_t pass_begin, int64_t pass_end,
                  float* out, int64_t out_stride, const float* bias, void* scratch) {
  float dots[kPanelRows * kRowsPerPass];
  for (int64_t m0 = 0; m0 < rows; m0 += kPanelRows) {
    const int64_t mt = std::min<int64_t>(rows - m0, kPanelRows);
    for (int64_t pass = pass_begin; pass < pass_end; ++pass) {
      const int64_t n = pass * kRowsPerPass;
      const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
      panel(view(n), groups, chunks, weight_bytes, L, acts + m0, mt, count, dots, kRowsPerPass, scratch);
      for (int64_t t = 0; t < mt; ++t) {
        float* o = out + (m0 + t) * out_stride + n;
        for (int r = 0; r < count; ++r) o[r] = bias ? dots[t * kRowsPerPass + r] + bias[n + r] : dots[t * kRowsPerPass + r];
      }
    }
  }
}

}  // namespace

// x: [M, K] float32 (other float types are converted); returns float32 [M, N].
// With silu_and_mul, x is [M, 2K] = [gate | up] and the product silu(gate) * up is what gets multiplied.
// arrangement: how the weight's rows are stored (Arrangement: row-major, interleaved, Q6_K blocks). supers: a
// K-quant weight's (d, dmin) per 8 groups, its scales and mins then being the packed 6-bit sub-scales and sub-mins
// (k_params). use_simd=false runs the generic kernels (quant/generic/kernels.h) where the ISA has its own.
torch::Tensor quant_linear(const torch::Tensor& x_in, const torch::Tensor& qweight_in, const torch::Tensor& scales_in,
                           const c10::optional<torch::Tensor>& mins_in, const c10::optional<torch::Tensor>& supers_in,
                           const c10::optional<torch::Tensor>& bias, int64_t bits, int64_t group_size,
                           int64_t zero_point, bool precise, bool silu_and_mul, bool use_simd, int64_t arrangement) {
  const Layout L = make_layout(bits, group_size, arrangement);
  TORCH_CHECK(x_in.dim() == 2, "x must be 2-D");
  if (silu_and_mul) {
    const torch::Tensor gate_up = x_in.to(torch::kFloat).contiguous();
    const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
    torch::Tensor product = torch::empty({rows, width}, torch::kFloat);
    const float* src = gate_up.data_ptr<float>();
    float* dst = product.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        const float* gate = src + m * 2 * width;
        ::silu_and_mul(gate, gate + width, dst + m * width, width);
      }
    });
    return quant_linear(product, qweight_in, scales_in, mins_in, supers_in, bias, bits, group_size, zero_point, precise,
                        false, use_simd, arrangement);
  }
  const WeightArgs w(qweight_in, scales_in, mins_in, supers_in, false);
  const bool interleaved = arrangement == kInterleaved;
  const torch::Tensor x = x_in.to(torch::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.qweight.size(0);
  TORCH_CHECK(K % kActBlock == 0, "in_features must be a multiple of 32");
  TORCH_CHECK(!L.u6 || K % 128 == 0, "u6 weights need in_features a multiple of 128");
  TORCH_CHECK(w.qweight.size(1) == L.row_bytes(K), "qweight does not match in_features");
  const int64_t groups = K / L.group_size;
  TORCH_CHECK(w.scales.size(0) == N && (L.file_blocks() || w.scales.size(1) == groups), "scales shape mismatch");
  const bool has_mins = w.has_mins;
  const int64_t chunks = (K + L.chunk_values - 1) / L.chunk_values;

  ActivationBuffers buffers(M, K, L);
  std::vector<ActivationRow>& rows = buffers.rows;
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      quantize_row(xp + m * K, K, L, chunks, precise, has_mins ? 0 : static_cast<int32_t>(zero_point), rows[m]);
    }
  });

  torch::Tensor out = torch::empty({M, N}, torch::kFloat);
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.qweight.data_ptr<uint8_t>();
  const int64_t w_row = w.qweight.size(1);
  const float* bp = nullptr;
  torch::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    bias_f = bias->to(torch::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == N, "bias must have out_features elements");
    bp = bias_f.data_ptr<float>();
  }

  const void* sp = w.scales.data_ptr();
  const void* mp = has_mins ? w.mins.data_ptr() : nullptr;
  const uint16_t* up = w.view().supers;
  const int64_t weight_bytes = L.code_bytes(K);
  const int64_t passes = (N + kRowsPerPass - 1) / kRowsPerPass;
  const auto view = [&](int64_t n) { return pass_view(wp, sp, mp, up, n, N, w_row, groups, interleaved); };
  if (M == 1) {
    const GemvFn gemv = pick_gemv(precise, !has_mins, w.k_scales, L, use_simd);
    at::parallel_for(0, passes, 8, [&](int64_t begin, int64_t end) {
      gemv_passes(gemv, view, N, w_row, groups, chunks, weight_bytes, L, rows[0], begin, end, op, bp);
    });
    return out;
  }
  const PanelFn panel = pick_panel(precise, !has_mins, w.k_scales, L, use_simd);
  // blocked for the caches: a band of weight rows (about 256 KiB, in L2) meets the activations in blocks of
  // kPanelRows rows (their accumulators in L1), pass by pass
  const int64_t band = std::max<int64_t>(1, (int64_t{256} << 10) / (kRowsPerPass * w_row));
  at::parallel_for(0, passes, 1, [&](int64_t begin, int64_t end) {
    // 64-byte aligned (new of an over-aligned type): the accumulators are vectors
    struct alignas(64) Line { uint8_t bytes[64]; };
    std::vector<Line> scratch(kPanelRows * kPanelScratchPerRow / sizeof(Line));
    for (int64_t band_begin = begin; band_begin < end; band_begin += band) {
      panel_passes(panel, view, N, groups, chunks, weight_bytes, L, rows.data(), M, band_begin,
                   std::min(end, band_begin + band), op, N, bp, scratch.data());
    }
  });
  return out;
}

// The vector kernels compiled in (LC_ISA_NAME): "avx512-vnni", "avx2", "neon", or "" (the generic kernels only).
std::string simd_isa() { return LC_ISA_NAME; }
