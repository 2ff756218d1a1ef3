// The decode path's element-wise math of this build (quant/generic/vector_math.h describes each function): written
// once here against the vector API (quant/vec.h), kWidth lanes of the polynomial exp at a time, the last values
// (fewer than a vector) finished as the generic functions do. The ISA builds take these; the generic build the plain
// C++ ones (std::exp). Nothing here needs torch.
#pragma once
#include "generic/vector_math.h"
#include "vec.h"

namespace {
namespace vec {

// e^x in each lane: x (clamped to [kExpMin, kExpMax]) = n ln2 + r with |r| <= ln2 / 2, the degree-6 polynomial for
// e^r (relative error about 2e-7), times 2^n by the ISA's times_pow2, which saturates to 0 and inf like expf.
inline F32 exp(F32 x) {
  const F32 clamped = max(min(x, splat(kExpMax)), splat(kExpMin));
  const F32 n = round(mul(clamped, splat(kLog2e)));
  const F32 r = fnma(n, splat(kLn2Low), fnma(n, splat(kLn2High), clamped));
  F32 p = splat(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = fma(p, r, splat(kExpTaylor[k]));
  return times_pow2(p, n, x);
}

inline void silu_and_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const F32 one = splat(1.f);
  for (; i + kWidth <= n; i += kWidth) {
    const F32 g = load(gate + i);
    store(out + i, mul(div(g, add(one, exp(neg(g)))), load(up + i)));
  }
  generic::silu_and_mul(gate + i, up + i, out + i, n - i);
}

// (exact in any order: a maximum rounds nothing)
inline float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  F32 top = splat(-INFINITY);
  for (; i + kWidth <= n; i += kWidth) top = max(load(x + i), top);
  return generic::max_from(i, x, n, reduce_max(top));
}

inline float exp_shifted(float* x, int64_t n, float top) {
  int64_t i = 0;
  const F32 shift = splat(top);
  F32 sums = zero();
  for (; i + kWidth <= n; i += kWidth) {
    const F32 e = exp(sub(load(x + i), shift));
    store(x + i, e);
    sums = add(sums, e);
  }
  return generic::exp_shifted_from(i, x, n, top, total<float>(sums));
}

}  // namespace vec

namespace vector_math {
#if LC_VEC
using vec::exp_shifted;
using vec::max_of;
using vec::silu_and_mul;
#else
using generic::exp_shifted;
using generic::max_of;
using generic::silu_and_mul;
#endif
}  // namespace vector_math
}  // namespace
