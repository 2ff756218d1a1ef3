// The vector API on ARM NEON (quant/generic/vec.h describes each function): a vector is 16 floats in four 128-bit
// registers, so that a loop keeps four independent chains in flight (the 4-lane registers alone would chain every
// step on the one before), and a comparison four registers of all-ones or zero lanes.
#pragma once
#include "../../common.h"

#if LC_NEON
namespace {
namespace vec {

constexpr int kWidth = 16;
constexpr int kColumns = 1;  // G x 4 registers of sums and 4 of loads: up to 4 heads fit the 32 registers
struct F32 {
  float32x4_t v[4];
};
struct Mask {
  uint32x4_t v[4];
};

// The vector of op(c) for each register c.
template <typename Op>
inline F32 each(Op op) {
  F32 out;
  for (int c = 0; c < 4; ++c) out.v[c] = op(c);
  return out;
}
template <typename Op>
inline Mask each_mask(Op op) {
  Mask out;
  for (int c = 0; c < 4; ++c) out.v[c] = op(c);
  return out;
}

inline F32 zero() { return each([](int) { return vdupq_n_f32(0.f); }); }
inline F32 splat(float x) { return each([&](int) { return vdupq_n_f32(x); }); }
inline F32 load(const float* p) { return each([&](int c) { return vld1q_f32(p + 4 * c); }); }
inline void store(float* p, F32 x) {
  for (int c = 0; c < 4; ++c) vst1q_f32(p + 4 * c, x.v[c]);
}
inline F32 load_f16(const uint16_t* p) {
  return each([&](int c) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * c))); });
}
inline F32 load_bf16(const uint16_t* p) {
  return each([&](int c) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * c), 16)); });
}
// (vcvt rounds to nearest even, the FPCR's default mode: float_to_half's bits)
inline void store_f16(uint16_t* p, F32 x) {
  for (int c = 0; c < 4; ++c) vst1_u16(p + 4 * c, vreinterpret_u16_f16(vcvt_f16_f32(x.v[c])));
}
inline F32 load_i8(const int8_t* p) {
  const int8x16_t bytes = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(bytes)), hi = vmovl_s8(vget_high_s8(bytes));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))),
          vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))};
}
// (vcvtnq rounds to nearest even)
inline void store_codes32(int8_t* out, const F32* v) {
  for (int c = 0; c < 8; c += 2) {
    const int32x4_t q0 = vcvtnq_s32_f32(v[c / 4].v[c % 4]), q1 = vcvtnq_s32_f32(v[c / 4].v[c % 4 + 1]);
    vst1_s8(out + 4 * c, vqmovn_s16(vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1))));
  }
}

inline F32 add(F32 a, F32 b) { return each([&](int c) { return vaddq_f32(a.v[c], b.v[c]); }); }
inline F32 sub(F32 a, F32 b) { return each([&](int c) { return vsubq_f32(a.v[c], b.v[c]); }); }
inline F32 mul(F32 a, F32 b) { return each([&](int c) { return vmulq_f32(a.v[c], b.v[c]); }); }
inline F32 div(F32 a, F32 b) { return each([&](int c) { return vdivq_f32(a.v[c], b.v[c]); }); }
inline F32 fma(F32 a, F32 b, F32 c) { return each([&](int r) { return vfmaq_f32(c.v[r], a.v[r], b.v[r]); }); }
inline F32 fnma(F32 a, F32 b, F32 c) { return each([&](int r) { return vfmsq_f32(c.v[r], a.v[r], b.v[r]); }); }
// (vmaxnm, vminnm: a NaN lane gives the other operand)
inline F32 max(F32 a, F32 b) { return each([&](int c) { return vmaxnmq_f32(a.v[c], b.v[c]); }); }
inline F32 min(F32 a, F32 b) { return each([&](int c) { return vminnmq_f32(a.v[c], b.v[c]); }); }
inline F32 abs(F32 x) { return each([&](int c) { return vabsq_f32(x.v[c]); }); }
inline F32 neg(F32 x) { return each([&](int c) { return vnegq_f32(x.v[c]); }); }
inline F32 round(F32 x) { return each([&](int c) { return vrndnq_f32(x.v[c]); }); }
inline float reduce_add(F32 x) { return vaddvq_f32(vaddq_f32(vaddq_f32(x.v[0], x.v[1]), vaddq_f32(x.v[2], x.v[3]))); }
inline float reduce_max(F32 x) {
  return vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(x.v[0], x.v[1]), vmaxnmq_f32(x.v[2], x.v[3])));
}
template <typename T>
inline T total(F32 x) {
  return reduce_add(x);
}
// reduce_add_lanes (quant/generic/vec.h): each vector's four registers added as reduce_add adds them (its partial
// sum, one register), then four partial sums' lanes pairwise at once (vpaddq: vaddvq's pairs, in its order)
constexpr bool kChunkDots = false;
using Partial = float32x4_t;
inline Partial partial_sum(F32 x) { return vaddq_f32(vaddq_f32(x.v[0], x.v[1]), vaddq_f32(x.v[2], x.v[3])); }
__attribute__((always_inline)) inline F32 reduce_add_lanes(const Partial* x) {
  return each([&](int c) {
    const Partial* p = x + 4 * c;
    return vpaddq_f32(vpaddq_f32(p[0], p[1]), vpaddq_f32(p[2], p[3]));
  });
}

inline Mask greater(F32 a, F32 b) { return each_mask([&](int c) { return vcgtq_f32(a.v[c], b.v[c]); }); }
inline Mask greater_equal(F32 a, F32 b) { return each_mask([&](int c) { return vcgeq_f32(a.v[c], b.v[c]); }); }
inline Mask equal(F32 a, F32 b) { return each_mask([&](int c) { return vceqq_f32(a.v[c], b.v[c]); }); }
inline F32 keep(Mask m, F32 x) {
  return each([&](int c) { return vreinterpretq_f32_u32(vandq_u32(m.v[c], vreinterpretq_u32_f32(x.v[c]))); });
}
// The mask's 16 lanes as 4 bits each (lane l in bits 4 l .. 4 l + 3): narrowed to bytes, then to nibbles.
inline uint64_t nibbles(Mask m) {
  const uint16x8_t lo = vcombine_u16(vmovn_u32(m.v[0]), vmovn_u32(m.v[1]));
  const uint16x8_t hi = vcombine_u16(vmovn_u32(m.v[2]), vmovn_u32(m.v[3]));
  const uint8x16_t bytes = vcombine_u8(vmovn_u16(lo), vmovn_u16(hi));
  return vget_lane_u64(vreinterpret_u64_u8(vshrn_n_u16(vreinterpretq_u16_u8(bytes), 4)), 0);
}
inline int first_lane(Mask m) {
  const uint64_t bits = nibbles(m);
  return bits ? __builtin_ctzll(bits) / 4 : -1;
}
inline int64_t store_lane_ids(int32_t* out, Mask m, int64_t first) {
  int64_t n = 0;
  for (uint64_t bits = nibbles(m) & 0x1111111111111111ull; bits; bits &= bits - 1) {
    out[n++] = static_cast<int32_t>(first + __builtin_ctzll(bits) / 4);
  }
  return n;
}

// 2^n built in the exponent bits, as AVX2's: lanes below kExpMin give 0 like expf
constexpr float kExpMin = -87.3f, kExpMax = 88.3f;
inline F32 times_pow2(F32 p, F32 n, F32 x) {
  return each([&](int c) {
    const uint32x4_t underflow = vcltq_f32(x.v[c], vdupq_n_f32(kExpMin));
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.v[c]), vdupq_n_s32(127)), 23);
    const float32x4_t e = vmulq_f32(p.v[c], vreinterpretq_f32_s32(bits));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), underflow));
  });
}

}  // namespace vec
}  // namespace
#endif
