// Rows of a packed weight restored to floats (an embedding lookup, the bfloat16 GEMM's bands, a dense copy): a row's
// codes row-major and its groups' scales and mins as floats, from either arrangement or from the file's blocks, then
// PackedWeight.dequantize's values. This ISA's functions where it has them (LC_ISA_RESTORE), else the generic ones:
// the same values either way.
#pragma once
#include "dispatch.h"

namespace {

// A packed weight's arrays (quant_linear.h's WeightArgs checks them): codes [N, w_row], scales and mins (float16,
// or K-quant sub-scales and sub-mins with supers), or the file's blocks alone.
struct WeightView {
  const uint8_t* qweight;
  const void* scales;
  const void* mins;        // null: symmetric, or mins in the blocks
  const uint16_t* supers;  // K-quant (d, dmin) pairs, or null
  int64_t N, w_row;
};

// Row n of a packed weight as floats: its codes gathered into `codes` (w_row bytes), its scales and mins into
// `row_scales`/`row_mins` (groups each), then PackedWeight.dequantize's values into out (K floats).
struct RowRestorer {
  WeightView w;
  const Layout& L;
  int64_t K, groups, zero_point;
  bool interleaved;
  bool with_mins;  // asymmetric: mins in the weight's arrays, or in its blocks
  std::vector<uint8_t> codes;
  std::vector<float> row_scales, row_mins;

  RowRestorer(const WeightView& view, const Layout& layout, int64_t zp, bool inter)
      : w(view), L(layout), K(layout.in_features(view.w_row)), groups(K / layout.group_size), zero_point(zp),
        interleaved(inter), with_mins(view.mins != nullptr || layout.block_mins()), codes(std::max(view.w_row, K)),
        row_scales(groups), row_mins(groups) {}

  void restore(int64_t n, float* out) {
    const Layout& layout = gather(n);
    isa::dequantize_row(codes.data(), row_scales.data(), with_mins ? row_mins.data() : nullptr, zero_point, layout, K,
                        out);
  }

#if LC_VNNI && defined(__AVX512BF16__)
  void restore_bf16(int64_t n, uint16_t* out) {
    const Layout& layout = gather(n);
    isa::dequantize_row_bf16(codes.data(), row_scales.data(), with_mins ? row_mins.data() : nullptr, zero_point,
                             layout, K, out);
  }
#endif

  // Row n's codes (row-major) into `codes` and its groups' scales and mins into row_scales and row_mins; returns
  // the layout of the codes (a type's blocks as unpack_row gives them: Q4_K, Q4_0 and Q4_1 rows as u4, Q5_K, Q5_0,
  // Q5_1 and Q8_0 rows as u8, Q6_K's blocks as they are).
  const Layout& gather(int64_t n) {
    const uint8_t* row = w.qweight + n * w.w_row;
    if (L.file_blocks()) return unpack_row(L.file)(L, row, K, codes.data(), row_scales.data(), row_mins.data());
    const int64_t r = n % kRowsPerPass;
    const PassView v = pass_view(w.qweight, w.scales, w.mins, w.supers, n - r, w.N, w.w_row, groups, interleaved);
    isa::gather_pass_row(v, r, w.w_row, groups, w.supers != nullptr, codes.data(), row_scales.data(), row_mins.data());
    return L;
  }
};

}  // namespace
