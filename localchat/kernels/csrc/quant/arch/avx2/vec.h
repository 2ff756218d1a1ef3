// The vector API on AVX2 with FMA and F16C (quant/generic/vec.h describes each function): a vector is one 256-bit
// register of 8 floats, a comparison a vector of all-ones or zero lanes. The functions spelled as AVX-512's but for
// the width are arch/x86_vec.h's.
#pragma once
#include "../x86_vec.h"

#if LC_AVX2
namespace {
namespace vec {

// (all 32 at once: the packs interleave 128-bit lanes, the permute restores their order, as llama.cpp's)
inline void store_codes32(int8_t* out, const F32* v) {
  __m256i q[4];
  for (int c = 0; c < 4; ++c) {
    q[c] = _mm256_cvtps_epi32(_mm256_round_ps(v[c], kRound));
  }
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

inline F32 abs(F32 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }
inline F32 round(F32 x) { return _mm256_round_ps(x, kRound); }
inline float reduce_add(F32 x) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}
// reduce_add_lanes (quant/generic/vec.h): the 8 sums' trees side by side, level by level as reduce_add pairs the
// lanes (l and l + 4, then + 2, + 1)
constexpr bool kChunkDots = true;
using Partial = F32;
inline Partial partial_sum(F32 x) { return x; }
__attribute__((always_inline)) inline F32 reduce_add_lanes(const Partial* x) {
  __m256 fours[4], twos[2];
  for (int i = 0; i < 4; ++i) {  // [x[2i]'s 4 sums | x[2i + 1]'s]
    fours[i] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * i], x[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(x[2 * i], x[2 * i + 1], 0x31));
  }
  for (int i = 0; i < 2; ++i) {  // [x[4i]'s 2 sums, x[4i + 2]'s | x[4i + 1]'s, x[4i + 3]'s]
    const __m256d a = _mm256_castps_pd(fours[2 * i]), b = _mm256_castps_pd(fours[2 * i + 1]);
    twos[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  // [x0, x2, x4, x6 | x1, x3, x5, x7]'s sums
  const __m256 sums =
      _mm256_add_ps(_mm256_shuffle_ps(twos[0], twos[1], 0x88), _mm256_shuffle_ps(twos[0], twos[1], 0xDD));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
inline float reduce_max(F32 x) {
  const __m128 half = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 pairs = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_movehdup_ps(pairs)));
}
// (lane by lane)
template <typename T>
inline T total(F32 x) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, x);
  T sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

inline F32 keep(Mask m, F32 x) { return _mm256_and_ps(m, x); }
inline int first_lane(Mask m) {
  const int bits = _mm256_movemask_ps(m);
  return bits ? __builtin_ctz(bits) : -1;
}
inline int64_t store_lane_ids(int32_t* out, Mask m, int64_t first) {
  int64_t n = 0;
  for (int bits = _mm256_movemask_ps(m); bits; bits &= bits - 1) {
    out[n++] = static_cast<int32_t>(first + __builtin_ctz(bits));
  }
  return n;
}

// 2^n built in the exponent bits: n is kept where 2^n is a normal float, and lanes below kExpMin give 0 like expf
constexpr float kExpMin = -87.3f, kExpMax = 88.3f;
inline F32 times_pow2(F32 p, F32 n, F32 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, scale));
}

}  // namespace vec
}  // namespace
#endif
