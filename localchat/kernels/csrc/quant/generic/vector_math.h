// Element-wise float32 math of the decode path in plain C++ (std::exp): SiLU times up, and the softmax's exp of
// shifted scores. The vector loops of quant/vector_math.h (every ISA's, on its vector API) vectorize the exp with the
// polynomial below (relative error about 2e-7: the scalar std::exp per value costs a few microseconds per layer at
// batch 1, which adds up over 30 layers), finishing the last values (fewer than a vector) as these do;
// quant/vector_math.h picks them or these.
#pragma once
#include "../common.h"

namespace {

// e^r = sum r^k / k! for |r| <= ln2 / 2, degree 6, highest first (Horner); ln2 split in two for the reduction
constexpr float kExpTaylor[] = {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f};
constexpr float kLog2e = 1.44269504089f, kLn2High = 0.693145751953125f, kLn2Low = 1.428606765330187e-06f;

namespace generic {

// out[i] = silu(gate[i]) * up[i]
inline void silu_and_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// exp_shifted's scalar loop over x[i, n), adding to total (an ISA's last scores).
inline float exp_shifted_from(int64_t i, float* x, int64_t n, float top, float total) {
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - top);
    total += x[i];
  }
  return total;
}

// The largest of x[i, n) and top (a NaN of x never wins).
inline float max_from(int64_t i, const float* x, int64_t n, float top) {
  for (; i < n; ++i) top = x[i] > top ? x[i] : top;
  return top;
}

// The largest of n scores (-inf for none).
inline float max_of(const float* x, int64_t n) { return max_from(0, x, n, -INFINITY); }

// exp(x - top) in place over n scores; returns their sum.
inline float exp_shifted(float* x, int64_t n, float top) { return exp_shifted_from(0, x, n, top, 0.f); }

}  // namespace generic
}  // namespace
