// Element-wise float32 helpers for the decode path. SiLU and the softmax's exp are vectorized per ISA
// (quant/vector_math.h picks this build's: AVX-512, AVX2, NEON, else the generic ones).
#pragma once
#include <cmath>
#include <cstdint>

#include "quant/vector_math.h"

namespace {

// out[i] = silu(gate[i]) * up[i]
using vector_math::silu_and_mul;
// exp(x - top) in place over n scores; returns their sum
using vector_math::exp_shifted;
// the largest of n scores (-inf for none)
using vector_math::max_of;

// x[i] += y[i]
inline void add_into(float* x, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace
