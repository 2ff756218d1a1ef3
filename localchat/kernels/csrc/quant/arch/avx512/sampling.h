// The sampler's passes over a row on AVX-512 (quant/generic/sampling.h says what each function does): 16 logits at
// a time, the likely ids compressed out of a lane mask.
#pragma once
#include "../../generic/sampling.h"
#include "vector_math.h"

#if LC_VNNI
#define LC_ISA_ARGMAX 1
#define LC_ISA_WEIGH 1
namespace {
namespace isa {

inline int64_t argmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  __m512 lanes = _mm512_set1_ps(best);
  for (; i + 16 <= n; i += 16) lanes = _mm512_max_ps(lanes, _mm512_loadu_ps(x + i));
  best = _mm512_reduce_max_ps(lanes);
  for (; i < n; ++i) best = std::max(best, x[i]);
  const __m512 target = _mm512_set1_ps(best);
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every entry NaN or -inf
}

inline double weigh(const float* x, int64_t n, float max, float inv_t, float floor, float* weights, int32_t* ids,
                    int64_t& count) {
  int64_t i = 0, found = 0;
  const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_t), vfloor = _mm512_set1_ps(floor);
  const __m512 vzero_below = _mm512_set1_ps(kZeroBelow);
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  __m512 sum = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax), vinv);
    const __m512 w = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, vzero_below, _CMP_GT_OQ), exp_ps(d));
    _mm512_storeu_ps(weights + i, w);
    sum = _mm512_add_ps(sum, w);
    const __mmask16 likely = _mm512_cmp_ps_mask(w, vfloor, _CMP_GE_OQ);
    _mm512_mask_compressstoreu_epi32(ids + found, likely, index);
    found += __builtin_popcount(likely);
    index = _mm512_add_epi32(index, step);
  }
  double total = _mm512_reduce_add_ps(sum);
  count = found;
  return generic::weigh_from(i, x, n, max, inv_t, floor, weights, ids, count, total);
}

}  // namespace isa
}  // namespace
#endif
