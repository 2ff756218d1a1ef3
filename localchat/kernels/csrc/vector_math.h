// Element-wise float32 helpers for the decode path, vectorized with AVX-512 or AVX2 where it is compiled in: the
// scalar std::exp in SiLU costs a few microseconds per layer at batch 1, which adds up over 30 layers.
#pragma once
#include <cmath>
#include <cstdint>

namespace {
// e^r = sum r^k / k! for |r| <= ln2 / 2, degree 6, highest first (Horner); ln2 split in two for the reduction
constexpr float kExpTaylor[] = {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f};
constexpr float kLog2e = 1.44269504089f, kLn2High = 0.693145751953125f, kLn2Low = 1.428606765330187e-06f;
}  // namespace

#if defined(__AVX512F__)
#include <immintrin.h>

namespace {

// e^x for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial for e^r (relative error about
// 2e-7), then a scale by 2^n that saturates to 0 and inf like expf.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x));
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[k]));
  return _mm512_scalef_ps(p, n);
}

}  // namespace
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LC_EXP256 1

namespace {

// e^x for 8 lanes, as exp_ps: the same reduction and polynomial, 2^n built in the exponent bits (x is clamped
// to where 2^n is a normal float, and lanes below it give 0 like expf).
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

}  // namespace
#endif

namespace {

// out[i] = silu(gate[i]) * up[i]
inline void silu_and_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
#elif LC_EXP256
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// x[i] += y[i]
inline void add_into(float* x, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace
