// The ARM NEON kernels, with the dot-product instructions (ARMv8.2-A dotprod: Apple M1 and later, AWS Graviton 2
// and later, Ampere Altra, Raspberry Pi 5): u4 and u8 (row-major or interleaved) and every type's blocks. u6 (only
// ever a repacked Q6_K, which these builds read in its blocks) takes the generic kernel.
//
// Each group's integer dot product runs on sdot (signed x signed bytes): a group's codes enter as code - offset (u4
// and the 4- and 5-bit blocks as they are, u8 and Q8_0 as code - 128, Q6_K as code - 32), and (offset - zero point)
// x the group's activation sum is added back in int32, so the product is the generic kernel's exactly. Four groups'
// products are summed into one vector, and the groups are summed in floats in the generic kernels' order (group g
// in lane g % 4, acc = fma(dot, scale * activation scale, acc), the mins in lanes of their own, then ((lane 0 +
// lane 1) + (lane 2 + lane 3))), with the scales and mins the types' own functions form (generic/blocks.h): every
// result is the generic kernels' bit for bit, which the standalone kernel test (csrc/tests/kernel_test.cpp) checks
// under qemu.
#pragma once
#include "../../generic/kernels.h"

#if LC_NEON
#define LC_ISA_NAME "neon"

namespace {
namespace isa {

// A group's codes as signed bytes, code - offset: weights 0-15 in lo, 16-31 in hi (a group of 16: lo only).
struct GroupCodes {
  int8x16_t lo, hi;
};

inline int8x16_t low_nibbles(uint8x16_t b) { return vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))); }
inline int8x16_t high_nibbles(uint8x16_t b) { return vreinterpretq_s8_u8(vshrq_n_u8(b, 4)); }
inline int8x16_t minus_128(uint8x16_t b) { return vreinterpretq_s8_u8(veorq_u8(b, vdupq_n_u8(0x80))); }

// 16 where bit i of the low 16 bits of `bits` is set, in byte i; else 0.
inline uint8x16_t sixteens(uint32_t bits) {
  const uint8x16_t bytes = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)), vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  static const uint8_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vandq_u8(vtstq_u8(bytes, vld1q_u8(kBits)), vdupq_n_u8(16));
}

// One group's partial dot products with activation codes q (4 lanes; their sum is the group's).
template <int GROUP>
inline int32x4_t group_dot(const GroupCodes& w, const int8_t* q) {
  int32x4_t acc = vdotq_s32(vdupq_n_s32(0), w.lo, vld1q_s8(q));
  if (GROUP == 32) acc = vdotq_s32(acc, w.hi, vld1q_s8(q + 16));
  return acc;
}

// Four groups' dot products from their partial ones, lane j the group g0 + j.
inline int32x4_t sum_groups(const int32x4_t p[4]) {
  return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

// One weight row against activation row a: its groups' codes from codes(g) (signed, code - offset), its groups'
// scales and (MINS) mins as floats, in generic::RowSums' order.
template <int GROUP, bool MINS, bool PRECISE, typename Codes>
inline float row_dot(const Codes& codes, const float* scales, const float* mins, int64_t groups, int offset,
                     const ActivationRow& a) {
  float32x4_t acc = vdupq_n_f32(0.f), off = vdupq_n_f32(0.f);
  const int32x4_t fix = vdupq_n_s32(offset - a.zero_point);
  for (int64_t g0 = 0; g0 < groups; g0 += 4) {
    const int n = static_cast<int>(std::min<int64_t>(4, groups - g0));
    int32x4_t p[4], p2[4];
    for (int j = 0; j < 4; ++j) {
      p[j] = p2[j] = vdupq_n_s32(0);
      if (j >= n) continue;
      const GroupCodes w = codes(g0 + j);
      p[j] = group_dot<GROUP>(w, a.natural + (g0 + j) * GROUP);
      if (PRECISE) p2[j] = group_dot<GROUP>(w, a.natural2 + (g0 + j) * GROUP);
    }
    int32x4_t dots = sum_groups(p);
    if (PRECISE) dots = vaddq_s32(vshlq_n_s32(dots, 8), sum_groups(p2));
    float32x4_t s, m = vdupq_n_f32(0.f), terms = vdupq_n_f32(0.f);
    int32x4_t sums;
    if (n == 4) {
      sums = vld1q_s32(a.group_sums + g0);
      s = vld1q_f32(scales + g0);
      if (MINS) m = vld1q_f32(mins + g0), terms = vld1q_f32(a.group_terms + g0);
    } else {  // the last groups: zeros past them
      int32_t sum_part[4] = {0, 0, 0, 0};
      float s_part[4] = {0.f, 0.f, 0.f, 0.f}, m_part[4] = {0.f, 0.f, 0.f, 0.f}, t_part[4] = {0.f, 0.f, 0.f, 0.f};
      for (int j = 0; j < n; ++j) {
        sum_part[j] = a.group_sums[g0 + j];
        s_part[j] = scales[g0 + j];
        if (MINS) m_part[j] = mins[g0 + j], t_part[j] = a.group_terms[g0 + j];
      }
      sums = vld1q_s32(sum_part);
      s = vld1q_f32(s_part);
      m = vld1q_f32(m_part);
      terms = vld1q_f32(t_part);
    }
    dots = vmlaq_s32(dots, sums, fix);
    // (the activation's group scales are zero-padded past the last group)
    acc = vfmaq_f32(acc, vcvtq_f32_s32(dots), vmulq_f32(s, vld1q_f32(a.group_scales + g0)));
    if (MINS) off = vfmaq_f32(off, m, terms);
  }
  const float32x4_t total = vaddq_f32(acc, off);
  const float32x2_t pairs = vpadd_f32(vget_low_f32(total), vget_high_f32(total));
  return vget_lane_f32(pairs, 0) + vget_lane_f32(pairs, 1);
}

// One thread's per-row buffers: the groups' scales and mins, and (panels) the row's codes decoded once.
struct RowBuffers {
  std::vector<float> scales, mins;
  std::vector<int8_t> codes;
};

inline RowBuffers& thread_buffers(int64_t groups, int64_t K) {
  thread_local RowBuffers buffers;
  if (static_cast<int64_t>(buffers.scales.size()) < groups) {
    buffers.scales.resize(groups);
    buffers.mins.resize(groups);
  }
  if (static_cast<int64_t>(buffers.codes.size()) < K) buffers.codes.resize(K);
  return buffers;
}

// How the kernels read one layout's rows: Rows(v, r, L) is row r of the pass v; codes(g) group g's codes, params()
// the row's scales and mins (kGroup: weights a group; kOffset: what a code less; mins(): whether it has mins).

// u4: a group's 16 bytes, weight j low and j + 16 high (the chunk's bytes of either arrangement).
struct U4Rows {
  static constexpr int kGroup = 32, kOffset = 0;
  const PassView& v;
  int r;
  U4Rows(const PassView& view, int row, const Layout&) : v(view), r(row) {}
  GroupCodes codes(int64_t g) const {
    const uint8x16_t b = vld1q_u8(v.codes(r, g / 4) + (g % 4) * 16);
    return {low_nibbles(b), high_nibbles(b)};
  }
  bool mins() const { return v.m != nullptr; }
  void params(int64_t groups, float* scales, float* mins) const {
    generic::gather_pass_params(v, r, groups, v.sup != nullptr, scales, mins);
  }
};

// u8 in groups of 32 or 16: the bytes, code - 128.
template <int GROUP>
struct U8Rows {
  static constexpr int kGroup = GROUP, kOffset = 128;
  const PassView& v;
  int r;
  U8Rows(const PassView& view, int row, const Layout&) : v(view), r(row) {}
  GroupCodes codes(int64_t g) const {
    const uint8_t* p = v.codes(r, g / (64 / GROUP)) + (g % (64 / GROUP)) * GROUP;
    return {minus_128(vld1q_u8(p)), GROUP == 32 ? minus_128(vld1q_u8(p + 16)) : vdupq_n_s8(0)};
  }
  bool mins() const { return v.m != nullptr; }
  void params(int64_t groups, float* scales, float* mins) const {
    generic::gather_pass_params(v, r, groups, v.sup != nullptr, scales, mins);
  }
};

// A row of the file's blocks (row-major).
struct BlockRow {
  const uint8_t* row;
  BlockRow(const PassView& v, int r) : row(v.w + r * v.row_step) {}
};

// Q6_K, groups of 16: group q of a block's half h is ql's low (q < 4) or high nibbles of 16 bytes, with bit pair q / 2
// of 16 bytes of qh on top (generic::u6_chunk_values' order); code - 32.
struct Q6KRows : BlockRow {
  static constexpr int kGroup = 16, kOffset = 32;
  Q6KRows(const PassView& v, int r, const Layout&) : BlockRow(v, r) {}
  GroupCodes codes(int64_t g) const {
    const uint8_t* block = row + g / 16 * kQ6KBytes;
    const int h = static_cast<int>(g % 16) / 8, k = static_cast<int>(g % 8);
    const uint8x16_t ql = vld1q_u8(block + 64 * h + 16 * (k % 4));
    const uint8x16_t qh = vld1q_u8(block + kQ6KHighBits + 32 * h + 16 * (k % 2));
    const uint8x16_t low = k < 4 ? vandq_u8(ql, vdupq_n_u8(0x0F)) : vshrq_n_u8(ql, 4);
    const uint8x16_t top = vandq_u8(vshlq_u8(qh, vdupq_n_s8(static_cast<int8_t>(-2 * (k / 2)))), vdupq_n_u8(3));
    const uint8x16_t code = vorrq_u8(low, vshlq_n_u8(top, 4));
    return {vsubq_s8(vreinterpretq_s8_u8(code), vdupq_n_s8(32)), vdupq_n_s8(0)};
  }
  bool mins() const { return false; }
  void params(int64_t groups, float* scales, float*) const { generic::q6k_row_scales(row, groups, scales); }
};

// Q4_K (FIVE: Q5_K): group q of a block is the low (q even) or high nibbles of 32 bytes, with (Q5_K) bit q of the 32
// fifth-bit bytes as bit 4.
template <bool FIVE>
struct KRows : BlockRow {
  static constexpr int kGroup = 32, kOffset = 0;
  static constexpr int64_t kBytes = FIVE ? kQ5KBytes : kQ4KBytes, kCodes = FIVE ? kQ5KCodes : kQ4KCodes;
  KRows(const PassView& v, int r, const Layout&) : BlockRow(v, r) {}
  GroupCodes codes(int64_t g) const {
    const uint8_t* block = row + g / 8 * kBytes;
    const int q = static_cast<int>(g % 8);
    const uint8_t* qs = block + kCodes + 32 * (q / 2);
    uint8x16_t lo = vld1q_u8(qs), hi = vld1q_u8(qs + 16);
    if (q % 2 == 0) {
      lo = vandq_u8(lo, vdupq_n_u8(0x0F));
      hi = vandq_u8(hi, vdupq_n_u8(0x0F));
    } else {
      lo = vshrq_n_u8(lo, 4);
      hi = vshrq_n_u8(hi, 4);
    }
    if (FIVE) {
      const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(4 - q));  // bit q to bit 4
      const uint8x16_t bit4 = vdupq_n_u8(16);
      lo = vorrq_u8(lo, vandq_u8(vshlq_u8(vld1q_u8(block + kQ5KHighBits), shift), bit4));
      hi = vorrq_u8(hi, vandq_u8(vshlq_u8(vld1q_u8(block + kQ5KHighBits + 16), shift), bit4));
    }
    return {vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)};
  }
  bool mins() const { return true; }
  void params(int64_t groups, float* scales, float* mins) const {
    for (int64_t b = 0; b < groups / 8; ++b) generic::k_block_params(row + b * kBytes, scales + 8 * b, mins + 8 * b);
  }
};

// Q8_0: a block's 32 int8 codes are code - 128 of the u8 repack.
struct Q8_0Rows : BlockRow {
  static constexpr int kGroup = 32, kOffset = 128;
  Q8_0Rows(const PassView& v, int r, const Layout&) : BlockRow(v, r) {}
  GroupCodes codes(int64_t g) const {
    const uint8_t* block = row + g * kQ8_0Bytes;
    return {vld1q_s8(reinterpret_cast<const int8_t*>(block + 2)), vld1q_s8(reinterpret_cast<const int8_t*>(block + 18))};
  }
  bool mins() const { return false; }
  void params(int64_t groups, float* scales, float*) const {
    float unused;
    for (int64_t g = 0; g < groups; ++g) generic::group_block_params(row + g * kQ8_0Bytes, false, scales[g], unused);
  }
};

// Q4_0, Q4_1 (MINS), Q5_0 and Q5_1 (FIFTH): d (and m), Q5's 32 fifth bits, then 16 bytes of nibbles (weight j low,
// j + 16 high).
template <bool MINS, bool FIFTH>
struct Q4Rows : BlockRow {
  static constexpr int kGroup = 32, kOffset = 0;
  static constexpr int64_t kHigh = MINS ? 4 : 2, kCodes = kHigh + (FIFTH ? 4 : 0), kBytes = kCodes + 16;
  Q4Rows(const PassView& v, int r, const Layout&) : BlockRow(v, r) {}
  GroupCodes codes(int64_t g) const {
    const uint8_t* block = row + g * kBytes;
    const uint8x16_t b = vld1q_u8(block + kCodes);
    if (!FIFTH) return {low_nibbles(b), high_nibbles(b)};
    uint32_t qh;
    std::memcpy(&qh, block + kHigh, 4);
    return {vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0F)), sixteens(qh))),
            vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b, 4), sixteens(qh >> 16)))};
  }
  bool mins() const { return MINS; }
  void params(int64_t groups, float* scales, float* mins) const {
    float unused;
    for (int64_t g = 0; g < groups; ++g) {
      generic::group_block_params(row + g * kBytes, MINS, scales[g], MINS ? mins[g] : unused);
    }
  }
};

// MXFP4: an E8M0 byte, then 16 bytes of 4-bit E2M1 codes (weight j low, j + 16 high); one table lookup per vector
// turns each code into its doubled value (kMxfp4Values), which is the kernels' code (value + 12) less 12.
struct Mxfp4Rows : BlockRow {
  static constexpr int kGroup = 32, kOffset = generic::kMxfp4Zero;
  static constexpr int64_t kBytes = 17;
  Mxfp4Rows(const PassView& v, int r, const Layout&) : BlockRow(v, r) {}
  GroupCodes codes(int64_t g) const {
    const int8x16_t values = vld1q_s8(generic::kMxfp4Values);
    const uint8x16_t b = vld1q_u8(row + g * kBytes + 1);
    return {vqtbl1q_s8(values, vandq_u8(b, vdupq_n_u8(0x0F))), vqtbl1q_s8(values, vshrq_n_u8(b, 4))};
  }
  bool mins() const { return false; }
  void params(int64_t groups, float* scales, float*) const {
    for (int64_t g = 0; g < groups; ++g) scales[g] = generic::mxfp4_scale(row[g * kBytes]);
  }
};
static_assert(Mxfp4Rows::kBytes == kQuantTypes[kBlocksMXFP4 - 2].block_bytes, "an E8M0 byte, 16 bytes of codes");

template <class Rows, bool MINS, bool PRECISE, typename Codes>
inline float rows_dot(const Codes& codes, const RowBuffers& b, int64_t groups, const ActivationRow& a) {
  return row_dot<Rows::kGroup, MINS, PRECISE>(codes, b.scales.data(), b.mins.data(), groups, Rows::kOffset, a);
}

template <class Rows, typename Codes>
inline float dispatch_dot(const Codes& codes, bool mins, const RowBuffers& b, int64_t groups, const ActivationRow& a) {
  if (mins) {
    return a.precise ? rows_dot<Rows, true, true>(codes, b, groups, a) : rows_dot<Rows, true, false>(codes, b, groups, a);
  }
  return a.precise ? rows_dot<Rows, false, true>(codes, b, groups, a) : rows_dot<Rows, false, false>(codes, b, groups, a);
}

// A decode: each row's groups decoded as they are multiplied.
template <class Rows>
void gemv(const PassView& v, int64_t, int64_t groups, int64_t, int64_t, const Layout& L, const ActivationRow& a,
          int rows, float* out) {
  RowBuffers& b = thread_buffers(groups, 0);
  for (int r = 0; r < rows; ++r) {
    const Rows row(v, r, L);
    row.params(groups, b.scales.data(), b.mins.data());
    out[r] = dispatch_dot<Rows>([&](int64_t g) { return row.codes(g); }, row.mins(), b, groups, a);
  }
}

// A batch: each row's groups decoded once into the thread's buffer, then multiplied with every activation row.
template <class Rows>
void panel(const PassView& v, int64_t groups, int64_t, int64_t, const Layout& L, const ActivationRow* acts, int64_t mt,
           int rows, float* out, int64_t out_stride, void*) {
  constexpr int G = Rows::kGroup;
  RowBuffers& b = thread_buffers(groups, groups * G);
  int8_t* codes = b.codes.data();
  for (int r = 0; r < rows; ++r) {
    const Rows row(v, r, L);
    row.params(groups, b.scales.data(), b.mins.data());
    for (int64_t g = 0; g < groups; ++g) {
      const GroupCodes w = row.codes(g);
      vst1q_s8(codes + g * G, w.lo);
      if (G == 32) vst1q_s8(codes + g * G + 16, w.hi);
    }
    auto stored = [&](int64_t g) {
      return GroupCodes{vld1q_s8(codes + g * G), G == 32 ? vld1q_s8(codes + g * G + 16) : vdupq_n_s8(0)};
    };
    for (int64_t t = 0; t < mt; ++t) out[t * out_stride + r] = dispatch_dot<Rows>(stored, row.mins(), b, groups, acts[t]);
  }
}

template <bool FOR_GEMV, class Rows>
inline std::conditional_t<FOR_GEMV, GemvFn, PanelFn> kernel() {
  if constexpr (FOR_GEMV) return gemv<Rows>;
  else return panel<Rows>;
}

// The kernel for a weight of layout L, or null (u6: the generic one).
template <bool FOR_GEMV>
std::conditional_t<FOR_GEMV, GemvFn, PanelFn> pick(const Layout& L) {
  switch (L.file) {
    case kRowMajor:
      if (L.u6) return nullptr;
      if (L.nibbles) return kernel<FOR_GEMV, U4Rows>();
      return L.group_size == 32 ? kernel<FOR_GEMV, U8Rows<32>>() : kernel<FOR_GEMV, U8Rows<16>>();
    case kBlocksQ6_K: return kernel<FOR_GEMV, Q6KRows>();
    case kBlocksQ4_K: return kernel<FOR_GEMV, KRows<false>>();
    case kBlocksQ5_K: return kernel<FOR_GEMV, KRows<true>>();
    case kBlocksQ8_0: return kernel<FOR_GEMV, Q8_0Rows>();
    case kBlocksQ4_0: return kernel<FOR_GEMV, Q4Rows<false, false>>();
    case kBlocksQ4_1: return kernel<FOR_GEMV, Q4Rows<true, false>>();
    case kBlocksQ5_0: return kernel<FOR_GEMV, Q4Rows<false, true>>();
    case kBlocksQ5_1: return kernel<FOR_GEMV, Q4Rows<true, true>>();
    case kBlocksMXFP4: return kernel<FOR_GEMV, Mxfp4Rows>();
    default: return nullptr;
  }
}

inline GemvFn pick_gemv(bool, bool, bool, const Layout& L) { return pick<true>(L); }
inline PanelFn pick_panel(bool, bool, bool, const Layout& L) { return pick<false>(L); }

}  // namespace isa
}  // namespace
#endif
