// The sampler's passes over a row on ARM NEON (quant/generic/sampling.h says what each function does): 4 logits at
// a time, the likely ids taken from each vector's lane mask.
#pragma once
#include "../../generic/sampling.h"
#include "vector_math.h"

#if LC_NEON
#define LC_ISA_ARGMAX 1
#define LC_ISA_WEIGH 1
namespace {
namespace isa {

inline int64_t argmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  float32x4_t lanes = vdupq_n_f32(best);
  for (; i + 4 <= n; i += 4) lanes = vmaxnmq_f32(lanes, vld1q_f32(x + i));  // (a NaN loses to a number)
  best = vmaxnmvq_f32(lanes);
  for (; i < n; ++i) best = std::max(best, x[i]);
  const float32x4_t target = vdupq_n_f32(best);
  for (i = 0; i + 4 <= n; i += 4) {
    if (vmaxvq_u32(vceqq_f32(vld1q_f32(x + i), target))) break;
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every entry NaN or -inf
}

inline double weigh(const float* x, int64_t n, float max, float inv_t, float floor, float* weights, int32_t* ids,
                    int64_t& count) {
  int64_t i = 0, found = 0;
  const float32x4_t vmax = vdupq_n_f32(max), vfloor = vdupq_n_f32(floor), vzero_below = vdupq_n_f32(kZeroBelow);
  float32x4_t sum = vdupq_n_f32(0.f);
  for (; i + 4 <= n; i += 4) {
    const float32x4_t d = vmulq_n_f32(vsubq_f32(vld1q_f32(x + i), vmax), inv_t);
    const float32x4_t w = vreinterpretq_f32_u32(
        vandq_u32(vcgtq_f32(d, vzero_below), vreinterpretq_u32_f32(exp_f32x4(d))));
    vst1q_f32(weights + i, w);
    sum = vaddq_f32(sum, w);
    const uint32x4_t likely = vcgeq_f32(w, vfloor);
    if (vmaxvq_u32(likely)) {
      if (vgetq_lane_u32(likely, 0)) ids[found++] = static_cast<int32_t>(i);
      if (vgetq_lane_u32(likely, 1)) ids[found++] = static_cast<int32_t>(i + 1);
      if (vgetq_lane_u32(likely, 2)) ids[found++] = static_cast<int32_t>(i + 2);
      if (vgetq_lane_u32(likely, 3)) ids[found++] = static_cast<int32_t>(i + 3);
    }
  }
  double total = vaddvq_f32(sum);
  count = found;
  return generic::weigh_from(i, x, n, max, inv_t, floor, weights, ids, count, total);
}

}  // namespace isa
}  // namespace
#endif
