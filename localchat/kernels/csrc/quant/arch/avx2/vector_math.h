// The decode path's element-wise math on AVX2 (quant/generic/vector_math.h says what each function does): 8 lanes
// of the polynomial exp.
#pragma once
#include "../../generic/vector_math.h"

#if LC_AVX2
#define LC_ISA_SILU_AND_MUL 1
#define LC_ISA_EXP_SHIFTED 1
namespace {
namespace isa {

// e^x for 8 lanes, as AVX-512's exp_ps: the same reduction and polynomial, 2^n built in the exponent bits (x is
// clamped to where 2^n is a normal float, and lanes below it give 0 like expf).
inline __m256 exp256_ps(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x));
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[k]));
  const __m256 scale = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, scale));
}

inline void silu_and_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  generic::silu_and_mul(gate + i, up + i, out + i, n - i);
}

inline float exp_shifted(float* x, int64_t n, float top) {
  int64_t i = 0;
  const __m256 shift = _mm256_set1_ps(top);
  alignas(32) float lanes[8];
  __m256 sums = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(x + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  _mm256_store_ps(lanes, sums);
  float total = 0.f;
  for (float lane : lanes) total += lane;
  return generic::exp_shifted_from(i, x, n, top, total);
}

}  // namespace isa
}  // namespace
#endif
