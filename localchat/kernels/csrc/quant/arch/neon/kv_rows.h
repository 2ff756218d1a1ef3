// The paged KV pool's float32, float16 and bfloat16 rows on ARM NEON (quant/generic/kv_rows.h says what each
// function does): 16 values at a time as four vectors, float16 widened by vcvt and bfloat16 by a shift, and a run of
// value rows keeping its G heads' sums of 16 columns in registers.
#pragma once
#include "../../generic/kv_rows.h"

#if LC_NEON
#define LC_ISA_DOT_ROW 1
#define LC_ISA_DOT_HEADS 1
#define LC_ISA_ADD_SCALED_ROW 1
#define LC_ISA_ADD_ROWS 1
#define LC_ISA_STORE_ROW 1
namespace {
namespace isa {

// p[0, 16) as four float32 vectors
template <RowType R>
inline void load16(const RowElement<R>* p, float32x4_t out[4]) {
  if constexpr (R == RowType::kFloat) {
    for (int c = 0; c < 4; ++c) out[c] = vld1q_f32(p + 4 * c);
  } else {
    const uint16x8_t lo = vld1q_u16(p), hi = vld1q_u16(p + 8);
    if constexpr (R == RowType::kHalf) {
      out[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(lo)));
      out[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(lo)));
      out[2] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(hi)));
      out[3] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(hi)));
    } else {
      out[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(lo), 16));
      out[1] = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(lo), 16));
      out[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(hi), 16));
      out[3] = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(hi), 16));
    }
  }
}

inline float sum16(const float32x4_t acc[4]) {
  return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
}

template <RowType R>
float dot_row(const float* q, const RowElement<R>* k, int64_t n) {
  int64_t i = 0;
  float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  for (; i + 16 <= n; i += 16) {
    float32x4_t kc[4];
    load16<R>(k + i, kc);
    for (int c = 0; c < 4; ++c) acc[c] = vfmaq_f32(acc[c], vld1q_f32(q + i + 4 * c), kc[c]);
  }
  float sum = sum16(acc);
  for (; i < n; ++i) sum += q[i] * widen<R>(k[i]);
  return sum;
}

// G independent sums in flight, each chunk of k loaded (and widened) once for all G.
template <int G, RowType R>
void dot_heads(const float* q, const RowElement<R>* k, int64_t D, float scale, float* out, int64_t stride) {
  if (D % 16 == 0) {
    float32x4_t acc[G][4];
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < 4; ++c) acc[g][c] = vdupq_n_f32(0.f);
    }
    for (int64_t i = 0; i < D; i += 16) {
      float32x4_t kc[4];
      load16<R>(k + i, kc);
      for (int g = 0; g < G; ++g) {
        for (int c = 0; c < 4; ++c) acc[g][c] = vfmaq_f32(acc[g][c], vld1q_f32(q + g * D + i + 4 * c), kc[c]);
      }
    }
    for (int g = 0; g < G; ++g) out[g * stride] = sum16(acc[g]) * scale;
    return;
  }
  for (int g = 0; g < G; ++g) out[g * stride] = dot_row<R>(q + g * D, k, D) * scale;
}

template <RowType R>
void add_scaled_row(float* acc, float w, const RowElement<R>* v, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    float32x4_t vc[4];
    load16<R>(v + i, vc);
    for (int c = 0; c < 4; ++c) vst1q_f32(acc + i + 4 * c, vfmaq_n_f32(vld1q_f32(acc + i + 4 * c), vc[c], w));
  }
  generic::add_scaled_row<R>(acc + i, w, v + i, n - i);
}

template <int G, RowType R>
void add_rows(const RowElement<R>* v, int64_t row, int64_t count, const float* w, int64_t w_stride, int64_t D,
              float* out, int64_t out_stride) {
  if (D % 16 == 0) {
    for (int64_t i = 0; i < D; i += 16) {
      float32x4_t acc[G][4];
      for (int g = 0; g < G; ++g) {
        for (int c = 0; c < 4; ++c) acc[g][c] = vdupq_n_f32(0.f);
      }
      for (int64_t j = 0; j < count; ++j) {
        float32x4_t vc[4];
        load16<R>(v + j * row + i, vc);
        for (int g = 0; g < G; ++g) {
          const float wg = w[g * w_stride + j];
          for (int c = 0; c < 4; ++c) acc[g][c] = vfmaq_n_f32(acc[g][c], vc[c], wg);
        }
      }
      for (int g = 0; g < G; ++g) {
        float* o = out + g * out_stride + i;
        for (int c = 0; c < 4; ++c) vst1q_f32(o + 4 * c, vaddq_f32(vld1q_f32(o + 4 * c), acc[g][c]));
      }
    }
    return;
  }
  for (int g = 0; g < G; ++g) {
    for (int64_t j = 0; j < count; ++j) add_scaled_row<R>(out + g * out_stride, w[g * w_stride + j], v + j * row, D);
  }
}

// float16 rounded by vcvt (to nearest even, the FPCR's default mode: float_to_half's bits); bfloat16 stays scalar
template <RowType R>
void store_row(RowElement<R>* dst, const float* src, int64_t n) {
  int64_t i = 0;
  if constexpr (R == RowType::kHalf) {
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
  }
  generic::store_row<R>(dst + i, src + i, n - i);
}

}  // namespace isa
}  // namespace
#endif
