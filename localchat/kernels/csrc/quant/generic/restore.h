// Restoring rows of a packed weight to floats in plain C++ (quant/restore.h runs them; an ISA may bring its own,
// which must give the same values): a row's codes and group parameters gathered from a pass (either arrangement),
// and a row-major row of codes turned into floats as PackedWeight.dequantize computes them.
#pragma once
#include "blocks.h"

namespace {
namespace generic {

// Row r of a pass (v: either arrangement) of a repacked weight: its groups' scales and mins (with mins: v.m is set) as
// floats: float16 values, or with k_scales d * sub-scale and -(dmin * sub-min); gather_pass_row also its w_row bytes
// of codes, row-major, into codes.
inline void gather_pass_params(const PassView& v, int r, int64_t groups, bool k_scales, float* row_scales,
                               float* row_mins) {
  for (int64_t g = 0; g < groups; ++g) {
    if (k_scales) {  // d * sub-scale and -(dmin * sub-min)
      const uint16_t* pair = v.supers(r, g / kGroupBlock) + (g % kGroupBlock) / 8 * 2;
      int scale, min;
      k_params(*v.group<uint8_t>(v.s, r, g), k_top_nibble(*v.half_group(v.m, r, g & ~int64_t{1}), g), scale, min);
      row_scales[g] = static_cast<float>(scale) * half_to_float(pair[0]);
      row_mins[g] = -(static_cast<float>(min) * half_to_float(pair[1]));
    } else {
      row_scales[g] = half_to_float(*v.group<uint16_t>(v.s, r, g));
      if (v.m) row_mins[g] = half_to_float(*v.group<uint16_t>(v.m, r, g));
    }
  }
}

inline void gather_pass_row(const PassView& v, int r, int64_t w_row, int64_t groups, bool k_scales, uint8_t* codes,
                            float* row_scales, float* row_mins) {
  for (int64_t c = 0; c * kChunkBytes < w_row; ++c) {
    std::memcpy(codes + c * kChunkBytes, v.codes(r, c), std::min<int64_t>(kChunkBytes, w_row - c * kChunkBytes));
  }
  gather_pass_params(v, r, groups, k_scales, row_scales, row_mins);
}

// One row of K weights as floats: row-major codes (row: the row's bytes), each group's float scale, and its min
// (mins, asymmetric types) or the zero point, as PackedWeight.dequantize computes them: code * scale + min, or
// (code - zero_point) * scale.
void dequantize_row(const uint8_t* row, const float* scales, const float* mins, int64_t zero_point, const Layout& L,
                    int64_t K, float* out) {
  const int64_t groups = K / L.group_size;
  const float zp = static_cast<float>(zero_point);
  auto value = [&](int code, float scale, float min) {
    return mins ? static_cast<float>(code) * scale + min : (static_cast<float>(code) - zp) * scale;
  };
  uint8_t chunk[128];  // a u6 row's codes, one 128-weight chunk at a time
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = scales[g], min = mins ? mins[g] : 0.f;
    float* o = out + g * L.group_size;
    if (L.u6) {
      const int64_t first = g * L.group_size;
      if (first % 128 == 0) u6_chunk_values(row, K, first / 128, L, chunk);
      const uint8_t* b = chunk + first % 128;
      for (int i = 0; i < L.group_size; ++i) o[i] = value(b[i], scale, min);
    } else if (L.nibbles) {
      const uint8_t* b = row + g * 16;
      for (int i = 0; i < 16; ++i) {
        o[i] = value(b[i] & 0x0F, scale, min);
        o[i + 16] = value(b[i] >> 4, scale, min);
      }
    } else {
      const uint8_t* b = row + g * L.group_size;
      for (int i = 0; i < L.group_size; ++i) o[i] = value(b[i], scale, min);
    }
  }
}

}  // namespace generic
}  // namespace
