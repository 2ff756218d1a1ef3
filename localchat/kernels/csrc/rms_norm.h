// RMSNorm with the residual add that precedes it, in one pass per row (float32, CPU). The torch op
// decomposes into about ten small ops, which at batch 1 cost more in dispatch than in arithmetic.
#pragma once
#include "torch_api.h"

#include <cmath>
#include <tuple>

// With a residual: residual += x (in place) and the result is (rms_norm(residual), residual);
// without: (rms_norm(x), x).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                                      const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous() && weight.is_contiguous() &&
              weight.scalar_type() == torch::kFloat, "add_rms_norm: contiguous float32 tensors");
  const bool add = residual.has_value() && residual->defined();
  if (add) TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes(), "residual must match x");
  const int64_t width = x.size(-1), rows = x.numel() / width;
  torch::Tensor sum = add ? *residual : x;
  torch::Tensor out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* sp = sum.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* s = sp + r * width;
      const float* in = xp + r * width;
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; ++i) {
        const float v = add ? s[i] + in[i] : in[i];
        if (add) s[i] = v;
        squares += v * v;
      }
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
      float* o = op + r * width;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) o[i] = s[i] * inv * wp[i];
    }
  });
  return {out, sum};
}
