// The sampler's passes over a row of logits of this build (quant/generic/sampling.h describes each function): written
// once here against the vector API (quant/vec.h), kWidth logits at a time, the likely ids taken from a lane mask and
// the last logits (fewer than a vector) finished as the generic functions do. The ISA builds take these; the generic
// build the plain C++ ones. Nothing here needs torch.
#pragma once
#include <limits>

#include "generic/sampling.h"
#include "vector_math.h"

namespace {
namespace vec {

inline int64_t argmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  F32 lanes = splat(best);
  for (; i + kWidth <= n; i += kWidth) lanes = max(load(x + i), lanes);  // (a NaN never enters)
  best = reduce_max(lanes);
  for (; i < n; ++i) best = std::max(best, x[i]);
  const F32 target = splat(best);
  for (i = 0; i + kWidth <= n; i += kWidth) {
    const int lane = first_lane(equal(load(x + i), target));
    if (lane >= 0) return i + lane;
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every entry NaN or -inf
}

inline double weigh(const float* x, int64_t n, float max, float inv_t, float floor, float* weights, int32_t* ids,
                    int64_t& count) {
  int64_t i = 0, found = 0;
  const F32 top = splat(max), scale = splat(inv_t), likely = splat(floor), zero_below = splat(kZeroBelow);
  F32 sum = zero();
  for (; i + kWidth <= n; i += kWidth) {
    const F32 d = mul(sub(load(x + i), top), scale);
    const F32 w = keep(greater(d, zero_below), exp(d));
    store(weights + i, w);
    sum = add(sum, w);
    found += store_lane_ids(ids + found, greater_equal(w, likely), i);
  }
  count = found;
  return generic::weigh_from(i, x, n, max, inv_t, floor, weights, ids, count, total<double>(sum));
}

}  // namespace vec

namespace sampling_rows {
#if LC_VEC
using vec::argmax;
using vec::weigh;
#else
using generic::argmax;
using generic::weigh;
#endif
}  // namespace sampling_rows
}  // namespace
