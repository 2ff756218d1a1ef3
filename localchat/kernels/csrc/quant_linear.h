// Quantized projections on the CPU: y = x @ W.T for a PackedWeight W (localchat/kernels/packed_weight.py).
//
// The activations are quantized to int8 per 32 values (as llama.cpp does for its integer dot products),
// then each weight group's integer dot product runs on AVX-512 VNNI (vpdpbusd: unsigned weight codes x
// signed activation codes) and is scaled once per group:
//   sum_k w_k x_k = sum_g scale_g * da_g * sum_{k in g} code_k * qa_k  +  sum_g min_g * da_g * sum_{k in g} qa_k
// A 64-byte "chunk" of weight codes holds 4 groups (u4: 128 weights; u8 group 16: 64 weights) or 2 groups
// (u8 group 32: 64 weights); a u6 chunk is 64 bytes of low nibbles (8 groups of 16: 128 weights) and 32 bytes
// of top bits from the row's second plane. Each of the 16 int32 lanes of a dot product belongs to one group.
// The activations are laid out per chunk to match, so no shuffles run in the inner loop.
//
// With precise=true each activation is carried by two int8 codes, x = da * (q1 + q2 / 256), about 16 bits
// of precision (int8 alone flips the top token at a few percent of positions against float32); the two dot
// products combine exactly in int32 as (dot1 << 8) + dot2.
//
// A weight may be "interleaved" (PackedWeight.interleaved): each block of kRowsPerPass rows that the kernel
// reads together is stored chunk by chunk (chunk c of row r at c * 4 * 64 + r * 64 within the block, a short
// last chunk of t bytes at r * t), and its scales and mins 16 groups at a time the same way, so a pass reads
// one stream of codes instead of four. Rows past the last whole block stay row-major. Measured on this VM
// (2026-12-02), four row streams read 35 GB/s and one interleaved stream 43-48 GB/s.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "vector_math.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define LC_VNNI 1
#else
#define LC_VNNI 0
#endif
#if !LC_VNNI && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LC_AVX2 1  // quant_linear_avx2.h: the same kernels on 256-bit vectors
#else
#define LC_AVX2 0
#endif
#define LC_SIMD (LC_VNNI || LC_AVX2)

namespace {

constexpr int kActBlock = 32;   // activation values sharing one int8 scale
constexpr int kChunkBytes = 64; // weight bytes per inner-loop step

// How a weight's rows are stored (PackedWeight.arrangement): row by row, interleaved kRowsPerPass rows at a time
// (see above), or as the GGUF file's own blocks: Q6_K for 6-bit codes (quant_q6k.h), Q4_K and Q5_K for 4- and 5-bit
// ones (quant_k_blocks.h), Q8_0 for 8-bit ones (quant_q8_0.h), Q4_0, Q4_1, Q5_0 and Q5_1 for 4- and 5-bit ones
// (quant_q4_q5_blocks.h).
enum Arrangement : int64_t {
  kRowMajor = 0, kInterleaved = 1, kQ6KBlocks = 2, kQ4KBlocks = 3, kQ5KBlocks = 4, kQ8_0Blocks = 5, kQ4_0Blocks = 6,
  kQ4_1Blocks = 7, kQ5_0Blocks = 8, kQ5_1Blocks = 9
};

// A Q6_K block: its weights and bytes, and where its top bits, int8 sub-scales and float16 d lie in it
constexpr int64_t kQ6KWeights = 256, kQ6KBytes = 210, kQ6KHighBits = 128, kQ6KSubScales = 192, kQ6KSuperScale = 208;
// A Q4_K block: its weights and bytes, and where its 12 bytes of sub-scales and sub-mins and its codes lie in it
// (float16 d and dmin come first). A Q5_K block is the same with 32 bytes of fifth bits before the codes.
constexpr int64_t kQ4KWeights = 256, kQ4KBytes = 144, kQ4KSubParams = 4, kQ4KCodes = 16;
constexpr int64_t kQ5KBytes = 176, kQ5KHighBits = 16, kQ5KCodes = 48;
// A Q8_0 block: float16 d, then 32 int8 codes
constexpr int64_t kQ8_0Weights = 32, kQ8_0Bytes = 34;
// A Q4_0 block: float16 d, then 16 bytes of 4-bit codes; a Q4_1 block: float16 d and m, then the same (32 weights).
// Q5_0 and Q5_1 blocks: the same with 4 bytes of fifth bits before the codes.
constexpr int64_t kQ4_0Bytes = 18, kQ4_1Bytes = 20, kQ5_0Bytes = 22, kQ5_1Bytes = 24;

struct Layout {
  bool nibbles;          // two codes per byte of the (first) plane: u4, and u6's low nibbles
  bool u6;               // u6: the top two bits of each code come from a second plane (packed_weight.py)
  int group_size;
  int groups_per_chunk;  // weight groups in one 64-byte chunk
  int chunk_values;      // weights (= activation values) per chunk
  int act_chunk_bytes;   // int8 activation bytes per chunk (nibbles: low-nibble half, then high-nibble half)
  // the file's blocks the rows are (kQ6KBlocks: u6's codes and activations; kQ4KBlocks, kQ5KBlocks, kQ4_0Blocks,
  // kQ4_1Blocks, kQ5_0Blocks, kQ5_1Blocks: u4's; kQ8_0Blocks: u8's), with their scales inside them; kRowMajor for
  // the other layouts
  Arrangement file = kRowMajor;

  int bits() const {
    return file == kQ5KBlocks || file == kQ5_0Blocks || file == kQ5_1Blocks ? 5 : u6 ? 6 : nibbles ? 4 : 8;
  }
  bool file_blocks() const { return file != kRowMajor; }
  bool k_blocks() const { return file == kQ4KBlocks || file == kQ5KBlocks; }  // quant_k_blocks.h
  // blocks of one group each (quant_q8_0.h, quant_q4_q5_blocks.h)
  bool group_blocks() const { return file >= kQ8_0Blocks; }
  // blocks that hold mins (asymmetric types)
  bool block_mins() const { return k_blocks() || file == kQ4_1Blocks || file == kQ5_1Blocks; }
  // bytes of a row's (first) plane of codes, and of the whole row, for K weights
  int64_t code_bytes(int64_t K) const { return nibbles ? K / 2 : K; }
  // a file block's bytes and weights (every K-quant block holds 256 weights, the others one group of 32)
  int64_t block_bytes() const {
    switch (file) {
      case kQ6KBlocks: return kQ6KBytes;
      case kQ4KBlocks: return kQ4KBytes;
      case kQ5KBlocks: return kQ5KBytes;
      case kQ4_0Blocks: return kQ4_0Bytes;
      case kQ4_1Blocks: return kQ4_1Bytes;
      case kQ5_0Blocks: return kQ5_0Bytes;
      case kQ5_1Blocks: return kQ5_1Bytes;
      default: return kQ8_0Bytes;
    }
  }
  int64_t block_weights() const { return group_blocks() ? kQ8_0Weights : kQ4KWeights; }
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
  TORCH_CHECK(arrangement >= kRowMajor && arrangement <= kQ5_1Blocks, "unknown arrangement ", arrangement);
  const bool five = arrangement == kQ5KBlocks || arrangement == kQ5_0Blocks || arrangement == kQ5_1Blocks;
  TORCH_CHECK(bits == 4 || bits == 6 || bits == 8 || (bits == 5 && five),
              "bits must be 4, 6 or 8 (5: Q5_K, Q5_0 and Q5_1 blocks)");
  if (arrangement >= kQ6KBlocks) {  // the file's blocks: their type's bits, and the vector kernels
    constexpr const char* kNames[] = {"Q6_K", "Q4_K", "Q5_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"};
    constexpr int64_t kBits[] = {6, 4, 5, 8, 4, 4, 5, 5};
    const int64_t type = arrangement - kQ6KBlocks;
    TORCH_CHECK(bits == kBits[type] && LC_SIMD, kNames[type], " blocks are ", kBits[type],
                "-bit codes, read by the vector kernels only");
  }
  const Arrangement file = arrangement >= kQ6KBlocks ? static_cast<Arrangement>(arrangement) : kRowMajor;
  if (bits == 4 || bits == 5) {  // a Q5 block's fifth bit joins its nibbles in registers: u4's layout otherwise
    TORCH_CHECK(group_size == 32, "u4 weights need group_size 32");
    return {true, false, 32, 4, 128, 128, file};
  }
  if (bits == 6) {
    TORCH_CHECK(group_size == 16, "u6 weights need group_size 16");
    return {true, true, 16, 8, 128, 128, file};
  }
  TORCH_CHECK(group_size == 16 || group_size == 32, "u8 weights need group_size 16 or 32");
  TORCH_CHECK(file != kQ8_0Blocks || group_size == 32, "Q8_0 blocks are groups of 32");
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
  int8_t* natural;      // [chunks * chunk_values] codes in natural order (scalar path)
  int8_t* natural2;
  float* block_scales;  // [K / 32]
  float* group_scales;  // [groups + 16]: the activation scale of each weight group (zero-padded)
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
        int_bytes + ((3 * lane_floats + groups + K / kActBlock + groups + 16) * 4 + 63) / 64 * 64;
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

float half_to_float(at::Half h) { return static_cast<float>(h); }

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
  const at::Half* sup;  // K-quant scales: (d, dmin) per 8 groups, 4 halves per block of kGroupBlock groups
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
  inline const at::Half* supers(int r, int64_t b) const {
    return sup + b * sup_block_step + r * (b < full_blocks ? sup_row_step : sup_tail_row_step);
  }
};

// Halves of (d, dmin) per row of a K-quant weight with `groups` groups (one pair per 8 groups).
constexpr int64_t kSupersPerBlock = 4;
inline int64_t super_row(int64_t groups) { return groups / 4; }

// The view of the pass whose first row is n, in a weight of N rows of w_row bytes and `groups` groups. Its scales
// and mins are float16, or with up (K-quant scales: the (d, dmin) pairs) the packed sub-scales and sub-mins (k_params).
inline PassView pass_view(const uint8_t* wp, const void* sp, const void* mp, const at::Half* up, int64_t n,
                          int64_t N, int64_t w_row, int64_t groups, bool interleaved) {
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

#if LC_SIMD
// The sub-scales and sub-mins of n K-quant groups (n even, at most 16) as 16 bytes each, zero past n: the low
// bits from the n bytes at `low` and the top bits from the n / 2 bytes at `top` (k_params, 16 at a time).
inline void k_sub_params(const uint8_t* low, const uint8_t* top, int64_t n, __m128i& scales, __m128i& mins) {
  __m128i lo, hi;
  if (n >= 16) {
    lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(low));
    hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(top));
  } else {
#if LC_VNNI
    lo = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), low);
    hi = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << (n / 2)) - 1), top);
#else
    alignas(16) uint8_t lb[16] = {}, hb[16] = {};
    std::memcpy(lb, low, n);
    std::memcpy(hb, top, n / 2);
    lo = _mm_load_si128(reinterpret_cast<const __m128i*>(lb));
    hi = _mm_load_si128(reinterpret_cast<const __m128i*>(hb));
#endif
  }
  const __m128i nibble = _mm_set1_epi8(0x0F);
  // byte g takes top byte g / 2, its low nibble for even g, its high one for odd g
  const __m128i spread = _mm_shuffle_epi8(hi, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
  const __m128i bits = _mm_blendv_epi8(_mm_and_si128(spread, nibble), _mm_and_si128(_mm_srli_epi16(spread, 4), nibble),
                                       _mm_set1_epi16(static_cast<int16_t>(0xFF00)));
  // (values below 64 never carry into the next byte of the 16-bit shifts)
  scales = _mm_or_si128(_mm_and_si128(lo, nibble), _mm_slli_epi16(_mm_and_si128(bits, _mm_set1_epi8(3)), 4));
  mins = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lo, 4), nibble),
                      _mm_slli_epi16(_mm_and_si128(bits, _mm_set1_epi8(12)), 2));
}

// Row r's sub-scales and sub-mins of a pass's groups g .. g + n (n even; those past the first 16 are left out).
inline void k_sub_params(const PassView& v, int r, int64_t g, int64_t n, __m128i& scales, __m128i& mins) {
  k_sub_params(v.group<uint8_t>(v.s, r, g), v.half_group(v.m, r, g), std::min<int64_t>(n, 16), scales, mins);
}

// Row r's sub-scales (which = 0) or sub-mins (1) of a pass's groups g .. g + n, as k_sub_params gives them.
inline __m128i k_sub_bytes(const PassView& v, int r, int64_t g, int64_t n, int which) {
  __m128i scales, mins;
  k_sub_params(v, r, g, n, scales, mins);
  return which == 0 ? scales : mins;
}
#endif

// pick(precise, symmetric, bits, kq) with each flag as a std::bool_constant and bits as a std::integral_constant:
// the kernel instantiation for a weight (K-quant scales come only with mins, so kq is never instantiated with
// symmetric; u6 holds only Q6_K, which is symmetric without K-quant scales).
template <typename Pick>
auto pick_kernel(bool precise, bool symmetric, int bits, bool kq, Pick pick) {
  using T = std::true_type;
  using F = std::false_type;
  auto with = [&](auto p, auto u) {
    if (symmetric) return pick(p, T{}, u, F{});
    return kq ? pick(p, F{}, u, T{}) : pick(p, F{}, u, F{});
  };
  auto with_bits = [&](auto p) {
    if (bits == 6) {
      TORCH_CHECK(symmetric && !kq, "u6 weights are symmetric, without K-quant scales");
      return pick(p, T{}, std::integral_constant<int, 6>{}, F{});
    }
    return bits == 4 ? with(p, std::integral_constant<int, 4>{}) : with(p, std::integral_constant<int, 8>{});
  };
  return precise ? with_bits(T{}) : with_bits(F{});
}

#if LC_VNNI
// The bytes of a 64-byte chunk that exist, given how many are left in the row (the last chunk may be short).
inline __mmask64 chunk_byte_mask(int64_t left) { return left >= 64 ? ~0ULL : ((1ULL << left) - 1); }

// Lanes of a block of kGroupBlock groups: which of its (d, dmin, d, dmin) halves each group's d and dmin are.
inline __m512i super_lanes(int which) {
  return _mm512_set_epi32(2 + which, 2 + which, 2 + which, 2 + which, 2 + which, 2 + which, 2 + which, 2 + which,
                          which, which, which, which, which, which, which, which);
}

// The (d, dmin) halves of row r's block b (two super-blocks, or one at a short end) as floats.
inline __m512 load_supers(const PassView& v, int r, int64_t b, int64_t groups_left) {
  const __mmask16 mask = groups_left > 8 ? 0xF : 0x3;
  return _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>(mask), v.supers(r, b))));
}

// Row r's K-quant scales d * sub-scale and (positive) mins dmin * sub-min of groups g .. g + n (n even; those past
// the first 16 are left out) as floats: the one place every kernel forms them, so all round them alike.
inline void k_group_params(const PassView& v, int r, int64_t g, int64_t n, __m512& scales, __m512& mins) {
  const __m512 supers = load_supers(v, r, g / kGroupBlock, n);
  __m128i sub_scales, sub_mins;
  k_sub_params(v, r, g, n, sub_scales, sub_mins);
  scales = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_scales)), _mm512_permutexvar_ps(super_lanes(0), supers));
  mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_mins)), _mm512_permutexvar_ps(super_lanes(1), supers));
}

// The 128-bit lane r (0-3) of x.
inline __m128i lane128(__m512i x, int r) {
  switch (r) {
    case 0: return _mm512_castsi512_si128(x);
    case 1: return _mm512_extracti32x4_epi32(x, 1);
    case 2: return _mm512_extracti32x4_epi32(x, 2);
    default: return _mm512_extracti32x4_epi32(x, 3);
  }
}

// k_group_params for all kRowsPerPass rows of an interleaved pass's block b, whose 16 groups are all there: the
// rows' packed sub-scales and sub-mins lie side by side (k_sub_params' unpacking, for four rows in one vector) and
// so do their (d, dmin) halves. Each row's scales and mins come out as k_group_params forms them, bit for bit.
// Unpacking them row by row cost the decode about a third of its instructions on Q4_K weights: measured on the
// Zen 5 EPYC (2026-12-05, one process, alternating), a 14336 x 4096 Q4_K GEMV read 27 -> 34 GB/s on one thread,
// and a whole 8B Q4_K_M decode step took 88.0 -> 76.7 ms on two.
inline void k_pass_params(const PassView& v, int64_t b, __m512* scales, __m512* mins) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_loadu_si512(static_cast<const uint8_t*>(v.s) + b * v.g_block_step);
  // word j of row r's lane: the top byte of groups 2j and 2j + 1; the even group takes its low nibble (the
  // masks below keep only its bits), the odd group its high one
  const __m512i top = _mm512_cvtepu8_epi16(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint8_t*>(v.m) + b * v.g_block_step / 2)));
  const __m512i bits = _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAULL, top, _mm512_slli_epi16(top, 4));
  const __m512i sub_scales =
      _mm512_or_si512(_mm512_and_si512(lo, nibble), _mm512_slli_epi16(_mm512_and_si512(bits, _mm512_set1_epi8(3)), 4));
  const __m512i sub_mins = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), nibble),
                                           _mm512_slli_epi16(_mm512_and_si512(bits, _mm512_set1_epi8(12)), 2));
  // row r's (d, dmin) of its two super-blocks at lanes 4r .. 4r + 3
  const __m512 supers = _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.sup + b * v.sup_block_step)));
  for (int r = 0; r < kRowsPerPass; ++r) {
    const __m512i at = _mm512_set1_epi32(4 * r);
    scales[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane128(sub_scales, r))),
                              _mm512_permutexvar_ps(_mm512_add_epi32(super_lanes(0), at), supers));
    mins[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane128(sub_mins, r))),
                            _mm512_permutexvar_ps(_mm512_add_epi32(super_lanes(1), at), supers));
  }
}

// The K-quant scales and mins of the block of groups from g0 for each of a pass's kRowsPerPass rows (a short pass
// repeats its first row): k_pass_params where an interleaved pass holds the whole block, else row by row.
inline void k_block_params(const PassView& v, int rows, int64_t g0, int64_t groups, __m512* scales, __m512* mins) {
  if (v.holds_block(g0 / kGroupBlock)) {
    k_pass_params(v, g0 / kGroupBlock, scales, mins);
    return;
  }
  for (int r = 0; r < kRowsPerPass; ++r) k_group_params(v, r < rows ? r : 0, g0, groups - g0, scales[r], mins[r]);
}

// acc + the lanes of sum_g min_g * terms_g, 16 groups at a time (the lanes are summed with the rest later). The
// kernels add these to the dot products' lanes from zero (gemv_rows forms a K-quant's as it goes, in this order).
template <bool KQ>
inline __m512 offset_lanes(const PassView& v, int r, const float* terms, int64_t groups, __m512 acc) {
  for (int64_t g = 0; g < groups; g += 16) {
    const int64_t left = groups - g;
    const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    if (KQ) {  // the mins are -dmin * m
      __m512 scales, o;
      k_group_params(v, r, g, left, scales, o);
      acc = _mm512_fnmadd_ps(o, _mm512_maskz_loadu_ps(mask, terms + g), acc);
    } else {
      const __m512 o = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.group<at::Half>(v.m, r, g)));
      acc = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(mask, terms + g), acc);
    }
  }
  return acc;
}

// One activation row (a decode) against kRowsPerPass (or fewer) weight rows: the activation codes and lane
// scales are loaded once per chunk for all of them. An asymmetric weight's mins are applied 16 groups at a time
// after the chunks, into the same accumulator, so they cost no extra reduction.

// One activation row's chunk c, loaded for the dot products: codes (and the second level's), lane scales, and
// the zero-point sums of a symmetric weight.
struct ActivationChunk {
  __m512i a_lo, a_hi, b_lo, b_hi, zsums;
  __m512 lane_scales;
};

template <bool PRECISE, bool SYMMETRIC, int BITS>
inline ActivationChunk load_chunk(const ActivationRow& a, int64_t c, const Layout& L) {
  ActivationChunk k;
  const int8_t* codes = a.codes + c * L.act_chunk_bytes;
  k.a_lo = _mm512_load_si512(codes);
  k.a_hi = BITS != 8 ? _mm512_load_si512(codes + 64) : k.a_lo;
  k.b_lo = k.a_lo;
  k.b_hi = k.a_hi;
  if (PRECISE) {
    const int8_t* codes2 = a.codes2 + c * L.act_chunk_bytes;
    k.b_lo = _mm512_load_si512(codes2);
    k.b_hi = BITS != 8 ? _mm512_load_si512(codes2 + 64) : k.b_lo;
  }
  k.lane_scales = _mm512_load_ps(a.lane_scales + c * 16);
  k.zsums = SYMMETRIC ? _mm512_load_si512(a.lane_zsums + c * 16) : _mm512_setzero_si512();
  return k;
}

// acc + one weight row's chunk (lo/hi: its codes, unpacked) times an activation chunk: the integer dot products
// times sd, the lanes' weight scale x activation scale. Every kernel goes through this with sd = s * lane_scale
// computed the same way, so a (row, row) pair's result is the same in all.
// (accumulate: the same, from the lanes' weight scales s.)
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline __m512 accumulate_scaled(__m512i lo, __m512i hi, __m512 sd, const ActivationChunk& k, __m512 acc) {
  __m512i dot, dot2;
  if (BITS != 8) {
    dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.a_lo), hi, k.a_hi);
    if (PRECISE) dot2 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.b_lo), hi, k.b_hi);
  } else {
    dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.a_lo);
    if (PRECISE) dot2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, k.b_lo);
  }
  if (PRECISE) dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), dot2);
  if (SYMMETRIC) dot = _mm512_sub_epi32(dot, k.zsums);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sd, acc);
}

template <bool PRECISE, bool SYMMETRIC, int BITS>
inline __m512 accumulate(__m512i lo, __m512i hi, __m512 s, const ActivationChunk& k, __m512 acc) {
  return accumulate_scaled<PRECISE, SYMMETRIC, BITS>(lo, hi, _mm512_mul_ps(s, k.lane_scales), k, acc);
}

// The high nibbles of every byte (GFNI: one affine transform that shifts each byte right by 4).
inline __m512i high_nibbles(__m512i raw, __m512i low_mask) {
#if defined(__GFNI__)
  (void)low_mask;
  return _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(0x1020408000000000LL), 0);
#else
  return _mm512_and_si512(_mm512_srli_epi16(raw, 4), low_mask);
#endif
}

#if defined(__GFNI__)
// u6: per 64-bit lane, the affine transforms that move a top-bits byte's pair (0-1, 2-3: the low-nibble vector's
// positions j and 32 + j; 4-5, 6-7: the high-nibble vector's) into bits 4-5, all other bits zero.
inline __m512i top_bits_matrix(int64_t first, int64_t second) {
  return _mm512_set_epi64(second, second, second, second, first, first, first, first);
}
#endif

// 128 six-bit codes from 64 bytes of low nibbles (raw) and the 32 bytes of top bits at `top_bytes`: lo takes
// raw's low nibbles, with bits 0-1 of top byte j at positions j < 32 and bits 2-3 at 32 + j; hi the high nibbles,
// with bits 4-5 and 6-7. A u6 chunk and half a Q6_K block (its ql and qh) are both stored this way.
inline void six_bit_codes(__m512i raw, const uint8_t* top_bytes, __m512i& lo, __m512i& hi) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i top = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(top_bytes)));
#if defined(__GFNI__)
  const __m512i top_lo = _mm512_gf2p8affine_epi64_epi8(top, top_bits_matrix(0x01020000, 0x04080000), 0);
  const __m512i top_hi = _mm512_gf2p8affine_epi64_epi8(top, top_bits_matrix(0x10200000, 0x40800000), 0);
#else
  const __m512i pair = _mm512_set1_epi8(0x30);
  const __m512i top_lo = _mm512_and_si512(_mm512_sllv_epi64(top, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), pair);
  const __m512i top_hi = _mm512_and_si512(_mm512_srlv_epi64(top, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), pair);
#endif
  lo = _mm512_ternarylogic_epi32(raw, low_mask, top_lo, 0xEA);  // (raw & 0x0F) | top_lo
  hi = _mm512_or_si512(high_nibbles(raw, low_mask), top_hi);
}

// The codes of row r's chunk c as the two vectors the dot products take: u4 and u6 a chunk's low and high nibbles
// (u6 with their top two bits from the second plane, whose 64-byte chunks start at chunk top0), u8 the bytes.
template <int BITS>
inline void unpack_chunk(const PassView& v, int r, int64_t c, int64_t top0, __mmask64 byte_mask, __m512i& lo,
                         __m512i& hi) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i raw = _mm512_maskz_loadu_epi8(byte_mask, v.codes(r, c));
  if (BITS == 8) {
    lo = hi = raw;
    return;
  }
  if (BITS == 4) {
    lo = _mm512_and_si512(raw, low_mask);
    hi = high_nibbles(raw, low_mask);
    return;
  }
  six_bit_codes(raw, v.codes(r, top0 + c / 2) + 32 * (c & 1), lo, hi);
}

// Prefetch, for an interleaved u6 pass, the lines of row r's chunk t (its nibbles, and its top bits with an even
// chunk), t counted on into the blocks of the passes that follow (which are contiguous: prefetching past the weight
// is harmless).
inline void prefetch_u6_chunk(const PassView& v, int r, int64_t t, int64_t chunks, int64_t top0, int64_t w_row) {
  const uint8_t* block = v.w;
  for (; t >= chunks; t -= chunks) block += kRowsPerPass * w_row;
  __builtin_prefetch(block + t * v.chunk_step + r * kChunkBytes);
  if ((t & 1) == 0) __builtin_prefetch(block + (top0 + t / 2) * v.chunk_step + r * kChunkBytes);
}

// Per chunk j of a block of kGroupBlock groups, the lanes' group within the block: j * groups_per_chunk +
// lane / (16 / groups_per_chunk).
struct ChunkIndex {
  alignas(64) int32_t lanes[kGroupBlock / 2][16];
  explicit ChunkIndex(int groups_per_chunk) {
    for (int j = 0; j < kGroupBlock / 2; ++j)
      for (int lane = 0; lane < 16; ++lane)
        lanes[j][lane] = std::min(15, j * groups_per_chunk + lane / (16 / groups_per_chunk));
  }
};
const ChunkIndex kChunkIndex2(2), kChunkIndex4(4), kChunkIndex8(8);

inline const ChunkIndex& chunk_index(int groups_per_chunk) {
  return groups_per_chunk == 8 ? kChunkIndex8 : groups_per_chunk == 4 ? kChunkIndex4 : kChunkIndex2;
}

// One activation row (a decode) against kRowsPerPass (or fewer) weight rows: the activation codes are loaded once
// per chunk for all of them. Per block of kGroupBlock groups, each row's weight scales are multiplied by the
// activation scales once (sd), and each chunk picks its lanes from sd with one permute.
template <bool PRECISE, bool SYMMETRIC, int BITS, bool KQ>
void gemv_rows(const PassView& v, int64_t w_row, int64_t groups, int64_t chunks, int64_t weight_bytes,
               const Layout& L, const ActivationRow& a, int rows, float* out) {
  const ChunkIndex& index = chunk_index(L.groups_per_chunk);
  const int64_t ahead = v.interleaved() ? kPrefetchBytes : kPrefetchRows * w_row;
  const int64_t top0 = weight_bytes / kChunkBytes;  // u6: the second plane's first chunk
  const int64_t chunks_per_block = kGroupBlock / L.groups_per_chunk;
  __m512 acc[kRowsPerPass], offsets[kRowsPerPass];  // the dot products' lanes, and (K-quants) the mins'
  for (int r = 0; r < kRowsPerPass; ++r) acc[r] = offsets[r] = _mm512_setzero_ps();
  // the scales and mins of the rows two passes on (a pass's scales are contiguous in both layouts)
  constexpr int64_t param_bytes = KQ ? 1 : 2;
  const int64_t min_bytes = KQ ? groups / 2 : groups * param_bytes;  // a row's (K-quants: half as wide)
  for (int64_t b = 0; b < rows * groups * param_bytes; b += 64) {
    __builtin_prefetch(static_cast<const char*>(v.s) + kPrefetchRows * groups * param_bytes + b);
  }
  for (int64_t b = 0; !SYMMETRIC && b < rows * min_bytes; b += 64) {
    __builtin_prefetch(static_cast<const char*>(v.m) + kPrefetchRows * min_bytes + b);
  }
  for (int64_t b = 0; KQ && b < rows * super_row(groups) * 2; b += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(v.sup + kPrefetchRows * super_row(groups)) + b);
  }
  for (int64_t c0 = 0; c0 < chunks; c0 += chunks_per_block) {
    const int64_t g0 = c0 * L.groups_per_chunk, left = groups - g0;
    const __mmask16 group_mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const __m512 da = _mm512_loadu_ps(a.group_scales + g0);  // zero past the last group
    __m512 sd[kRowsPerPass];
    if (KQ) {  // d * sub-scale, then times the activation scale; the mins' lanes as offset_lanes forms them
      __m512 scales[kRowsPerPass], o[kRowsPerPass];
      k_block_params(v, rows, g0, groups, scales, o);
      const __m512 terms = _mm512_maskz_loadu_ps(group_mask, a.group_terms + g0);
      for (int r = 0; r < rows; ++r) {
        sd[r] = _mm512_mul_ps(scales[r], da);
        offsets[r] = _mm512_fnmadd_ps(o[r], terms, offsets[r]);
      }
    } else {
      for (int r = 0; r < rows; ++r) {
        sd[r] = _mm512_mul_ps(
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(group_mask, v.group<at::Half>(v.s, r, g0))), da);
      }
    }
    const int64_t c1 = std::min(chunks, c0 + chunks_per_block);
    for (int64_t c = c0; c < c1; ++c) {
      const __mmask64 byte_mask = chunk_byte_mask(weight_bytes - c * kChunkBytes);
      const __m512i lanes = _mm512_load_si512(index.lanes[c - c0]);
      const ActivationChunk chunk = load_chunk<PRECISE, SYMMETRIC, BITS>(a, c, L);
      for (int r = 0; r < rows; ++r) {
        // this chunk kPrefetchBytes on in an interleaved stream (u6: kPrefetchChunks chunks on), else two passes
        // on; u6's top bits every other chunk
        if (BITS == 6 && v.interleaved()) {
          prefetch_u6_chunk(v, r, c + kPrefetchChunks, chunks, top0, w_row);
        } else {
          __builtin_prefetch(v.codes(r, c) + ahead);
          if (BITS == 6 && (c & 1) == 0) __builtin_prefetch(v.codes(r, top0 + c / 2) + ahead);
        }
        __m512i lo, hi;
        unpack_chunk<BITS>(v, r, c, top0, byte_mask, lo, hi);
        acc[r] = accumulate_scaled<PRECISE, SYMMETRIC, BITS>(lo, hi, _mm512_permutexvar_ps(lanes, sd[r]), chunk, acc[r]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    if (!SYMMETRIC && !KQ) offsets[r] = offset_lanes<KQ>(v, r, a.group_terms, groups, offsets[r]);
    out[r] = _mm512_reduce_add_ps(SYMMETRIC ? acc[r] : _mm512_add_ps(acc[r], offsets[r]));
  }
}

// Chunk c of a pass's kRowsPerPass weight rows (lo/hi: their codes, unpacked; s: their lanes' weight scales) against
// activation rows acts[0 .. mt), into their accumulators acc[t * kRowsPerPass + r]. Every panel kernel (this file's
// and the file blocks') runs its chunks through this.
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline void panel_chunk(const __m512i lo[], const __m512i hi[], const __m512 s[], const ActivationRow* acts,
                        int64_t mt, int64_t c, const Layout& L, __m512* acc) {
  for (int64_t t = 0; t < mt; ++t) {
    const ActivationChunk chunk = load_chunk<PRECISE, SYMMETRIC, BITS>(acts[t], c, L);
    __m512* row_acc = acc + t * kRowsPerPass;
    for (int r = 0; r < kRowsPerPass; ++r) row_acc[r] = accumulate<PRECISE, SYMMETRIC, BITS>(lo[r], hi[r], s[r], chunk, row_acc[r]);
  }
}

// A block of activation rows against kRowsPerPass weight rows, for batches and prefill chunks: each weight chunk
// is unpacked into registers once and meets every row of the block, whose accumulators live in `scratch` (L1,
// kRowsPerPass vectors per row). Per (activation row, weight row) pair it runs gemv_rows' operations in the
// same order, so its results equal a decode's bit for bit.
template <bool PRECISE, bool SYMMETRIC, int BITS, bool KQ>
void panel_dots(const PassView& v, int64_t groups, int64_t chunks, int64_t weight_bytes, const Layout& L,
                const ActivationRow* acts, int64_t mt, int rows, float* out, int64_t out_stride, void* scratch) {
  const int64_t top0 = weight_bytes / kChunkBytes;
  __m512* acc = static_cast<__m512*>(scratch);
  alignas(64) int32_t index_values[16];  // each lane's group within the chunk
  for (int lane = 0; lane < 16; ++lane) index_values[lane] = lane / (16 / L.groups_per_chunk);
  const __m512i scale_index = _mm512_load_si512(index_values);
  const ChunkIndex& index = chunk_index(L.groups_per_chunk);  // K-quants: each lane's group within the block
  const int64_t chunks_per_block = kGroupBlock / L.groups_per_chunk;
  __m512 block_scales[kRowsPerPass];  // K-quants: d * sub-scale of the block's groups, as gemv_rows forms them
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t offset = c * kChunkBytes;
    if (KQ && c % chunks_per_block == 0) {
      __m512 mins[kRowsPerPass];
      k_block_params(v, rows, c * L.groups_per_chunk, groups, block_scales, mins);
    }
    const __mmask64 byte_mask = chunk_byte_mask(weight_bytes - offset);
    const int64_t first_group = c * L.groups_per_chunk;
    const __mmask8 scale_mask = static_cast<__mmask8>(
        (1u << std::min<int64_t>(L.groups_per_chunk, groups - first_group)) - 1);
    __m512i lo[kRowsPerPass], hi[kRowsPerPass];
    __m512 s[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) {
      const int rr = r < rows ? r : 0;  // a short pass repeats its first row (results not stored)
      unpack_chunk<BITS>(v, rr, c, top0, byte_mask, lo[r], hi[r]);
      if (KQ) {
        s[r] = _mm512_permutexvar_ps(_mm512_load_si512(index.lanes[c % chunks_per_block]), block_scales[r]);
      } else {
        s[r] = _mm512_permutexvar_ps(scale_index, _mm512_castps256_ps512(_mm256_cvtph_ps(
            _mm_maskz_loadu_epi16(scale_mask, v.group<at::Half>(v.s, rr, first_group)))));
      }
    }
    panel_chunk<PRECISE, SYMMETRIC, BITS>(lo, hi, s, acts, mt, c, L, acc);
  }
  for (int64_t t = 0; t < mt; ++t) {
    for (int r = 0; r < rows; ++r) {
      const __m512 sum = acc[t * kRowsPerPass + r];
      const __m512 total =
          SYMMETRIC ? sum : _mm512_add_ps(sum, offset_lanes<KQ>(v, r, acts[t].group_terms, groups, _mm512_setzero_ps()));
      out[t * out_stride + r] = _mm512_reduce_add_ps(total);
    }
  }
}

// Bytes of accumulators panel_dots needs per activation row.
constexpr int64_t kPanelScratchPerRow = kRowsPerPass * sizeof(__m512);

#endif
#include "quant_linear_avx2.h"
#include "quant_q6k.h"
#include "quant_k_blocks.h"
#include "quant_q8_0.h"
#include "quant_q4_q5_blocks.h"
#if LC_SIMD

// Activation rows per panel: their accumulators (8 KiB) stay in L1 beside the streaming codes.
constexpr int64_t kPanelRows = 32;

using PanelFn = void (*)(const PassView&, int64_t, int64_t, int64_t, const Layout&, const ActivationRow*, int64_t,
                         int, float*, int64_t, void*);

// The kernel for a weight of layout L (the file's blocks take their own).
PanelFn pick_panel(bool precise, bool symmetric, bool kq, const Layout& L) {
  if (L.file == kQ6KBlocks) return precise ? panel_q6k<true> : panel_q6k<false>;
  if (L.file == kQ8_0Blocks) return precise ? panel_q8_0<true> : panel_q8_0<false>;
  if (L.file == kQ4_0Blocks) return precise ? panel_q4<true, false, false> : panel_q4<false, false, false>;
  if (L.file == kQ4_1Blocks) return precise ? panel_q4<true, true, false> : panel_q4<false, true, false>;
  if (L.file == kQ5_0Blocks) return precise ? panel_q4<true, false, true> : panel_q4<false, false, true>;
  if (L.file == kQ5_1Blocks) return precise ? panel_q4<true, true, true> : panel_q4<false, true, true>;
  if (L.k_blocks()) return pick_k_blocks(precise, L, panel_k_blocks<true, 4>, panel_k_blocks<false, 4>,
                                         panel_k_blocks<true, 5>, panel_k_blocks<false, 5>);
  return pick_kernel(precise, symmetric, L.bits(), kq, [](auto p, auto s, auto u, auto k) -> PanelFn {
    return panel_dots<decltype(p)::value, decltype(s)::value, decltype(u)::value, decltype(k)::value>;
  });
}

using GemvFn = void (*)(const PassView&, int64_t, int64_t, int64_t, int64_t, const Layout&, const ActivationRow&,
                        int, float*);

GemvFn pick_gemv(bool precise, bool symmetric, bool kq, const Layout& L) {
  if (L.file == kQ6KBlocks) return precise ? gemv_q6k<true> : gemv_q6k<false>;
  if (L.file == kQ8_0Blocks) return precise ? gemv_q8_0<true> : gemv_q8_0<false>;
  if (L.file == kQ4_0Blocks) return precise ? gemv_q4<true, false, false> : gemv_q4<false, false, false>;
  if (L.file == kQ4_1Blocks) return precise ? gemv_q4<true, true, false> : gemv_q4<false, true, false>;
  if (L.file == kQ5_0Blocks) return precise ? gemv_q4<true, false, true> : gemv_q4<false, false, true>;
  if (L.file == kQ5_1Blocks) return precise ? gemv_q4<true, true, true> : gemv_q4<false, true, true>;
  if (L.k_blocks()) return pick_k_blocks(precise, L, gemv_k_blocks<true, 4>, gemv_k_blocks<false, 4>,
                                         gemv_k_blocks<true, 5>, gemv_k_blocks<false, 5>);
  return pick_kernel(precise, symmetric, L.bits(), kq, [](auto p, auto s, auto u, auto k) -> GemvFn {
    return gemv_rows<decltype(p)::value, decltype(s)::value, decltype(u)::value, decltype(k)::value>;
  });
}

#endif

// sum_g offsets[g] * terms[g]: an asymmetric weight's mins on the portable path.
float offset_dot(const float* offsets, const float* terms, int64_t groups) {
  float sum = 0.f;
  for (int64_t g = 0; g < groups; ++g) sum += offsets[g] * terms[g];
  return sum;
}

// A K-quant weight's scales d * sub-scale and mins -dmin * m as float32 [rows, groups] each (row-major).
std::pair<torch::Tensor, torch::Tensor> k_scales_as_floats(const torch::Tensor& sub_scales, const torch::Tensor& sub_mins,
                                                           const torch::Tensor& supers) {
  const int64_t rows = sub_scales.size(0), groups = sub_scales.size(1);
  torch::Tensor scales = torch::empty({rows, groups}, torch::kFloat), mins = torch::empty({rows, groups}, torch::kFloat);
  const uint8_t* sc = sub_scales.data_ptr<uint8_t>();
  const uint8_t* mn = sub_mins.data_ptr<uint8_t>();  // top bits: two groups a byte
  const at::Half* up = supers.data_ptr<at::Half>();
  float* so = scales.data_ptr<float>();
  float* mo = mins.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const at::Half* pair = up + r * super_row(groups) + (g / 8) * 2;
        int scale, min;
        k_params(sc[r * groups + g], k_top_nibble(mn[(r * groups + g) / 2], g), scale, min);
        so[r * groups + g] = static_cast<float>(scale) * half_to_float(pair[0]);
        mo[r * groups + g] = -(static_cast<float>(min) * half_to_float(pair[1]));
      }
    }
  });
  return {scales, mins};
}

// Code n of a u6 row of K weights (packed_weight.py's pack_u6).
inline int u6_code(const uint8_t* row, int64_t K, int64_t n) {
  const int64_t chunk = n / 128, within = n % 128, i = within % 16;
  const int64_t position = within / 16 * 8 + i % 8;  // in the chunk's low- or high-nibble vector
  const int nibble = (row[n / 16 * 8 + i % 8] >> (i < 8 ? 0 : 4)) & 0x0F;
  const int pair = 2 * (i < 8 ? 0 : 2) + 2 * static_cast<int>(position / 32);
  return nibble | (((row[K / 2 + chunk * 32 + position % 32] >> pair) & 3) << 4);
}

// The 128 codes of chunk c of a u6 row of K weights: u6_code for n = 128 c .. 128 c + 127, without its
// per-code index arithmetic (each low-nibble byte holds codes i and i + 8 of a 16-code run).
inline void u6_chunk_codes(const uint8_t* row, int64_t K, int64_t c, uint8_t* codes) {
  const uint8_t* low = row + c * 64;
  const uint8_t* high = row + K / 2 + c * 32;
  for (int p = 0; p < 64; ++p) {
    const int shift = (p >> 5) * 2, at = (p >> 3) * 16 + (p & 7);
    codes[at] = static_cast<uint8_t>((low[p] & 0x0F) | (((high[p & 31] >> shift) & 3) << 4));
    codes[at + 8] = static_cast<uint8_t>((low[p] >> 4) | (((high[p & 31] >> (4 + shift)) & 3) << 4));
  }
}

// Portable path: the same arithmetic, one group at a time (w: the row of K weights).
int32_t group_dot_scalar(const uint8_t* w, int64_t K, const int8_t* q, int64_t g, const Layout& L) {
  int32_t dot = 0;
  if (L.u6) {
    for (int i = 0; i < L.group_size; ++i) dot += u6_code(w, K, g * L.group_size + i) * q[i];
  } else if (L.nibbles) {
    const uint8_t* b = w + g * 16;
    for (int i = 0; i < 16; ++i) dot += (b[i] & 0x0F) * q[i] + (b[i] >> 4) * q[i + 16];
  } else {
    const uint8_t* b = w + g * L.group_size;
    for (int i = 0; i < L.group_size; ++i) dot += b[i] * q[i];
  }
  return dot;
}

float row_dot_scalar(const uint8_t* w, const float* scales, int64_t groups, const Layout& L, bool precise,
                     int32_t zero_point, const ActivationRow& a) {
  float sum = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t K = groups * L.group_size;
    int32_t dot = group_dot_scalar(w, K, a.natural + g * L.group_size, g, L);
    if (precise) dot = dot * 256 + group_dot_scalar(w, K, a.natural2 + g * L.group_size, g, L);
    if (zero_point) {
      int32_t codes = 0;
      for (int i = 0; i < L.group_size; ++i) {
        const int64_t k = g * L.group_size + i;
        codes += precise ? 256 * a.natural[k] + a.natural2[k] : a.natural[k];
      }
      dot -= zero_point * codes;
    }
    const float da = a.block_scales[g * L.group_size / kActBlock];
    sum += scales[g] * da * static_cast<float>(dot);
  }
  return sum;
}

// Interleave (back=false) or restore (back=true) the rows of a 2-D contiguous uint8 or float16 tensor in place,
// `unit` elements at a time (64 for codes, kGroupBlock for scales and mins).
void interleave_rows_inplace(torch::Tensor& t, int64_t unit, bool back) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), "interleave_rows: a contiguous 2-D tensor");
  const int64_t blocks = t.size(0) / kRowsPerPass, width = t.size(1);
  auto run = [&](auto* base) {
    using T = std::remove_pointer_t<decltype(base)>;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> scratch(kRowsPerPass * width);
      for (int64_t b = begin; b < end; ++b) interleave_block(base + b * kRowsPerPass * width, width, unit, back, scratch.data());
    });
  };
  if (t.scalar_type() == torch::kUInt8) run(t.data_ptr<uint8_t>());
  else if (t.scalar_type() == torch::kHalf) run(t.data_ptr<at::Half>());
  else TORCH_CHECK(false, "interleave_rows: uint8 or float16");
}

}  // namespace

// A PackedWeight's tensors in the interleaved layout (back=false) or back to row-major (back=true), in place.
void interleave_weight(torch::Tensor qweight, torch::Tensor scales, const c10::optional<torch::Tensor>& mins,
                       const c10::optional<torch::Tensor>& supers, bool back) {
  interleave_rows_inplace(qweight, kChunkBytes, back);
  interleave_rows_inplace(scales, kGroupBlock, back);
  const bool k_scales = supers.has_value() && supers->defined();
  if (mins.has_value() && mins->defined()) {
    torch::Tensor m = *mins;
    interleave_rows_inplace(m, k_scales ? kGroupBlock / 2 : kGroupBlock, back);  // K-quant mins: half as wide
  }
  if (supers.has_value() && supers->defined()) {
    torch::Tensor u = *supers;
    interleave_rows_inplace(u, kSupersPerBlock, back);
  }
}

namespace {

// A packed weight's tensors as the kernels read them, checked; row-major copies when `restore` (the portable
// path and dequantize read rows one by one).
struct WeightArgs {
  torch::Tensor qweight, scales, mins, supers;
  bool has_mins = false, k_scales = false;

  WeightArgs(const torch::Tensor& q, const torch::Tensor& s, const c10::optional<torch::Tensor>& m,
             const c10::optional<torch::Tensor>& u, bool restore)
      : qweight(q), scales(s) {
    has_mins = m.has_value() && m->defined();
    k_scales = u.has_value() && u->defined();
    if (has_mins) mins = *m;
    if (k_scales) supers = *u;
    if (restore) {
      qweight = qweight.clone();
      scales = scales.clone();
      c10::optional<torch::Tensor> mc, uc;
      if (has_mins) mc = mins = mins.clone();
      if (k_scales) uc = supers = supers.clone();
      interleave_weight(qweight, scales, mc, uc, true);
    }
    TORCH_CHECK(qweight.scalar_type() == torch::kUInt8 && qweight.is_contiguous(), "qweight must be contiguous uint8");
    const auto param_type = k_scales ? torch::kUInt8 : torch::kHalf;
    TORCH_CHECK(scales.scalar_type() == param_type && scales.is_contiguous(),
                k_scales ? "K-quant sub-scales must be contiguous uint8" : "scales must be contiguous float16");
    if (has_mins && !k_scales) {
      TORCH_CHECK(mins.scalar_type() == param_type && mins.is_contiguous() && mins.sizes() == scales.sizes(),
                  "mins must be contiguous, typed and shaped like scales");
    }
    if (k_scales) {
      TORCH_CHECK(has_mins, "K-quant scales come with mins");
      TORCH_CHECK(mins.scalar_type() == torch::kUInt8 && mins.is_contiguous() && mins.dim() == 2 &&
                      mins.size(0) == scales.size(0) && mins.size(1) * 2 == scales.size(1),
                  "K-quant mins must be contiguous uint8 [rows, groups / 2]");
      TORCH_CHECK(scales.size(1) % 8 == 0 && supers.scalar_type() == torch::kHalf && supers.is_contiguous() &&
                      supers.size(0) == scales.size(0) && supers.size(1) == super_row(scales.size(1)),
                  "supers must be contiguous float16 [rows, groups / 4] ((d, dmin) per 8 groups)");
    }
  }

  // scales and mins as float arrays the portable path indexes (K-quants: d * sub-scale and -dmin * m)
  std::pair<torch::Tensor, torch::Tensor> float_params() const {
    if (k_scales) return k_scales_as_floats(scales, mins, supers);
    return {scales.to(torch::kFloat), has_mins ? mins.to(torch::kFloat) : torch::Tensor()};
  }
};

}  // namespace

// x: [M, K] float32 (other float types are converted); returns float32 [M, N].
// With silu_and_mul, x is [M, 2K] = [gate | up] and the product silu(gate) * up is what gets multiplied.
// arrangement: how the weight's rows are stored (Arrangement: row-major, interleaved, Q6_K blocks). supers: a
// K-quant weight's (d, dmin) per 8 groups, its scales and mins then being the packed 6-bit sub-scales and sub-mins
// (k_params).
torch::Tensor quant_linear(const torch::Tensor& x_in, const torch::Tensor& qweight_in, const torch::Tensor& scales_in,
                           const c10::optional<torch::Tensor>& mins_in, const c10::optional<torch::Tensor>& supers_in,
                           const c10::optional<torch::Tensor>& bias, int64_t bits, int64_t group_size,
                           int64_t zero_point, bool precise, bool silu_and_mul, bool use_simd, int64_t arrangement) {
  const Layout L = make_layout(bits, group_size, arrangement);
  TORCH_CHECK(x_in.dim() == 2, "x must be 2-D");
  if (silu_and_mul) {
    const torch::Tensor gate_up = x_in.to(torch::kFloat).contiguous();
    const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
    torch::Tensor product = torch::empty({rows, width}, torch::kFloat);
    const float* src = gate_up.data_ptr<float>();
    float* dst = product.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        const float* gate = src + m * 2 * width;
        ::silu_and_mul(gate, gate + width, dst + m * width, width);
      }
    });
    return quant_linear(product, qweight_in, scales_in, mins_in, supers_in, bias, bits, group_size, zero_point, precise,
                        false, use_simd, arrangement);
  }
  const bool simd = LC_SIMD && use_simd;
  TORCH_CHECK(simd || !L.file_blocks(), "the file's blocks are read by the vector kernels only");
  bool interleaved = arrangement == kInterleaved;
  const WeightArgs w(qweight_in, scales_in, mins_in, supers_in, interleaved && !simd);
  if (!simd) interleaved = false;
  const torch::Tensor x = x_in.to(torch::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.qweight.size(0);
  TORCH_CHECK(K % kActBlock == 0, "in_features must be a multiple of 32");
  TORCH_CHECK(!L.u6 || K % 128 == 0, "u6 weights need in_features a multiple of 128");
  TORCH_CHECK(w.qweight.size(1) == L.row_bytes(K), "qweight does not match in_features");
  const int64_t groups = K / L.group_size;
  TORCH_CHECK(w.scales.size(0) == N && (L.file_blocks() || w.scales.size(1) == groups), "scales shape mismatch");
  const bool has_mins = w.has_mins;
  const int64_t chunks = (K + L.chunk_values - 1) / L.chunk_values;

  ActivationBuffers buffers(M, K, L);
  std::vector<ActivationRow>& rows = buffers.rows;
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      quantize_row(xp + m * K, K, L, chunks, precise, has_mins ? 0 : static_cast<int32_t>(zero_point), rows[m]);
    }
  });

  torch::Tensor out = torch::empty({M, N}, torch::kFloat);
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.qweight.data_ptr<uint8_t>();
  const int64_t w_row = w.qweight.size(1);
  const int32_t symmetric_zero = has_mins ? 0 : static_cast<int32_t>(zero_point);
  const float* bp = nullptr;
  torch::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    bias_f = bias->to(torch::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == N, "bias must have out_features elements");
    bp = bias_f.data_ptr<float>();
  }

#if LC_SIMD
  if (simd) {
    const void* sp = w.scales.data_ptr();
    const void* mp = has_mins ? w.mins.data_ptr() : nullptr;
    const at::Half* up = w.k_scales ? w.supers.data_ptr<at::Half>() : nullptr;
    const int64_t weight_bytes = L.code_bytes(K);
    const int64_t passes = (N + kRowsPerPass - 1) / kRowsPerPass;
    if (M == 1) {
      const GemvFn gemv = pick_gemv(precise, !has_mins, w.k_scales, L);
      at::parallel_for(0, passes, 8, [&](int64_t begin, int64_t end) {
        for (int64_t pass = begin; pass < end; ++pass) {
          const int64_t n = pass * kRowsPerPass;
          const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
          float dots[kRowsPerPass];
          gemv(pass_view(wp, sp, mp, up, n, N, w_row, groups, interleaved), w_row, groups, chunks,
               weight_bytes, L, rows[0], count, dots);
          for (int r = 0; r < count; ++r) op[n + r] = bp ? dots[r] + bp[n + r] : dots[r];
        }
      });
      return out;
    }
    const PanelFn panel = pick_panel(precise, !has_mins, w.k_scales, L);
    // blocked for the caches: a band of weight rows (about 256 KiB, in L2) meets the activations in blocks of
    // kPanelRows rows (their accumulators in L1), pass by pass
    const int64_t band = std::max<int64_t>(1, (int64_t{256} << 10) / (kRowsPerPass * w_row));
    at::parallel_for(0, passes, 1, [&](int64_t begin, int64_t end) {
      // 64-byte aligned (new of an over-aligned type): the accumulators are vectors
      struct alignas(64) Line { uint8_t bytes[64]; };
      std::vector<Line> scratch(kPanelRows * kPanelScratchPerRow / sizeof(Line));
      float dots[kPanelRows * kRowsPerPass];
      for (int64_t band_begin = begin; band_begin < end; band_begin += band) {
        const int64_t band_end = std::min(end, band_begin + band);
        for (int64_t m0 = 0; m0 < M; m0 += kPanelRows) {
          const int64_t mt = std::min<int64_t>(M - m0, kPanelRows);
          for (int64_t pass = band_begin; pass < band_end; ++pass) {
            const int64_t n = pass * kRowsPerPass;
            const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n));
            panel(pass_view(wp, sp, mp, up, n, N, w_row, groups, interleaved), groups, chunks,
                  weight_bytes, L, rows.data() + m0, mt, count, dots, kRowsPerPass, scratch.data());
            for (int64_t t = 0; t < mt; ++t) {
              float* o = op + (m0 + t) * N + n;
              for (int r = 0; r < count; ++r) o[r] = bp ? dots[t * kRowsPerPass + r] + bp[n + r] : dots[t * kRowsPerPass + r];
            }
          }
        }
      }
    });
    return out;
  }
#endif
  const auto [scales_f, mins_f] = w.float_params();
  const float* sp = scales_f.data_ptr<float>();
  const float* mp = has_mins ? mins_f.data_ptr<float>() : nullptr;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* wr = wp + n * w_row;
      for (int64_t m = 0; m < M; ++m) {
        float v = row_dot_scalar(wr, sp + n * groups, groups, L, precise, symmetric_zero, rows[m]);
        if (has_mins) v += offset_dot(mp + n * groups, rows[m].group_terms, groups);
        if (bp) v += bp[n];
        op[m * N + n] = v;
      }
    }
  });
  return out;
}

// The vector kernels compiled in: "avx512-vnni", "avx2", or "" (the portable path).
std::string simd_isa() { return LC_VNNI ? "avx512-vnni" : LC_AVX2 ? "avx2" : ""; }

namespace {

#if LC_VNNI
// u6_chunk_codes with AVX-512: the low nibbles of 64 bytes, the top bits of 32 (bits 2q, 2q + 1 for code i of
// byte p < 32, bits 2q + 2, 2q + 3 for p >= 32; q = 0 for the low nibble, 2 for the high), then each 8-code run
// of the low-nibble codes followed by the same run of the high-nibble codes.
inline void u6_chunk_codes_avx512(const uint8_t* row, int64_t K, int64_t c, uint8_t* codes) {
  const __m512i low = _mm512_loadu_si512(row + c * 64);
  const __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + K / 2 + c * 32)));
  const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);  // 0 for p < 32, 2 after
  const __m512i top_low = _mm512_and_si512(_mm512_srlv_epi16(high, shift), two);
  const __m512i top_high = _mm512_and_si512(_mm512_srlv_epi16(high, _mm512_add_epi16(shift, _mm512_set1_epi16(4))), two);
  const __m512i a = _mm512_or_si512(_mm512_and_si512(low, nibble), _mm512_slli_epi16(top_low, 4));
  const __m512i b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble), _mm512_slli_epi16(top_high, 4));
  _mm512_storeu_si512(codes, _mm512_permutex2var_epi64(a, _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), b));
  _mm512_storeu_si512(codes + 64, _mm512_permutex2var_epi64(a, _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4), b));
}


// The 128 codes of chunk c of a row of 6-bit codes in natural order, from u6's planes or a row of Q6_K blocks.
inline void u6_chunk_values(const uint8_t* row, int64_t K, int64_t c, const Layout& L, uint8_t* codes) {
  if (L.file == kQ6KBlocks) q6k_natural_codes(row, c, codes);
  else u6_chunk_codes_avx512(row, K, c, codes);
}

#endif

// One row of K weights as floats: row-major codes (row: the row's bytes), each group's float scale, and its min
// (mins, asymmetric types) or the zero point, as PackedWeight.dequantize computes them: code * scale + min, or
// (code - zero_point) * scale.
#if LC_VNNI
// With AVX-512, 16 values at a time: the scalar loop's operations (code * scale + min, fused as GCC fuses the
// scalar's, or (code - zero point) * scale) in vector registers.
// 16 codes of group g as values: code * scale + min (fused), or (code - zero point) * scale without mins.
inline __m512 code_values(__m128i codes, const float* scales, const float* mins, int64_t g, __m512 zp) {
  const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes));
  const __m512 scale = _mm512_set1_ps(scales[g]);
  return mins ? _mm512_fmadd_ps(c, scale, _mm512_set1_ps(mins[g])) : _mm512_mul_ps(_mm512_sub_ps(c, zp), scale);
}

void dequantize_row(const uint8_t* row, const float* scales, const float* mins, int64_t zero_point, const Layout& L,
                    int64_t K, float* out) {
  const int64_t groups = K / L.group_size;
  const __m512 zp = _mm512_set1_ps(static_cast<float>(zero_point));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  auto put = [&](float* o, __m128i codes, int64_t g) { _mm512_storeu_ps(o, code_values(codes, scales, mins, g, zp)); };
  alignas(64) uint8_t chunk[128];
  for (int64_t g = 0; g < groups; ++g) {
    float* o = out + g * L.group_size;
    if (L.u6) {
      const int64_t first = g * L.group_size;
      if (first % 128 == 0) u6_chunk_values(row, K, first / 128, L, chunk);
      put(o, _mm_load_si128(reinterpret_cast<const __m128i*>(chunk + first % 128)), g);
    } else if (L.nibbles) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16));
      put(o, _mm_and_si128(b, nibble), g);
      put(o + 16, _mm_and_si128(_mm_srli_epi16(b, 4), nibble), g);
    } else {
      for (int i = 0; i < L.group_size; i += 16) {
        put(o + i, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * L.group_size + i)), g);
      }
    }
  }
}
#if defined(__AVX512BF16__)
// dequantize_row's values rounded to bfloat16 (as to_bfloat16 rounds them), written 32 at a time: the same fused
// multiply-adds, without the float32 row in between.
void dequantize_row_bf16(const uint8_t* row, const float* scales, const float* mins, int64_t zero_point,
                         const Layout& L, int64_t K, at::BFloat16* out) {
  const __m512 zp = _mm512_set1_ps(static_cast<float>(zero_point));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  auto value = [&](__m128i codes, int64_t g) { return code_values(codes, scales, mins, g, zp); };
  auto put = [&](at::BFloat16* o, __m512 first, __m512 second) {
    const __m512bh v = _mm512_cvtne2ps_pbh(second, first);
    _mm512_storeu_si512(o, reinterpret_cast<const __m512i&>(v));
  };
  alignas(64) uint8_t chunk[128];
  const int64_t g16 = L.group_size == 16 ? 1 : 0;  // 32 values: one group of 32 or two of 16
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t g = k / L.group_size;
    if (L.u6) {
      if (k % 128 == 0) u6_chunk_values(row, K, k / 128, L, chunk);
      const uint8_t* b = chunk + k % 128;
      put(out + k, value(_mm_load_si128(reinterpret_cast<const __m128i*>(b)), g),
          value(_mm_load_si128(reinterpret_cast<const __m128i*>(b + 16)), g + 1));
    } else if (L.nibbles) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
      put(out + k, value(_mm_and_si128(b, nibble), g), value(_mm_and_si128(_mm_srli_epi16(b, 4), nibble), g));
    } else {
      put(out + k, value(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)), g),
          value(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16)), g + g16));
    }
  }
}
#endif
#else
// The 128 codes of chunk c of a row of 6-bit codes in natural order, from u6's planes or a row of Q6_K blocks
// (half c % 2 of block c / 2: code j < 64 is ql[j]'s low nibble, 64 + j its high one, with bits 2q, 2q + 1 of
// qh[j % 32] on top for code 32q + j % 32).
inline void u6_chunk_values(const uint8_t* row, int64_t K, int64_t c, const Layout& L, uint8_t* codes) {
  if (L.file != kQ6KBlocks) {
    u6_chunk_codes(row, K, c, codes);
    return;
  }
  const uint8_t* ql = row + c / 2 * kQ6KBytes + 64 * (c % 2);
  const uint8_t* qh = row + c / 2 * kQ6KBytes + kQ6KHighBits + 32 * (c % 2);
  for (int j = 0; j < 128; ++j) {
    const int nibble = j < 64 ? ql[j] & 0x0F : ql[j - 64] >> 4;
    codes[j] = static_cast<uint8_t>(nibble | (((qh[j % 32] >> (2 * (j / 32))) & 3) << 4));
  }
}

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
#endif

}  // namespace

torch::Tensor dequantize_rows(const torch::Tensor& qweight, const torch::Tensor& scales,
                              const c10::optional<torch::Tensor>& mins_in,
                              const c10::optional<torch::Tensor>& supers_in, int64_t bits, int64_t group_size,
                              int64_t zero_point, int64_t arrangement, const torch::Tensor& rows_in);

// The dense float32 weight [N, K] (for large batches, where one float GEMM beats per-row integer dots).
torch::Tensor dequantize(const torch::Tensor& qweight_in, const torch::Tensor& scales_in,
                         const c10::optional<torch::Tensor>& mins_in, const c10::optional<torch::Tensor>& supers_in,
                         int64_t bits, int64_t group_size, int64_t zero_point, int64_t arrangement) {
  const Layout L = make_layout(bits, group_size, arrangement);
  if (L.file_blocks()) {  // the scales are in the blocks: every row through the row lookup
    return dequantize_rows(qweight_in, scales_in, mins_in, supers_in, bits, group_size, zero_point, arrangement,
                           torch::arange(qweight_in.size(0)));
  }
  const WeightArgs w(qweight_in, scales_in, mins_in, supers_in, arrangement == kInterleaved);
  const int64_t N = w.qweight.size(0), K = L.in_features(w.qweight.size(1)), groups = K / group_size;
  torch::Tensor out = torch::empty({N, K}, torch::kFloat);
  const auto [scales_f, mins_f] = w.float_params();
  const uint8_t* wp = w.qweight.data_ptr<uint8_t>();
  const float* sp = scales_f.data_ptr<float>();
  const float* mp = w.has_mins ? mins_f.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      dequantize_row(wp + n * w.qweight.size(1), sp + n * groups, mp ? mp + n * groups : nullptr, zero_point, L, K,
                     op + n * K);
    }
  });
  return out;
}

// Row n of a packed weight (either layout) as floats: its codes gathered into `codes` (w_row bytes), its scales and
// mins into `row_scales`/`row_mins` (groups each), then PackedWeight.dequantize's values into out (K floats).
struct RowRestorer {
  const WeightArgs& w;
  const Layout& L;
  int64_t N, w_row, K, groups, zero_point;
  bool interleaved;
  bool with_mins;  // asymmetric: mins in the weight's tensors, or in its K-quant blocks
  std::vector<uint8_t> codes;
  std::vector<float> row_scales, row_mins;

  RowRestorer(const WeightArgs& args, const Layout& layout, int64_t zp, bool inter)
      : w(args), L(layout), N(args.qweight.size(0)), w_row(args.qweight.size(1)), K(layout.in_features(w_row)),
        groups(K / layout.group_size), zero_point(zp), interleaved(inter), with_mins(args.has_mins || layout.block_mins()),
        codes(std::max(w_row, K)), row_scales(groups), row_mins(groups) {}

  void restore(int64_t n, float* out) {
    const Layout& layout = gather(n);
    dequantize_row(codes.data(), row_scales.data(), with_mins ? row_mins.data() : nullptr, zero_point, layout, K, out);
  }

#if LC_VNNI && defined(__AVX512BF16__)
  void restore_bf16(int64_t n, at::BFloat16* out) {
    const Layout& layout = gather(n);
    dequantize_row_bf16(codes.data(), row_scales.data(), with_mins ? row_mins.data() : nullptr, zero_point, layout,
                        K, out);
  }
#endif

  // Row n's codes (row-major) into `codes` and its groups' scales and mins into row_scales and row_mins; returns
  // the layout of the codes (Q4_K, Q4_0 and Q4_1 rows come out as u4, Q5_K, Q5_0, Q5_1 and Q8_0 rows as u8).
  const Layout& gather(int64_t n) {
    const uint8_t* wp = w.qweight.data_ptr<uint8_t>();
    if (L.k_blocks()) {
      k_blocks_row(L, wp + n * w_row, K, codes.data(), row_scales.data(), row_mins.data());
      return L.file == kQ5KBlocks ? kU8 : kU4;
    }
    if (L.file == kQ8_0Blocks) {
      q8_0_row(wp + n * w_row, K, codes.data(), row_scales.data());
      return kU8;
    }
    if (L.file >= kQ4_0Blocks) {  // Q4_0, Q4_1, Q5_0, Q5_1
      return q4_row(L, wp + n * w_row, K, codes.data(), row_scales.data(), row_mins.data()) ? kU8 : kU4;
    }
    if (L.file == kQ6KBlocks) {  // the codes as they are (dequantize_row reads the blocks), the scales from them
      std::memcpy(codes.data(), wp + n * w_row, w_row);
      q6k_row_scales(codes.data(), groups, row_scales.data());
      return L;
    }
    const void* sp = w.scales.data_ptr();
    const void* mp = w.has_mins ? w.mins.data_ptr() : nullptr;
    const at::Half* up = w.k_scales ? w.supers.data_ptr<at::Half>() : nullptr;
    const int64_t r = n % kRowsPerPass;
    const PassView v = pass_view(wp, sp, mp, up, n - r, N, w_row, groups, interleaved);
#if LC_VNNI  // a chunk per copy, 16 groups' scales per vector (the scalar loop's arithmetic)
    int64_t c = 0;
    for (; (c + 1) * kChunkBytes <= w_row; ++c) {
      _mm512_storeu_si512(codes.data() + c * kChunkBytes, _mm512_loadu_si512(v.codes(r, c)));
    }
    if (c * kChunkBytes < w_row) std::memcpy(codes.data() + c * kChunkBytes, v.codes(r, c), w_row - c * kChunkBytes);
    for (int64_t g = 0; g < groups; g += kGroupBlock) {
      const int64_t left = groups - g;
      const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      if (w.k_scales) {  // d * sub-scale and -(dmin * sub-min)
        __m512 scales, m;
        k_group_params(v, r, g, left, scales, m);
        _mm512_mask_storeu_ps(row_scales.data() + g, mask, scales);
        const __m512i negated = _mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32(INT32_MIN));  // -m
        _mm512_mask_storeu_ps(row_mins.data() + g, mask, _mm512_castsi512_ps(negated));
      } else {
        _mm512_mask_storeu_ps(row_scales.data() + g, mask,
                              _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.group<at::Half>(v.s, r, g))));
        if (mp) {
          _mm512_mask_storeu_ps(row_mins.data() + g, mask,
                                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, v.group<at::Half>(v.m, r, g))));
        }
      }
    }
#else
    for (int64_t c = 0; c * kChunkBytes < w_row; ++c) {
      std::memcpy(codes.data() + c * kChunkBytes, v.codes(r, c), std::min<int64_t>(kChunkBytes, w_row - c * kChunkBytes));
    }
    for (int64_t g = 0; g < groups; ++g) {
      if (w.k_scales) {  // d * sub-scale and -(dmin * sub-min)
        const at::Half* pair = v.supers(r, g / kGroupBlock) + (g % kGroupBlock) / 8 * 2;
        int scale, min;
        k_params(*v.group<uint8_t>(v.s, r, g), k_top_nibble(*v.half_group(v.m, r, g & ~int64_t{1}), g), scale, min);
        row_scales[g] = static_cast<float>(scale) * half_to_float(pair[0]);
        row_mins[g] = -(static_cast<float>(min) * half_to_float(pair[1]));
      } else {
        row_scales[g] = half_to_float(*v.group<at::Half>(v.s, r, g));
        if (mp) row_mins[g] = half_to_float(*v.group<at::Half>(v.m, r, g));
      }
    }
#endif
    return L;
  }
};

// Rows `rows` (int64, any shape) of a packed weight as float32 [*rows.shape, K]: an embedding lookup. Only the
// looked-up rows are read, in either layout (no copy of the weight is restored).
torch::Tensor dequantize_rows(const torch::Tensor& qweight, const torch::Tensor& scales,
                              const c10::optional<torch::Tensor>& mins_in,
                              const c10::optional<torch::Tensor>& supers_in, int64_t bits, int64_t group_size,
                              int64_t zero_point, int64_t arrangement, const torch::Tensor& rows_in) {
  const Layout L = make_layout(bits, group_size, arrangement);
  const WeightArgs w(qweight, scales, mins_in, supers_in, false);
  const torch::Tensor rows = rows_in.to(torch::kLong).contiguous();
  const int64_t N = w.qweight.size(0), K = L.in_features(w.qweight.size(1));
  const int64_t R = rows.numel();
  std::vector<int64_t> shape(rows.sizes().begin(), rows.sizes().end());
  shape.push_back(K);
  torch::Tensor out = torch::empty(shape, torch::kFloat);
  const int64_t* ids = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < R; ++i) TORCH_CHECK(ids[i] >= 0 && ids[i] < N, "row ", ids[i], " out of range for ", N, " rows");
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    RowRestorer restorer(w, L, zero_point, arrangement == kInterleaved);
    for (int64_t i = begin; i < end; ++i) restorer.restore(ids[i], op + i * K);
  });
  return out;
}

// n floats as bfloat16, rounded to nearest even: the restore's last step where the CPU has no AVX-512 BF16
// (where it has, RowRestorer::restore_bf16 rounds as it restores)
void to_bfloat16(const float* in, int64_t n, at::BFloat16* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = static_cast<at::BFloat16>(in[k]);
}

// x [M, K] @ W.T as one bfloat16 GEMM (oneDNN) per band of weight rows, each band restored into a bfloat16 buffer
// that stays in the caches: for prefill chunks and large batches, where the GEMM beats per-row integer dots.
// The activations, the weights (dequantized exactly, then rounded) and the result pass through bfloat16. With
// `out` (float32 [M, N], any strides: a part's columns of a multi-part projection's output), the result is
// written there and returned, and no float32 temporary is made.
//
// Each thread takes its own share of the rows, band by band, and restores and multiplies them alone (a GEMM
// called inside the parallel region runs on its caller's thread): no band is restored by one core and read by
// another. Shared bands (restored by all threads, then one GEMM on all of them) made the prefill depend on where
// the host put the two cores: measured on the Zen 5 EPYC (2026-12-05, an 8B Q4_0 file, a 128-token prompt, in
// one process, alternating), 2.55-2.69 s with shared bands and 2.39-2.44 s with own ones where the cores shared an
// L3 (a cache line's round trip between them 146-152 ns), 3.45-3.51 s and 2.36-2.41 s where they did not (408-411
// ns). The results are the same bits.
torch::Tensor dense_linear_bf16(const torch::Tensor& x_in, const torch::Tensor& qweight, const torch::Tensor& scales,
                                const c10::optional<torch::Tensor>& mins_in,
                                const c10::optional<torch::Tensor>& supers_in, int64_t bits, int64_t group_size,
                                int64_t zero_point, int64_t arrangement, const c10::optional<torch::Tensor>& out) {
  const Layout L = make_layout(bits, group_size, arrangement);
  const WeightArgs w(qweight, scales, mins_in, supers_in, false);
  const int64_t N = w.qweight.size(0), K = L.in_features(w.qweight.size(1));
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == K, "x must be [M, ", K, "]");
  const torch::Tensor x = x_in.to(torch::kBFloat16).contiguous();
  // about 2 MiB of bfloat16 weights a band (an L2), a multiple of a pass's rows
  const int64_t band = std::max<int64_t>(kRowsPerPass, ((int64_t{1} << 20) / K) / kRowsPerPass * kRowsPerPass);
  torch::Tensor out_t = torch::empty({N, x.size(0)}, torch::kBFloat16);
  const int threads = at::get_num_threads();
  const int64_t passes = (N + kRowsPerPass - 1) / kRowsPerPass;
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    c10::InferenceMode guard(inference);  // (thread-local: the workers take the caller's)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = std::min(N, passes * t / threads * kRowsPerPass);
      const int64_t r1 = std::min(N, passes * (t + 1) / threads * kRowsPerPass);
      if (r0 >= r1) continue;
      torch::Tensor buffer = torch::empty({std::min(band, r1 - r0), K}, torch::kBFloat16);
      auto* bp = buffer.data_ptr<at::BFloat16>();
      RowRestorer restorer(w, L, zero_point, arrangement == kInterleaved);
#if !(LC_VNNI && defined(__AVX512BF16__))
      std::vector<float> row(K);
#endif
      for (int64_t n0 = r0; n0 < r1; n0 += band) {
        const int64_t rows = std::min(band, r1 - n0);
        for (int64_t i = 0; i < rows; ++i) {
#if LC_VNNI && defined(__AVX512BF16__)
          restorer.restore_bf16(n0 + i, bp + i * K);
#else
          restorer.restore(n0 + i, row.data());
          to_bfloat16(row.data(), K, bp + i * K);
#endif
        }
        torch::Tensor band_out = out_t.narrow(0, n0, rows);
        at::mm_out(band_out, buffer.narrow(0, 0, rows), x.t());
      }
    }
  });
  if (out.has_value() && out->defined()) {
    TORCH_CHECK(out->scalar_type() == torch::kFloat && out->dim() == 2 && out->size(0) == x.size(0) && out->size(1) == N,
                "out must be float32 [", x.size(0), ", ", N, "]");
    torch::Tensor target = *out;
    target.copy_(out_t.t());
    return target;
  }
  return out_t.t().to(torch::kFloat);
}
