// The decode path's element-wise math on ARM NEON (quant/generic/vector_math.h says what each function does): 4
// lanes of the polynomial exp, built as AVX2's (the exponent bits give 2^n, lanes below the normal range give 0).
#pragma once
#include "../../generic/vector_math.h"

#if LC_NEON
#define LC_ISA_SILU_AND_MUL 1
#define LC_ISA_EXP_SHIFTED 1
namespace {
namespace isa {

// e^x for 4 lanes: x = n ln2 + r with |r| <= ln2 / 2, the degree-6 polynomial for e^r, times 2^n.
inline float32x4_t exp_f32x4(float32x4_t x) {
  const uint32x4_t underflow = vcltq_f32(x, vdupq_n_f32(-87.3f));
  x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.3f)), vdupq_n_f32(-87.3f));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, kLog2e));
  const float32x4_t r = vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(kLn2High)), n, vdupq_n_f32(kLn2Low));
  float32x4_t p = vdupq_n_f32(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = vfmaq_f32(vdupq_n_f32(kExpTaylor[k]), p, r);
  const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t e = vmulq_f32(p, vreinterpretq_f32_s32(bits));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), underflow));
}

inline void silu_and_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const float32x4_t one = vdupq_n_f32(1.f);
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t e = exp_f32x4(vnegq_f32(g));
    vst1q_f32(out + i, vmulq_f32(vdivq_f32(g, vaddq_f32(one, e)), vld1q_f32(up + i)));
  }
  generic::silu_and_mul(gate + i, up + i, out + i, n - i);
}

inline float exp_shifted(float* x, int64_t n, float top) {
  int64_t i = 0;
  const float32x4_t shift = vdupq_n_f32(top);
  float32x4_t sums = vdupq_n_f32(0.f);
  for (; i + 4 <= n; i += 4) {
    const float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(x + i), shift));
    vst1q_f32(x + i, e);
    sums = vaddq_f32(sums, e);
  }
  float total = vaddvq_f32(sums);
  return generic::exp_shifted_from(i, x, n, top, total);
}

}  // namespace isa
}  // namespace
#endif
