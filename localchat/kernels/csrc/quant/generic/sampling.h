// The sampler's two passes over a row of logits in plain C++ (sampling.h uses them; engine/sampling/sampler.py's
// torch code is the reference): the index of the largest logit, and the weights exp((l - max) / T) with their sum and
// the ids of the likely tokens. The vector loops of quant/sampling.h (every ISA's, on its vector API) run both a
// vector at a time, finishing the last logits (fewer than a vector) as these do; quant/sampling.h picks them or these.
#pragma once
#include <limits>

#include "../common.h"

namespace {

constexpr float kZeroBelow = -87.f;  // weights of (l - max) / T below this are 0 (-inf included)

namespace generic {

// The index of the first largest logit (NaN never wins; 0 where every entry is NaN or -inf).
inline int64_t argmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t index = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > best) best = x[i], index = i;
  return index;
}

// weigh's scalar loop over x[i, n), carrying the sum and the count of likely ids on (an ISA's last logits).
inline double weigh_from(int64_t i, const float* x, int64_t n, float max, float inv_t, float floor, float* weights,
                         int32_t* ids, int64_t& found, double total) {
  for (; i < n; ++i) {
    const float d = (x[i] - max) * inv_t;
    const float w = d > kZeroBelow ? std::exp(d) : 0.f;
    weights[i] = w;
    total += w;
    if (w >= floor) ids[found++] = static_cast<int32_t>(i);
  }
  return total;
}

// weights[i] = exp((x[i] - max) * inv_t) (0 far below the maximum); returns their sum and puts the ids of
// those at least `floor` in ids[0, count).
inline double weigh(const float* x, int64_t n, float max, float inv_t, float floor, float* weights, int32_t* ids,
                    int64_t& count) {
  count = 0;
  return weigh_from(0, x, n, max, inv_t, floor, weights, ids, count, 0.0);
}

}  // namespace generic
}  // namespace
