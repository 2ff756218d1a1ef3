// The decode path's element-wise math on AVX-512 (quant/generic/vector_math.h says what each function does): 16
// lanes of the polynomial exp.
#pragma once
#include "../../generic/vector_math.h"

#if LC_VNNI
#define LC_ISA_SILU_AND_MUL 1
#define LC_ISA_EXP_SHIFTED 1
namespace {
namespace isa {

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

inline void silu_and_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  generic::silu_and_mul(gate + i, up + i, out + i, n - i);
}

inline float exp_shifted(float* x, int64_t n, float top) {
  int64_t i = 0;
  const __m512 shift = _mm512_set1_ps(top);
  __m512 sums = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), shift));
    _mm512_storeu_ps(x + i, e);
    sums = _mm512_add_ps(sums, e);
  }
  float total = _mm512_reduce_add_ps(sums);
  return generic::exp_shifted_from(i, x, n, top, total);
}

}  // namespace isa
}  // namespace
#endif
