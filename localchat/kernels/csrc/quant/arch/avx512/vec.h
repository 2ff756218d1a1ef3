// The vector API on AVX-512 (quant/generic/vec.h describes each function): a vector is one 512-bit register of 16
// floats, a comparison a 16-bit lane mask. The functions spelled as AVX2's but for the width are arch/x86_vec.h's.
#pragma once
#include "../x86_vec.h"

#if LC_VNNI
namespace {
namespace vec {

inline void store_codes32(int8_t* out, const F32* v) {
  for (int c = 0; c < 2; ++c) {
    const __m512i q = _mm512_cvt_roundps_epi32(v[c], kRound);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * c), _mm512_cvtepi32_epi8(q));
  }
}

inline F32 abs(F32 x) { return _mm512_abs_ps(x); }
inline F32 round(F32 x) { return _mm512_roundscale_ps(x, kRound); }
inline float reduce_add(F32 x) { return _mm512_reduce_add_ps(x); }
inline float reduce_max(F32 x) { return _mm512_reduce_max_ps(x); }
template <typename T>
inline T total(F32 x) {
  return _mm512_reduce_add_ps(x);
}

// reduce_add_lanes (quant/generic/vec.h): the 16 sums' trees side by side, level by level as _mm512_reduce_add_ps
// pairs the lanes (l and l + 8, then + 4, + 2, + 1): 45 shuffles and adds where one vector at a time takes 112.
constexpr bool kChunkDots = true;
using Partial = F32;
inline Partial partial_sum(F32 x) { return x; }
__attribute__((always_inline)) inline F32 reduce_add_lanes(const Partial* x) {
  __m512 eights[8], fours[4], twos[2];
  for (int i = 0; i < 8; ++i) {  // [x[2i]'s 8 sums, x[2i + 1]'s]: quarters 0, 1 plus 2, 3 of each
    const __m512 a = x[2 * i], b = x[2 * i + 1];
    eights[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // quarter q: x[4i + q]'s 4 sums
    const __m512 a = eights[2 * i], b = eights[2 * i + 1];
    fours[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // quarter q: x[8i + q]'s 2 sums, then x[8i + 4 + q]'s
    const __m512d a = _mm512_castps_pd(fours[2 * i]), b = _mm512_castps_pd(fours[2 * i + 1]);
    twos[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // lane 4q + r: x[4r + q]'s sum
  const __m512 sums =
      _mm512_add_ps(_mm512_shuffle_ps(twos[0], twos[1], 0x88), _mm512_shuffle_ps(twos[0], twos[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
}

inline F32 keep(Mask m, F32 x) { return _mm512_maskz_mov_ps(m, x); }
inline int first_lane(Mask m) { return m ? __builtin_ctz(m) : -1; }
inline int64_t store_lane_ids(int32_t* out, Mask m, int64_t first) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  _mm512_mask_compressstoreu_epi32(out, m, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(first)), lanes));
  return __builtin_popcount(m);
}

// vscalefps saturates 2^n to 0 and inf itself (below kExpMin, e^x is 0 in float32 anyway)
constexpr float kExpMin = -104.f, kExpMax = 88.7f;
inline F32 times_pow2(F32 p, F32 n, F32) { return _mm512_scalef_ps(p, n); }

}  // namespace vec
}  // namespace
#endif
