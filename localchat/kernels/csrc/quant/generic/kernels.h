// The generic kernels: every layout's GEMV and panel in plain C++ (the compiler vectorizes what it can). They are the
// fallback for any layout an ISA has no kernel for (quant/dispatch.h), what a build without vector kernels runs
// (LOCALCHAT_CPU_ISA=generic, an old CPU), and the reference of the standalone kernel test
// (csrc/tests/kernel_test.cpp).
//
// A row is first turned into its codes in natural order, a byte each, and each group's scale and min as floats (the
// types' unpack_row, generic/blocks.h, for the file's blocks; gather_pass_row for the repacked layouts, either
// arrangement). Then each group's integer dot product with the activation codes is exact (precise: (dot1 << 8) +
// dot2; less zero_point * the group's activation sum), and the groups are summed in floats in a fixed order: group g
// into lane g % 4, acc = fma(dot, scale * activation scale, acc), the mins' terms likewise in lanes of their own,
// then ((lane 0 + lane 1) + (lane 2 + lane 3)) over acc + mins. The NEON kernels (arch/neon/) keep that order, so
// their results are the generic ones bit for bit; the x86 kernels have their own (16 or 8 lanes of chunks).
#pragma once
#include <cmath>

#include "restore.h"

namespace {
namespace generic {

// Lanes the groups of a row are summed in (group g in lane g % kSumLanes).
constexpr int kSumLanes = 4;

// The float sums of one (activation row, weight row) pair, in the order every generic and NEON kernel keeps.
struct RowSums {
  float acc[kSumLanes] = {0.f, 0.f, 0.f, 0.f};
  float offsets[kSumLanes] = {0.f, 0.f, 0.f, 0.f};

  // group g's exact integer dot product times its weight scale and its activation scale
  inline void add(int64_t g, int32_t dot, float scale, float activation_scale) {
    float& lane = acc[g % kSumLanes];
    lane = std::fma(static_cast<float>(dot), scale * activation_scale, lane);
  }
  // group g's min times the activation's group term (da * sum of its codes)
  inline void add_min(int64_t g, float min, float term) {
    float& lane = offsets[g % kSumLanes];
    lane = std::fma(min, term, lane);
  }
  inline float total() const {
    return ((acc[0] + offsets[0]) + (acc[1] + offsets[1])) + ((acc[2] + offsets[2]) + (acc[3] + offsets[3]));
  }
};

// A row of codes in natural order (a byte each), with its groups' scales and mins as floats: one thread's buffers.
struct NaturalRow {
  std::vector<uint8_t> raw, codes;
  std::vector<float> scales, mins;
  bool has_mins = false;

  // Row r of the pass v (K weights in layout L) into the buffers.
  void load(const PassView& v, int r, int64_t w_row, int64_t K, const Layout& L) {
    const int64_t groups = K / L.group_size;
    raw.resize(std::max(w_row, K));
    codes.resize(K);
    scales.resize(groups);
    mins.resize(groups);
    const Layout* layout = &L;
    if (L.file_blocks()) {  // (the file's blocks are row-major)
      layout = &kUnpackRow[L.file - 2](L, v.w + r * v.row_step, K, raw.data(), scales.data(), mins.data());
      has_mins = L.block_mins();
    } else {
      gather_pass_row(v, r, w_row, groups, v.sup != nullptr, raw.data(), scales.data(), mins.data());
      has_mins = v.m != nullptr;
    }
    natural_codes(*layout, K, raw.data(), codes.data());
  }

  // The codes of a row (row-major, in layout L) in natural order.
  static void natural_codes(const Layout& L, int64_t K, const uint8_t* row, uint8_t* out) {
    if (L.u6) {
      for (int64_t c = 0; c < K / 128; ++c) u6_chunk_values(row, K, c, L, out + 128 * c);
    } else if (L.nibbles) {  // byte j of a group: weight j low, j + 16 high
      for (int64_t g = 0; g < K / 32; ++g) {
        for (int i = 0; i < 16; ++i) {
          out[32 * g + i] = row[16 * g + i] & 0x0F;
          out[32 * g + 16 + i] = row[16 * g + i] >> 4;
        }
      }
    } else {
      std::memcpy(out, row, K);
    }
  }

  // This row against activation row a (quantized for it: a.zero_point is the weight's, 0 with mins).
  float dot(const ActivationRow& a, int group_size) const {
    const int64_t groups = static_cast<int64_t>(scales.size());
    RowSums sums;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* w = codes.data() + g * group_size;
      const int8_t* q = a.natural + g * group_size;
      int32_t d = 0;
      for (int i = 0; i < group_size; ++i) d += w[i] * q[i];
      if (a.precise) {
        const int8_t* q2 = a.natural2 + g * group_size;
        int32_t d2 = 0;
        for (int i = 0; i < group_size; ++i) d2 += w[i] * q2[i];
        d = d * 256 + d2;
      }
      sums.add(g, d - a.zero_point * a.group_sums[g], scales[g], a.group_scales[g]);
      if (has_mins) sums.add_min(g, mins[g], a.group_terms[g]);
    }
    return sums.total();
  }
};

inline NaturalRow& thread_row() {
  thread_local NaturalRow row;
  return row;
}

void gemv(const PassView& v, int64_t w_row, int64_t, int64_t, int64_t, const Layout& L, const ActivationRow& a,
          int rows, float* out) {
  NaturalRow& row = thread_row();
  const int64_t K = L.in_features(w_row);
  for (int r = 0; r < rows; ++r) {
    row.load(v, r, w_row, K, L);
    out[r] = row.dot(a, L.group_size);
  }
}

void panel(const PassView& v, int64_t groups, int64_t, int64_t, const Layout& L, const ActivationRow* acts, int64_t mt,
           int rows, float* out, int64_t out_stride, void*) {
  NaturalRow& row = thread_row();
  const int64_t K = groups * L.group_size;
  for (int r = 0; r < rows; ++r) {
    row.load(v, r, L.row_bytes(K), K, L);
    for (int64_t t = 0; t < mt; ++t) out[t * out_stride + r] = row.dot(acts[t], L.group_size);
  }
}

inline GemvFn pick_gemv(bool, bool, bool, const Layout&) { return gemv; }
inline PanelFn pick_panel(bool, bool, bool, const Layout&) { return panel; }

}  // namespace generic
}  // namespace
