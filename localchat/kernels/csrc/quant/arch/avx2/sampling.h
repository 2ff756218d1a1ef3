// The sampler's passes over a row on AVX2 (quant/generic/sampling.h says what each function does): 8 logits at a
// time.
#pragma once
#include "../../generic/sampling.h"
#include "vector_math.h"

#if LC_AVX2
#define LC_ISA_ARGMAX 1
#define LC_ISA_WEIGH 1
namespace {
namespace isa {

inline int64_t argmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  __m256 lanes = _mm256_set1_ps(best);
  for (; i + 8 <= n; i += 8) lanes = _mm256_max_ps(lanes, _mm256_loadu_ps(x + i));
  alignas(32) float values[8];
  _mm256_store_ps(values, lanes);
  for (float v : values) best = std::max(best, v);
  for (; i < n; ++i) best = std::max(best, x[i]);
  const __m256 target = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every entry NaN or -inf
}

inline double weigh(const float* x, int64_t n, float max, float inv_t, float floor, float* weights, int32_t* ids,
                    int64_t& count) {
  int64_t i = 0, found = 0;
  const __m256 vmax = _mm256_set1_ps(max), vinv = _mm256_set1_ps(inv_t), vfloor = _mm256_set1_ps(floor);
  const __m256 vzero_below = _mm256_set1_ps(kZeroBelow);
  __m256 sum = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax), vinv);
    const __m256 w = _mm256_and_ps(_mm256_cmp_ps(d, vzero_below, _CMP_GT_OQ), exp256_ps(d));
    _mm256_storeu_ps(weights + i, w);
    sum = _mm256_add_ps(sum, w);
    for (int likely = _mm256_movemask_ps(_mm256_cmp_ps(w, vfloor, _CMP_GE_OQ)); likely; likely &= likely - 1) {
      ids[found++] = static_cast<int32_t>(i + __builtin_ctz(likely));
    }
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  double total = 0.0;
  for (float lane : lanes) total += lane;
  count = found;
  return generic::weigh_from(i, x, n, max, inv_t, floor, weights, ids, count, total);
}

}  // namespace isa
}  // namespace
#endif
