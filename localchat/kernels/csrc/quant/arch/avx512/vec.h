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
