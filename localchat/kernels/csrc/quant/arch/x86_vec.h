// What the two x86 ISAs' vector APIs (arch/avx512/vec.h, arch/avx2/vec.h; quant/generic/vec.h describes each
// function) spell alike but for the register: LC_MM(name) is _mm512_name on AVX-512 and _mm256_name on AVX2, and
// LC_MM_CMP their comparison (a lane mask, a vector of all-ones or zero lanes).
#pragma once
#include "../common.h"

#if LC_VNNI
#define LC_MM(name) _mm512_##name
#define LC_MM_CMP(a, b, predicate) _mm512_cmp_ps_mask(a, b, predicate)
#elif LC_AVX2
#define LC_MM(name) _mm256_##name
#define LC_MM_CMP(a, b, predicate) _mm256_cmp_ps(a, b, predicate)
#endif

#if LC_SIMD
namespace {
namespace vec {

using F32 = decltype(LC_MM(setzero_ps)());  // one register
using Mask = decltype(LC_MM_CMP(F32{}, F32{}, _CMP_EQ_OQ));
using Half = decltype(LC_MM(cvtps_ph)(F32{}, 0));  // half a register: a vector's float16 values
constexpr int kWidth = sizeof(F32) / sizeof(float);
// G x kColumns sums, kColumns loads and a weight: up to 4 heads in the 32 registers of AVX-512, the 16 of AVX2
constexpr int kColumns = LC_VNNI ? 4 : 2;
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// The first `bytes` bytes at p as the low bytes of a T (an unaligned load: one move, or the operand of the instruction
// that takes it), and the bits of x as a T of the same size.
template <typename T>
inline T load_bytes(const void* p, size_t bytes = sizeof(T)) {
  T out{};
  std::memcpy(&out, p, bytes);
  return out;
}
template <typename T, typename From>
inline T bits_as(From x) {
  static_assert(sizeof(T) == sizeof(From));
  return load_bytes<T>(&x);
}

inline F32 zero() { return LC_MM(setzero_ps)(); }
inline F32 splat(float x) { return LC_MM(set1_ps)(x); }
inline F32 load(const float* p) { return LC_MM(loadu_ps)(p); }
inline void store(float* p, F32 x) { LC_MM(storeu_ps)(p, x); }
inline F32 load_f16(const uint16_t* p) { return LC_MM(cvtph_ps)(load_bytes<Half>(p)); }
inline F32 load_bf16(const uint16_t* p) {
  return bits_as<F32>(LC_MM(slli_epi32)(LC_MM(cvtepu16_epi32)(load_bytes<Half>(p)), 16));
}
inline void store_f16(uint16_t* p, F32 x) {
  const Half bits = LC_MM(cvtps_ph)(x, kRound);
  std::memcpy(p, &bits, sizeof bits);
}
inline F32 load_i8(const int8_t* p) { return LC_MM(cvtepi32_ps)(LC_MM(cvtepi8_epi32)(load_bytes<__m128i>(p, kWidth))); }

inline F32 add(F32 a, F32 b) { return LC_MM(add_ps)(a, b); }
inline F32 sub(F32 a, F32 b) { return LC_MM(sub_ps)(a, b); }
inline F32 mul(F32 a, F32 b) { return LC_MM(mul_ps)(a, b); }
inline F32 div(F32 a, F32 b) { return LC_MM(div_ps)(a, b); }
inline F32 fma(F32 a, F32 b, F32 c) { return LC_MM(fmadd_ps)(a, b, c); }
inline F32 fnma(F32 a, F32 b, F32 c) { return LC_MM(fnmadd_ps)(a, b, c); }
inline F32 max(F32 a, F32 b) { return LC_MM(max_ps)(a, b); }  // (maxps, minps: b where either lane is NaN)
inline F32 min(F32 a, F32 b) { return LC_MM(min_ps)(a, b); }
inline F32 neg(F32 x) { return LC_MM(sub_ps)(LC_MM(setzero_ps)(), x); }

inline Mask greater(F32 a, F32 b) { return LC_MM_CMP(a, b, _CMP_GT_OQ); }
inline Mask greater_equal(F32 a, F32 b) { return LC_MM_CMP(a, b, _CMP_GE_OQ); }
inline Mask equal(F32 a, F32 b) { return LC_MM_CMP(a, b, _CMP_EQ_OQ); }

}  // namespace vec
}  // namespace
#endif
#undef LC_MM
#undef LC_MM_CMP
