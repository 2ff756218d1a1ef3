// The vector API (docs/kernels.md) in plain C++, one lane wide. The float loops of the KV rows, the q8_0 KV rows, the
// decode math and the sampler (quant/kv_rows.h, kv_q8.h, vector_math.h, sampling.h) are written once against this
// API in namespace vec, and every ISA brings its own quant/arch/<isa>/vec.h with the same names on its registers;
// quant/vec.h includes the build's. This one is what they compile against in the generic build, where the standalone
// kernel test runs them against the plain C++ functions (quant/generic/<job>.h), which the pickers take there.
#pragma once
#include "kv_rows.h"

namespace {
namespace vec {

constexpr int kWidth = 1;    // floats a vector holds (divides 32: a q8_0 block is whole vectors)
constexpr int kColumns = 4;  // vectors of columns whose G heads' sums stay in registers over a run of value rows
using F32 = float;           // a vector
using Mask = bool;           // a comparison's lanes

inline F32 zero() { return 0.f; }
inline F32 splat(float x) { return x; }
// p[0, kWidth) as a vector, and back
inline F32 load(const float* p) { return *p; }
inline void store(float* p, F32 x) { *p = x; }
// float16 or bfloat16 bits widened to float32 (exact); float32 rounded to float16 (to nearest even)
inline F32 load_f16(const uint16_t* p) { return half_to_float(*p); }
inline F32 load_bf16(const uint16_t* p) { return bfloat16_to_float(*p); }
inline void store_f16(uint16_t* p, F32 x) { *p = float_to_half(x); }
// int8 codes as floats; the 32 values of v[0, 32 / kWidth) rounded to nearest even as int8 codes (within +-127)
inline F32 load_i8(const int8_t* p) { return static_cast<float>(*p); }
inline void store_codes32(int8_t* out, const F32* v) {
  for (int i = 0; i < 32; ++i) out[i] = static_cast<int8_t>(std::nearbyint(v[i]));
}

inline F32 add(F32 a, F32 b) { return a + b; }
inline F32 sub(F32 a, F32 b) { return a - b; }
inline F32 mul(F32 a, F32 b) { return a * b; }
inline F32 div(F32 a, F32 b) { return a / b; }
// a * b + c and c - a * b, rounded once as the ISAs' are (std::fma: where the compiler chose whether to fuse, one
// inlined copy of a loop could round otherwise than its twin, and dot_keys' sums differ from dot_heads' at -O3)
inline F32 fma(F32 a, F32 b, F32 c) { return std::fma(a, b, c); }
inline F32 fnma(F32 a, F32 b, F32 c) { return std::fma(-a, b, c); }
// the larger and the smaller; where a is NaN, b (max(x, acc) never lets a NaN of x into acc)
inline F32 max(F32 a, F32 b) { return a > b ? a : b; }
inline F32 min(F32 a, F32 b) { return a < b ? a : b; }
inline F32 abs(F32 x) { return std::fabs(x); }
inline F32 neg(F32 x) { return -x; }
inline F32 round(F32 x) { return std::nearbyint(x); }  // to the nearest integer, ties to even
// the sum (in the ISA's order) and the largest of the lanes
inline float reduce_add(F32 x) { return x; }
inline float reduce_max(F32 x) { return x; }
// A row's total from its vector of sums (exp_shifted's in float, weigh's in double): AVX2 adds the lanes one by one
// in T, as its softmax and sampler always have, the others take reduce_add's; so the x86 totals keep their bits (a
// greedy token of the decode tests' flat random models moves with the softmax total's last bit).
template <typename T>
inline T total(F32 x) {
  return x;
}
// The lanes' sums of kWidth vectors at once, one per lane (lane i: reduce_add(x[i]), the same bits), for the dot
// products of a chunk of keys (quant/kv_rows.h): the ISAs build the kWidth trees side by side, where one vector at a
// time spends most of a short dot product's time on its own tree. A vector goes in as its partial sum (partial_sum:
// what reduce_add adds first, where that is lane-wise: NEON's four registers into one; the vector itself on x86).
// kChunkDots: whether kv_rows.h's dot_keys keeps a chunk's kWidth sums in registers (not NEON's 16 x 4, which
// would spill: there it takes one key at a time).
constexpr bool kChunkDots = true;
using Partial = F32;
inline Partial partial_sum(F32 x) { return x; }
inline F32 reduce_add_lanes(const Partial* x) { return x[0]; }

// lane-wise a > b, a >= b, a == b (false where either is NaN)
inline Mask greater(F32 a, F32 b) { return a > b; }
inline Mask greater_equal(F32 a, F32 b) { return a >= b; }
inline Mask equal(F32 a, F32 b) { return a == b; }
inline F32 keep(Mask m, F32 x) { return m ? x : 0.f; }  // x where m, 0 elsewhere
inline int first_lane(Mask m) { return m ? 0 : -1; }   // the first lane set, -1 where none is
// first + l for each lane l set, in order, at out; returns how many
inline int64_t store_lane_ids(int32_t* out, Mask m, int64_t first) {
  if (m) *out = static_cast<int32_t>(first);
  return m;
}

// vec::exp (quant/vector_math.h) clamps its argument to [kExpMin, kExpMax], and takes p * 2^n for the polynomial p
// and the integer n of the clamped argument from times_pow2, which is 0 where x (the argument as given) underflows.
constexpr float kExpMin = -87.3f, kExpMax = 88.3f;
inline F32 times_pow2(F32 p, F32 n, F32 x) {
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < kExpMin ? 0.f : p * scale;
}

}  // namespace vec
}  // namespace
