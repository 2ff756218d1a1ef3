// The types every quantized-projection kernel shares (docs/kernels.md): which ISA this build's kernels are for, the
// quantization types (types.def), a weight's layout, the activation rows the integer dot products read, and where a
// pass of weight rows lies. Nothing here needs torch: the standalone kernel test (csrc/tests/kernel_test.cpp) builds
// these headers for ARM with a cross compiler.
//
// y = x @ W.T for a PackedWeight W (localchat/kernels/packed_weight.py): the activations are quantized to int8 per 32
// values (as llama.cpp does for its integer dot products), then each weight group's integer dot product (unsigned
// weight codes x signed activation codes) is scaled once per group:
//   sum_k w_k x_k = sum_g scale_g * da_g * sum_{k in g} code_k * qa_k  +  sum_g min_g * da_g * sum_{k in g} qa_k
// A 64-byte "chunk" of weight codes holds 4 groups (u4: 128 weights; u8 group 16: 64 weights) or 2 groups (u8 group
// 32: 64 weights); a u6 chunk is 64 bytes of low nibbles (8 groups of 16: 128 weights) and 32 bytes of top bits from
// the row's second plane. The x86 kernels give each of a chunk's 16 int32 lanes one group, and the activations are
// laid out per chunk to match, so no shuffles run in their inner loop.
//
// With precise=true each activation is carried by two int8 codes, x = da * (q1 + q2 / 256), about 16 bits of
// precision (int8 alone flips the top token at a few percent of positions against float32); the two dot products
// combine exactly in int32 as (dot1 << 8) + dot2.
//
// A weight may be "interleaved" (PackedWeight.interleaved): each block of kRowsPerPass rows that a kernel reads
// together is stored chunk by chunk (chunk c of row r at c * 4 * 64 + r * 64 within the block, a short last chunk of
// t bytes at r * t), and its scales and mins 16 groups at a time the same way, so a pass reads one stream of codes
// instead of four. Rows past the last whole block stay row-major. Measured on this VM (2026-12-02), four row
// streams read 35 GB/s and one interleaved stream 43-48 GB/s.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <vector>

// The ISA whose kernels this build compiles (quant/arch/<isa>/); quant/generic/ is compiled always, and takes every
// function an ISA lacks. LC_ISA_GENERIC (LOCALCHAT_CPU_ISA=generic) leaves the ISAs out.
#if !defined(LC_ISA_GENERIC) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>
#define LC_VNNI 1  // quant/arch/avx512/
#else
#define LC_VNNI 0
#endif
#if !defined(LC_ISA_GENERIC) && !LC_VNNI && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LC_AVX2 1  // quant/arch/avx2/: the same kernels on 256-bit vectors
#else
#define LC_AVX2 0
#endif
#if !defined(LC_ISA_GENERIC) && defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define LC_NEON 1  // quant/arch/neon/
#else
#define LC_NEON 0
#endif
#define LC_SIMD (LC_VNNI || LC_AVX2)  // the x86 kernels (their activation layout, their interleaved weights)
#if defined(__F16C__)
#include <immintrin.h>
#endif

// A failed argument check: TORCH_CHECK's error in the extension, std::runtime_error in the standalone test.
#if defined(TORCH_CHECK)
#define LC_CHECK TORCH_CHECK
#else
namespace lc_detail {
template <typename... Parts>
[[noreturn]] inline void fail(const char* condition, const Parts&... parts) {
  std::ostringstream message;
  message << condition << ": ";
  (message << ... << parts);
  throw std::runtime_error(message.str());
}
}  // namespace lc_detail
#define LC_CHECK(condition, ...) \
  do {                           \
    if (!(condition)) ::lc_detail::fail(#condition, ##__VA_ARGS__); \
  } while (0)
#endif

namespace {

// float16 <-> float32, exactly as torch converts (the float16 -> float32 direction is exact; float32 -> float16
// rounds to nearest even, with F16C where the CPU has it and in integer arithmetic elsewhere, the same bits).
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    float value = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &value, 4);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
#endif
}

// float32 -> float16 rounded to nearest even in integer arithmetic (what F16C's conversion gives).
inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) return static_cast<uint16_t>(sign | (ax > 0x7F800000 ? 0x7E00 : 0x7C00));  // NaN, inf
  if (ax >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // 65520 and up round to inf
  if (ax < 0x38800000) {  // below 2^-14: a subnormal float16, mantissa * 2^-24 rounded to nearest even
    if (ax < 0x33000000) return static_cast<uint16_t>(sign);  // below 2^-25
    const uint32_t mantissa = (ax & 0x7FFFFF) | 0x800000, shift = 126 - (ax >> 23);
    uint32_t h = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) ++h;  // (a carry makes the smallest normal: its encoding)
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t r = ax - 0x38000000;  // the exponent rebiased from 127 to 15, in float32's bit positions
  r += 0xFFF + ((r >> 13) & 1);  // round the 13 bits dropped to nearest even (a carry moves the exponent)
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return float_to_half_bits(f);
#endif
}

inline uint16_t load_half_bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// One quantization type's record (types.def).
struct QuantTraits {
  const char* name;          // GGML's name: Q4_K, ...
  int ggml_id;               // GGMLQuantizationType
  const char* layout;        // the PackedWeight layout that keeps its blocks
  int64_t block_weights, block_bytes;
  int bits;                  // of the codes the kernels form from a block
  int group_size;            // weights per scale
  int zero_point;            // symmetric types: value = scale * (code - zero_point)
  bool mins;                 // value = scale * code + min, the mins in the blocks
  bool k_scales;             // 6-bit sub-scales and sub-mins of a super-block's (d, dmin)
  const char* repacked;      // the layout it is repacked into: u4, u6 or u8
};

constexpr QuantTraits kQuantTypes[] = {
#define LC_QUANT_TYPE(NAME, ID, LAYOUT, WEIGHTS, BYTES, BITS, GROUP, ZERO, MINS, K_SCALES, REPACKED) \
  {#NAME, ID, #LAYOUT, WEIGHTS, BYTES, BITS, GROUP, ZERO, MINS != 0, K_SCALES != 0, #REPACKED},
#include "types.def"
#undef LC_QUANT_TYPE
};
constexpr int kQuantTypeCount = static_cast<int>(sizeof(kQuantTypes) / sizeof(kQuantTypes[0]));

// How a weight's rows are stored (PackedWeight.arrangement): row by row, interleaved kRowsPerPass rows at a time (see
// above), or as the GGUF file's own blocks of a type in types.def (kBlocksQ6_K, ...: 2 + the type's row there).
enum Arrangement : int64_t {
  kRowMajor = 0,
  kInterleaved = 1,
#define LC_QUANT_TYPE(NAME, ...) kBlocks##NAME,
#include "types.def"
#undef LC_QUANT_TYPE
  kArrangementEnd
};
static_assert(kArrangementEnd == 2 + kQuantTypeCount, "one arrangement per type");

constexpr const QuantTraits& quant_type(Arrangement file) { return kQuantTypes[file - 2]; }

// The ggml type id's arrangement, or kRowMajor where types.def has no such type.
inline Arrangement arrangement_of_ggml(int64_t ggml_id) {
  for (int t = 0; t < kQuantTypeCount; ++t) {
    if (kQuantTypes[t].ggml_id == ggml_id) return static_cast<Arrangement>(t + 2);
  }
  return kRowMajor;
}

// Prefetch the cache lines of `bytes` bytes at p. (The empty asm marks each prefetch as wanted: GCC 12 at -O2 deleted
// a loop nest whose only work was prefetches, as it deletes loops without effects.)
inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* start = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
    __builtin_prefetch(start + b);
    asm volatile("" : : "r"(start + b));
  }
}

// Blocks' sizes as the kernels name them (types.def's numbers; where a field lies inside a block is the type's
// kernels' business).
constexpr int64_t kQ6KWeights = quant_type(kBlocksQ6_K).block_weights, kQ6KBytes = quant_type(kBlocksQ6_K).block_bytes;
constexpr int64_t kQ4KWeights = quant_type(kBlocksQ4_K).block_weights, kQ4KBytes = quant_type(kBlocksQ4_K).block_bytes;
constexpr int64_t kQ5KBytes = quant_type(kBlocksQ5_K).block_bytes;
constexpr int64_t kQ8_0Weights = quant_type(kBlocksQ8_0).block_weights, kQ8_0Bytes = quant_type(kBlocksQ8_0).block_bytes;
constexpr int64_t kQ4_0Bytes = quant_type(kBlocksQ4_0).block_bytes, kQ4_1Bytes = quant_type(kBlocksQ4_1).block_bytes;
constexpr int64_t kQ5_0Bytes = quant_type(kBlocksQ5_0).block_bytes, kQ5_1Bytes = quant_type(kBlocksQ5_1).block_bytes;
constexpr int64_t kMxfp4Bytes = quant_type(kBlocksMXFP4).block_bytes;  // an E8M0 byte and 16 bytes of codes
// Where a Q6_K block's top bits, int8 sub-scales and float16 d lie; a Q4_K block's 12 bytes of sub-scales and sub-mins
// and its codes (float16 d and dmin come first); a Q5_K block is the same with 32 bytes of fifth bits before the codes.
constexpr int64_t kQ6KHighBits = 128, kQ6KSubScales = 192, kQ6KSuperScale = 208;
constexpr int64_t kQ4KSubParams = 4, kQ4KCodes = 16, kQ5KHighBits = 16, kQ5KCodes = 48;

constexpr int kActBlock = 32;   // activation values sharing one int8 scale
constexpr int kChunkBytes = 64; // weight bytes per inner-loop step

struct Layout {
  bool nibbles;          // two codes per byte of the (first) plane: u4, and u6's low nibbles
  bool u6;               // u6: the top two bits of each code come from a second plane (packed_weight.py)
  int group_size;
  int groups_per_chunk;  // weight groups in one 64-byte chunk
  int chunk_values;      // weights (= activation values) per chunk
  int act_chunk_bytes;   // int8 activation bytes per chunk (nibbles: low-nibble half, then high-nibble half)
  // the file's blocks the rows are (types.def; the x86 kernels read Q6_K's as u6's codes and activations, the 4- and
  // 5-bit types' as u4's, Q8_0's as u8's), with their scales inside them; kRowMajor for the other layouts
  Arrangement file = kRowMajor;

  int bits() const { return file_blocks() ? quant_type(file).bits : u6 ? 6 : nibbles ? 4 : 8; }
  bool file_blocks() const { return file != kRowMajor; }
  const QuantTraits& type() const { return quant_type(file); }
  bool k_blocks() const { return file_blocks() && type().k_scales; }  // Q4_K, Q5_K
  // blocks of one group each (Q8_0, Q4_0, ...)
  bool group_blocks() const { return file_blocks() && type().block_weights == type().group_size; }
  // blocks that hold mins (asymmetric types)
  bool block_mins() const { return file_blocks() && type().mins; }
  // bytes of a row's (first) plane of codes, and of the whole row, for K weights
  int64_t code_bytes(int64_t K) const { return nibbles ? K / 2 : K; }
  int64_t block_bytes() const { return type().block_bytes; }
  int64_t block_weights() const { return type().block_weights; }
  int64_t row_bytes(int64_t K) const {
    if (file_blocks()) return K / block_weights() * block_bytes();
    return u6 ? K / 2 + K / 4 : code_bytes(K);
  }
  int64_t in_features(int64_t row) const {
    if (file_blocks()) return row / block_bytes() * block_weights();
    return u6 ? row / 3 * 4 : nibbles ? row * 2 : row;
  }
};

Layout make_layout(int64_t bits, int64_t group_size, int64_t arrangement = kRowMajor) {
  LC_CHECK(arrangement >= kRowMajor && arrangement < kArrangementEnd, "unknown arrangement ", arrangement);
  const Arrangement file = arrangement >= 2 ? static_cast<Arrangement>(arrangement) : kRowMajor;
  if (file != kRowMajor) {  // the file's blocks: their type's bits and group
    const QuantTraits& t = quant_type(file);
    LC_CHECK(bits == t.bits && group_size == t.group_size, t.name, " blocks are ", t.bits, "-bit codes in groups of ",
             t.group_size);
  } else {
    LC_CHECK(bits == 4 || bits == 6 || bits == 8, "bits must be 4, 6 or 8 (5: blocks of a 5-bit type)");
  }
  if (bits == 4 || bits == 5) {  // a 5-bit block's fifth bit joins its nibbles in registers: u4's layout otherwise
    LC_CHECK(group_size == 32, "u4 weights need group_size 32");
    return {true, false, 32, 4, 128, 128, file};
  }
  if (bits == 6) {
    LC_CHECK(group_size == 16, "u6 weights need group_size 16");
    return {true, true, 16, 8, 128, 128, file};
  }
  LC_CHECK(group_size == 16 || group_size == 32, "u8 weights need group_size 16 or 32");
  return {false, false, static_cast<int>(group_size), 64 / static_cast<int>(group_size), 64, 64, file};
}

// row-major u4 and u8: what a Q4_K and a Q5_K row are restored as
const Layout kU4 = make_layout(4, 32), kU8 = make_layout(8, 32);

// int8 activations for one row, arranged for the layout, with per-lane scales and per-group sums.
struct ActivationRow {
  int8_t* codes;        // [chunks * act_chunk_bytes], zero-padded
  int8_t* codes2;       // the second-level codes (precise mode), same arrangement
  float* lane_scales;   // [chunks * 16]
  float* group_terms;   // [groups]: da * sum(codes) of the group (multiplies the group's min)
  int32_t* lane_zsums;  // [chunks * 16]: zero_point * the codes summed per dot-product lane (symmetric types)
  int32_t* lane_u8_fix; // [chunks * 16]: (128 - zero_point) * the codes summed per lane (AVX2's u8 codes - 128)
  int8_t* natural;      // [chunks * chunk_values] codes in natural order (the generic and NEON kernels)
  int8_t* natural2;
  float* block_scales;  // [K / 32]
  float* group_scales;  // [groups + 16]: the activation scale of each weight group (zero-padded)
  int32_t* group_sums;  // [groups]: each group's codes summed (precise: 256 * first level + second)
  int32_t zero_point = 0;  // the weight's, which lane_zsums carry
  bool precise = false;
};

// 64-byte aligned activation buffers for M rows of K values in a weight layout.
struct ActivationBuffers {
  std::vector<uint8_t> storage;
  std::vector<ActivationRow> rows;
  int64_t chunks = 0;

  ActivationBuffers() = default;
  ActivationBuffers(int64_t M, int64_t K, const Layout& L) {
    chunks = (K + L.chunk_values - 1) / L.chunk_values;
    const int64_t groups = K / L.group_size;
    const int64_t code_bytes = chunks * L.act_chunk_bytes;
    const int64_t lane_floats = chunks * 16;
    const int64_t int_bytes = ((2 * (code_bytes + chunks * L.chunk_values) + 63) / 64) * 64;
    const int64_t row_bytes =
        int_bytes + ((3 * lane_floats + groups + K / kActBlock + groups + 16 + groups) * 4 + 63) / 64 * 64;
    storage.resize(M * row_bytes + 64);
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
    rows.resize(M);
    for (int64_t m = 0; m < M; ++m) {
      uint8_t* p = base + m * row_bytes;
      ActivationRow& a = rows[m];
      a.codes = reinterpret_cast<int8_t*>(p);
      a.codes2 = reinterpret_cast<int8_t*>(p + code_bytes);
      a.natural = reinterpret_cast<int8_t*>(p + 2 * code_bytes);
      a.natural2 = reinterpret_cast<int8_t*>(p + 2 * code_bytes + chunks * L.chunk_values);
      float* f = reinterpret_cast<float*>(p + int_bytes);
      a.lane_scales = f;
      a.lane_zsums = reinterpret_cast<int32_t*>(f + lane_floats);
      a.lane_u8_fix = reinterpret_cast<int32_t*>(f + 2 * lane_floats);
      a.group_terms = f + 3 * lane_floats;
      a.block_scales = f + 3 * lane_floats + groups;
      a.group_scales = a.block_scales + K / kActBlock;
      a.group_sums = reinterpret_cast<int32_t*>(a.group_scales + groups + 16);
      std::fill(a.group_scales, a.group_scales + groups + 16, 0.f);
    }
  }
};

void arrange(const int8_t* src_all, int8_t* dst_all, const Layout& L, int64_t chunks) {
  for (int64_t c = 0; c < chunks; ++c) {
    int8_t* dst = dst_all + c * L.act_chunk_bytes;
    const int8_t* src = src_all + c * L.chunk_values;
    if (L.nibbles) {  // low nibbles carry the first half of each group's values, high nibbles the second
      const int half = L.group_size / 2;
      for (int j = 0; j < L.groups_per_chunk; ++j) {
        std::memcpy(dst + half * j, src + L.group_size * j, half);
        std::memcpy(dst + 64 + half * j, src + L.group_size * j + half, half);
      }
    } else {
      std::memcpy(dst, src, 64);
    }
  }
}

// Quantize chunks [c0, c1) of one activation row; every step is local to a chunk, so threads can share a row.
void quantize_chunks(const float* x, int64_t K, const Layout& L, int64_t c0, int64_t c1, bool precise,
                     int32_t zero_point, ActivationRow& a) {
  const int64_t v0 = c0 * L.chunk_values, v1 = std::min<int64_t>(c1 * L.chunk_values, K);
  a.zero_point = zero_point;
  a.precise = precise;
  if (c0 >= c1) return;
  std::memset(a.natural + v0, 0, (c1 - c0) * L.chunk_values);
  if (precise) std::memset(a.natural2 + v0, 0, (c1 - c0) * L.chunk_values);
  // precise: x = d * (q1 + q2 / 256), so the integer sums are taken in units of d / 256
  const float unit = precise ? 1.f / 256.f : 1.f;
  for (int64_t b = v0 / kActBlock; b < v1 / kActBlock; ++b) {
    const float* v = x + b * kActBlock;
    float amax = 0.f;
#pragma omp simd reduction(max : amax)
    for (int i = 0; i < kActBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    a.block_scales[b] = d * unit;
    int8_t* q1s = a.natural + b * kActBlock;
    int8_t* q2s = a.natural2 + b * kActBlock;
    if (precise) {
#pragma omp simd
      for (int i = 0; i < kActBlock; ++i) {
        const float scaled = v[i] * inv;
        const float q1 = std::nearbyint(scaled);
        q1s[i] = static_cast<int8_t>(q1);
        q2s[i] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, std::nearbyint((scaled - q1) * 256.f))));
      }
    } else {
#pragma omp simd
      for (int i = 0; i < kActBlock; ++i) q1s[i] = static_cast<int8_t>(std::nearbyint(v[i] * inv));
    }
  }
  const int64_t groups = K / L.group_size;
  for (int64_t g = v0 / L.group_size; g < v1 / L.group_size; ++g) {
    int sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < L.group_size; ++i) {
      const int64_t k = g * L.group_size + i;
      sum += precise ? 256 * a.natural[k] + a.natural2[k] : a.natural[k];
    }
    a.group_sums[g] = sum;
    a.group_scales[g] = a.block_scales[g * L.group_size / kActBlock];
    a.group_terms[g] = a.group_scales[g] * static_cast<float>(sum);
  }
  arrange(a.natural + v0, a.codes + c0 * L.act_chunk_bytes, L, c1 - c0);
  if (precise) arrange(a.natural2 + v0, a.codes2 + c0 * L.act_chunk_bytes, L, c1 - c0);
  const int lanes_per_group = 16 / L.groups_per_chunk;
  // the lane sums serve a zero point (symmetric types) and AVX2's u8 codes; elsewhere they stay zero
  const bool need_sums = zero_point != 0 || (LC_AVX2 && !L.nibbles);
  for (int64_t c = c0; c < c1; ++c) {
    for (int lane = 0; lane < 16; ++lane) {
      const int64_t g = c * L.groups_per_chunk + lane / lanes_per_group;
      a.lane_scales[c * 16 + lane] = g < groups ? a.block_scales[g * L.group_size / kActBlock] : 0.f;
      // subtracting zero_point * sum(codes) in int32 keeps symmetric types exact (Q8_0 codes sit at +128:
      // in floats, the two terms would cancel)
      int32_t sum = 0;
      for (int half = 0; half < (need_sums ? (L.nibbles ? 2 : 1) : 0); ++half) {
        for (int i = 0; i < 4; ++i) {
          const int64_t at = c * L.act_chunk_bytes + half * 64 + lane * 4 + i;
          sum += precise ? 256 * a.codes[at] + a.codes2[at] : a.codes[at];
        }
      }
      a.lane_u8_fix[c * 16 + lane] = (128 - zero_point) * sum;
      a.lane_zsums[c * 16 + lane] = zero_point * sum;
    }
  }
}

void quantize_row(const float* x, int64_t K, const Layout& L, int64_t chunks, bool precise, int32_t zero_point,
                  ActivationRow& a) {
  quantize_chunks(x, K, L, 0, chunks, precise, zero_point, a);
}

constexpr int kRowsPerPass = 4;  // weight rows one pass of a kernel reads together
// Each weight line is prefetched this many rows (two passes) ahead. The hardware prefetchers do not keep four
// interleaved row streams ahead of the dot products: measured on 2026-12-01, the Q8_0 LM head streamed from
// DRAM at 11.6 GB/s without and 18.4 GB/s with it, a decode's layers at 6.9 and 9.0 GB/s.
constexpr int kPrefetchRows = 2 * kRowsPerPass;
// An interleaved weight is one stream of codes, prefetched this many bytes ahead instead. Two passes ahead is
// 16 KiB for a 4096-wide Q4_K weight and 56 KiB for a 14336-wide one, more than L1 holds beside the
// activations, so the lines were evicted before use. Measured on the Zen 4 EPYC (2026-12-04, 2 threads, all 32
// layers of the 8B Q4_K_M file from DRAM, two runs each): gate/up 28.6-29.4 GB/s two passes ahead, 30.7-32.9
// at 2-4 KiB; o 24.7-28.3 and 30.1-31.4; down's Q4_K 21.3-22.7 and 23.9-25.9.
constexpr int64_t kPrefetchBytes = 4096;
// An interleaved u6 weight's pass reads two regions of its block at once, its low nibbles and (at half the pace)
// its top bits, so its prefetches run this many chunks ahead in the order the chunks are read, on into the next
// pass's block. A byte distance ran from the nibbles into the pass's own top bits (already being read), and the
// next pass's first top bits were read before any prefetch reached them. Measured on the Zen 5 EPYC (2026-12-04,
// 2 threads, eight copies from DRAM, alternating): a 14336 x 4096 Q6_K-like weight (attn_v, the LM head) read at
// 26-27 GB/s with the byte distance, 44 with this; 4096 x 14336 (ffn_down) at 34 and 39.
constexpr int64_t kPrefetchChunks = kPrefetchBytes / (kRowsPerPass * kChunkBytes);

constexpr int kGroupBlock = 16;  // scales (and mins) interleaved this many groups at a time

// Where the kRowsPerPass (or fewer) rows of one pass lie: their codes' chunks and their groups' scales and mins,
// row-major or interleaved (see the top of this file).
struct PassView {
  const uint8_t* w;
  const void* s;        // scales: float16, or (K-quant scales) the sub-scales' and sub-mins' low bits (k_params)
  const void* m;        // mins likewise (K-quants: their top bits, two groups a byte), or null (symmetric types)
  const uint16_t* sup;  // K-quant scales: float16 (d, dmin) per 8 groups, 4 halves per block of kGroupBlock groups
  int64_t row_step, chunk_step, full_chunks, tail_row_step;
  int64_t g_row_step, g_block_step, full_blocks, g_tail_row_step;
  int64_t sup_row_step, sup_block_step, sup_tail_row_step;

  // whether the pass's rows are stored chunk by chunk (one stream of codes)
  inline bool interleaved() const { return chunk_step == kRowsPerPass * kChunkBytes; }
  // whether the pass is interleaved and holds its block b of kGroupBlock groups whole: the block's scales and
  // mins of all kRowsPerPass rows then lie side by side (the K-quant kernels unpack them together)
  inline bool holds_block(int64_t b) const { return interleaved() && b < full_blocks; }
  inline const uint8_t* codes(int r, int64_t c) const {
    return w + c * chunk_step + r * (c < full_chunks ? row_step : tail_row_step);
  }
  // groups g .. g + n of row r (n <= 16, all in one block of kGroupBlock), in scales or mins of type T
  template <typename T>
  inline const T* group(const void* base, int r, int64_t g) const {
    const int64_t b = g / kGroupBlock;
    return static_cast<const T*>(base) + b * g_block_step + r * (b < full_blocks ? g_row_step : g_tail_row_step) +
           g % kGroupBlock;
  }
  // K-quant mins (their top bits): the byte of groups g and g + 1 (g even) of row r, half as wide as group<>
  inline const uint8_t* half_group(const void* base, int r, int64_t g) const {
    const int64_t b = g / kGroupBlock;
    const int64_t at = b * g_block_step + r * (b < full_blocks ? g_row_step : g_tail_row_step) + g % kGroupBlock;
    return static_cast<const uint8_t*>(base) + at / 2;
  }
  // (d, dmin) of the (one or two) super-blocks of row r's block b of kGroupBlock groups
  inline const uint16_t* supers(int r, int64_t b) const {
    return sup + b * sup_block_step + r * (b < full_blocks ? sup_row_step : sup_tail_row_step);
  }
};

// Halves of (d, dmin) per row of a K-quant weight with `groups` groups (one pair per 8 groups).
constexpr int64_t kSupersPerBlock = 4;
inline int64_t super_row(int64_t groups) { return groups / 4; }

// The view of the pass whose first row is n, in a weight of N rows of w_row bytes and `groups` groups. Its scales
// and mins are float16, or with up (K-quant scales: the (d, dmin) pairs) the packed sub-scales and sub-mins (k_params).
inline PassView pass_view(const uint8_t* wp, const void* sp, const void* mp, const void* supers, int64_t n,
                          int64_t N, int64_t w_row, int64_t groups, bool interleaved) {
  const uint16_t* up = static_cast<const uint16_t*>(supers);  // float16 bits
  const int64_t sup_row = super_row(groups), param_bytes = up ? 1 : 2;
  PassView v{wp + n * w_row,
             static_cast<const char*>(sp) + n * groups * param_bytes,
             mp ? static_cast<const char*>(mp) + (up ? n * groups / 2 : n * groups * param_bytes) : nullptr,
             up ? up + n * sup_row : nullptr,
             w_row, kChunkBytes, INT64_MAX, w_row,
             groups, kGroupBlock, INT64_MAX, groups,
             sup_row, kSupersPerBlock, sup_row};
  if (interleaved && n + kRowsPerPass <= N) {
    v.row_step = kChunkBytes;
    v.chunk_step = kRowsPerPass * kChunkBytes;
    v.full_chunks = w_row / kChunkBytes;
    v.tail_row_step = w_row % kChunkBytes;
    v.g_row_step = kGroupBlock;
    v.g_block_step = kRowsPerPass * kGroupBlock;
    v.full_blocks = groups / kGroupBlock;
    v.g_tail_row_step = groups % kGroupBlock;
    v.sup_row_step = kSupersPerBlock;
    v.sup_block_step = kRowsPerPass * kSupersPerBlock;
    v.sup_tail_row_step = sup_row % kSupersPerBlock;
  }
  return v;
}

// Interleave (or, with back=true, undo it) the rows of a [rows, width] tensor in place, `unit` elements at a
// time: the codes with unit 64 bytes, scales and mins with unit kGroupBlock.
template <typename T>
void interleave_block(T* block, int64_t width, int64_t unit, bool back, T* scratch) {
  const int64_t full = width / unit, tail = width % unit;
  std::memcpy(scratch, block, sizeof(T) * kRowsPerPass * width);
  for (int r = 0; r < kRowsPerPass; ++r) {
    for (int64_t c = 0; c <= full; ++c) {
      const int64_t n = c < full ? unit : tail;
      if (n == 0) continue;
      T* row_major = (back ? block : scratch) + r * width + c * unit;
      T* inter = (back ? scratch : block) + c * kRowsPerPass * unit + r * n;
      if (back) std::memcpy(row_major, inter, sizeof(T) * n);
      else std::memcpy(inter, row_major, sizeof(T) * n);
    }
  }
}

// A K-quant group's 6-bit sub-scale and sub-min from its byte of low bits (scale | min << 4) and the nibble of
// top bits (scale's in bits 0-1, min's in 2-3) PackedWeight keeps (packed_weight.py's pack_k_params).
inline void k_params(uint8_t low, int top, int& scale, int& min) {
  scale = (low & 0x0F) | ((top & 3) << 4);
  min = (low >> 4) | (((top >> 2) & 3) << 4);
}

// The nibble of top bits of group g, from the byte `top` that groups g & ~1 and g | 1 share.
inline int k_top_nibble(uint8_t top, int64_t g) { return (top >> (4 * (g & 1))) & 0x0F; }

// The kernels' signatures, the same on every ISA (quant/dispatch.h picks them per weight).
// One activation row (a decode) against the kRowsPerPass (or fewer: `rows`) weight rows of a pass, into out[rows].
using GemvFn = void (*)(const PassView& v, int64_t w_row, int64_t groups, int64_t chunks, int64_t weight_bytes,
                        const Layout& L, const ActivationRow& a, int rows, float* out);
// Activation rows acts[0 .. mt) against a pass's weight rows, into out[t * out_stride + r]; `scratch` holds
// kPanelScratchPerRow bytes per activation row (the accumulators), 64-byte aligned. Per (activation row, weight row)
// pair a panel runs its ISA's GEMV's operations in the same order, so a row's result does not depend on its batch.
using PanelFn = void (*)(const PassView& v, int64_t groups, int64_t chunks, int64_t weight_bytes, const Layout& L,
                         const ActivationRow* acts, int64_t mt, int rows, float* out, int64_t out_stride,
                         void* scratch);
constexpr int64_t kPanelScratchPerRow = kRowsPerPass * 64;
// Activation rows per panel: their accumulators (8 KiB) stay in L1 beside the streaming codes.
constexpr int64_t kPanelRows = 32;

}  // namespace
