// The q8_0 KV pool's rows on ARM NEON (quant/generic/kv_q8.h says what each function does): 16 codes at a time
// widened to four float vectors and multiplied by their block's scale in registers, the same codes as the generic
// quantize (vcvtnq rounds to nearest even).
#pragma once
#include "../../generic/kv_q8.h"

#if LC_NEON
#define LC_KV_Q8_ISA 1
namespace {
namespace isa {

// codes[0, 16) of a block times its scale d, as four vectors of 4
inline void kv_q8_values16(const int8_t* codes, float d, float32x4_t out[4]) {
  const int8x16_t bytes = vld1q_s8(codes);
  const int16x8_t lo = vmovl_s8(vget_low_s8(bytes)), hi = vmovl_s8(vget_high_s8(bytes));
  out[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d);
  out[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d);
  out[2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d);
  out[3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d);
}

inline void kv_q8_quantize(const float* x, int64_t n, KvQ8Block* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float32x4_t v[8];
    float32x4_t top = vdupq_n_f32(0.f);
    for (int c = 0; c < 8; ++c) {
      v[c] = vld1q_f32(x + 32 * b + 4 * c);
      top = vmaxq_f32(top, vabsq_f32(v[c]));
    }
    const float d = vmaxvq_f32(top) / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
    out[b].d = float_to_half(d);
    for (int c = 0; c < 8; c += 2) {
      const int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[c], inverse));
      const int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(v[c + 1], inverse));
      const int16x8_t q16 = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
      vst1_s8(out[b].qs + 4 * c, vqmovn_s16(q16));
    }
  }
}

template <int G>
void kv_q8_dot(const float* q, const KvQ8Block* k, int64_t D, float scale, float* out, int64_t stride) {
  float32x4_t acc[G];
  for (int g = 0; g < G; ++g) acc[g] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < D / 32; ++b) {
    const float d = half_to_float(k[b].d);
    for (int h = 0; h < 2; ++h) {
      float32x4_t kc[4];
      kv_q8_values16(k[b].qs + 16 * h, d, kc);
      for (int g = 0; g < G; ++g) {
        const float* qg = q + g * D + 32 * b + 16 * h;
        for (int c = 0; c < 4; ++c) acc[g] = vfmaq_f32(acc[g], vld1q_f32(qg + 4 * c), kc[c]);
      }
    }
  }
  for (int g = 0; g < G; ++g) out[g * stride] = vaddvq_f32(acc[g]) * scale;
}

// kv_q8_add_rows over the values [i0, i0 + 16) of each row (half a block): 4 G sums in registers over the run.
template <int G>
void kv_q8_add_rows_chunk(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t i0,
                          float* out, int64_t out_stride) {
  float32x4_t acc[G][4];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 4; ++c) acc[g][c] = vdupq_n_f32(0.f);
  }
  for (int64_t j = 0; j < count; ++j) {
    const KvQ8Block& block = v[j * row + i0 / 32];
    float32x4_t vc[4];
    kv_q8_values16(block.qs + i0 % 32, half_to_float(block.d), vc);
    for (int g = 0; g < G; ++g) {
      const float weight = w[g * w_stride + j];
      for (int c = 0; c < 4; ++c) acc[g][c] = vfmaq_n_f32(acc[g][c], vc[c], weight);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 4; ++c) {
      float* o = out + g * out_stride + i0 + 4 * c;
      vst1q_f32(o, vaddq_f32(vld1q_f32(o), acc[g][c]));
    }
  }
}

template <int G>
void kv_q8_add_rows(const KvQ8Block* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
                    float* out, int64_t out_stride) {
  for (int64_t i = 0; i < D; i += 16) kv_q8_add_rows_chunk<G>(v, row, count, w, w_stride, i, out, out_stride);
}

}  // namespace isa
}  // namespace
#endif
