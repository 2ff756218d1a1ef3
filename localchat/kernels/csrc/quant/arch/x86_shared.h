// What the two x86 ISAs (arch/avx512/, arch/avx2/) share: unpacking K-quant sub-scales with SSE, the choice of a
// kernel instantiation, and the block types' prefetch distances and field offsets.
#pragma once

#include "../common.h"

#if LC_SIMD
namespace {
namespace isa {

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
      LC_CHECK(symmetric && !kq, "u6 weights are symmetric, without K-quant scales");
      return pick(p, T{}, std::integral_constant<int, 6>{}, F{});
    }
    return bits == 4 ? with(p, std::integral_constant<int, 4>{}) : with(p, std::integral_constant<int, 8>{});
  };
  return precise ? with_bits(T{}) : with_bits(F{});
}


// The GEMV reads a pass's rows one after the other: the rows are contiguous, so that is one stream, which it prefetches
// this many blocks ahead. Measured on the Zen 5 EPYC (2026-12-05, one process, alternating, Q6_K weights from DRAM,
// 2 threads): a pass's four rows read side by side (four streams) took 1.20-1.26 ms for a 4096 x 14336 weight
// where row by row took 0.98-1.02 (u6 interleaved: 1.24-1.28); 16 blocks ahead was slower on that shape than
// 24-48.
constexpr int64_t kQ6KPrefetchBlocks = 32;

// Prefetch the cache lines of `bytes` bytes from `distance` bytes past p, in a stream of blocks (past a weight's end:
// harmless).
inline void prefetch_ahead(const uint8_t* p, int64_t distance, int64_t bytes) { prefetch_lines(p + distance, bytes); }

inline void prefetch_q6k_ahead(const uint8_t* block) { prefetch_ahead(block, kQ6KPrefetchBlocks * kQ6KBytes, kQ6KBytes); }

inline float q6k_super_scale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block + kQ6KSuperScale, 2);
  return _cvtsh_ss(d);
}


// Whether this is an Intel CPU (cpuid's vendor, as GCC's and Clang's runtime CPU check reads it; its init first, as
// a static initializer must).
inline bool intel_cpu() {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
}

// The GEMV reads a pass's rows one after the other (one stream, as q6k.h's), prefetching this many blocks
// ahead. Measured on the Zen 5 EPYC (2026-12-05, one process, alternating, 8B-shaped Q4_K weights from DRAM):
// 32 blocks read 36-37 GB/s on one thread and 47 on two, where the interleaved u4 kernel read 29-33 and 42-45;
// Q5_K 36-38 and 51-68 against u8's 21-23 and 32-41 (docs/benchmarks-history.md). On the Sapphire Rapids Xeon VM
// (2026-12-06, one process, the distances taking turns, eight 14336 x 4096 Q4_K copies from DRAM, 2 threads)
// 32 blocks read 17.1 GB/s and 16 blocks 23.1 (8: 21.3, 24: 20.0, 48: 16.8), and the 8B Q4_K_M decode went from
// 3.18 to 3.50 tok/s: Intel parts take 16.
inline const int64_t kKBlocksPrefetch = intel_cpu() ? 16 : 32;

// A K-quant block's bytes, and where its codes start, for 4- or 5-bit codes.
template <int BITS>
constexpr int64_t k_block_bytes() { return BITS == 5 ? kQ5KBytes : kQ4KBytes; }
template <int BITS>
constexpr int64_t k_block_codes() { return BITS == 5 ? kQ5KCodes : kQ4KCodes; }

// (the kernels step two blocks at a time)
template <int BITS>
inline void prefetch_k_blocks_ahead(const uint8_t* pair) {
  prefetch_ahead(pair, kKBlocksPrefetch * k_block_bytes<BITS>(), 2 * k_block_bytes<BITS>());
}

// The sub-scales and sub-mins of block `block` and, when `two`, the next, as 16 bytes each (group q of the second
// block in byte 8 + q; zero past the blocks' groups), and their d and dmin (as float16 bits: d0 dmin0 d1 dmin1, zeros
// past them). A block's 12 packed bytes keep groups 0-3's low 6 bits in bytes 0-3 (scales) and 4-7 (mins), groups
// 4-7's low 4 bits in bytes 8-11 (scales low nibbles, mins high) and their top 2 bits in the top bits of bytes 0-7;
// both blocks are unpacked at once, a block a 128-bit lane.
template <int BITS>
inline void k_pair_params(const uint8_t* block, bool two, __m128i& sub_scales, __m128i& sub_mins, __m128i& supers) {
  // bytes 4-19 of each block: its 12 packed bytes (p0-p11), then codes
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ4KSubParams));
  const __m128i second = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + k_block_bytes<BITS>() +
                                                                               kQ4KSubParams))
                             : _mm_setzero_si128();
  const __m256i p = _mm256_set_m128i(second, first);
  // per lane: the low bits' sources (p0-3: scales 0-3; p8-11: scales 4-7, low nibbles; p4-7: mins 0-3; p8-11:
  // mins 4-7, high nibbles) and the top bits' (p0-3 for scales 4-7, p4-7 for mins 4-7; zero elsewhere)
  const __m256i low = _mm256_shuffle_epi8(
      p, _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8,
                          9, 10, 11));
  const __m256i top = _mm256_shuffle_epi8(
      p, _mm256_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 0, 1, 2, 3, -1, -1,
                          -1, -1, 4, 5, 6, 7));
  const __m256i keep = _mm256_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0, 63, 63, 63, 63,
                                        15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
  const __m256i high_nibbles = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15, 0, 0, 0, 0, 0, 0,
                                                0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
  const __m256i params = _mm256_or_si256(
      _mm256_or_si256(_mm256_and_si256(low, keep), _mm256_and_si256(_mm256_srli_epi16(low, 4), high_nibbles)),
      _mm256_and_si256(_mm256_srli_epi16(top, 2), _mm256_set1_epi8(0x30)));
  // lanes (scales, mins) of each block -> (scales of both, mins of both)
  const __m256i split = _mm256_permute4x64_epi64(params, 0xD8);
  sub_scales = _mm256_castsi256_si128(split);
  sub_mins = _mm256_extracti128_si256(split, 1);
  int32_t d0, d1 = 0;
  std::memcpy(&d0, block, 4);
  if (two) std::memcpy(&d1, block + k_block_bytes<BITS>(), 4);
  supers = _mm_set_epi32(0, 0, d1, d0);
}

// Bytes ahead of the GEMV's row-by-row stream that it prefetches (about 4 KiB, as kPrefetchBytes), and the bytes
// of the kGroupBlock groups each step reads.
constexpr int64_t kQ8_0PrefetchBytes = 128 * kQ8_0Bytes, kQ8_0StepBytes = kGroupBlock * kQ8_0Bytes;

// The 32 codes of the block `block` (int8).
inline const uint8_t* q8_0_codes(const uint8_t* block) { return block + 2; }


// A block's bytes, where its fifth bits (FIFTH: Q5) and its codes start, without (Q4_0, Q5_0) or with (Q4_1, Q5_1)
// mins.
template <bool MINS>
constexpr int64_t q4_block_high() { return MINS ? 4 : 2; }
template <bool MINS, bool FIFTH>
constexpr int64_t q4_block_codes() { return q4_block_high<MINS>() + (FIFTH ? 4 : 0); }
template <bool MINS, bool FIFTH>
constexpr int64_t q4_block_bytes() { return q4_block_codes<MINS, FIFTH>() + 16; }
static_assert(q4_block_bytes<false, false>() == kQ4_0Bytes && q4_block_bytes<true, false>() == kQ4_1Bytes &&
              q4_block_bytes<false, true>() == kQ5_0Bytes && q4_block_bytes<true, true>() == kQ5_1Bytes);

// The 16 code bytes of the block i of those from `first`, or zeros where i is past the n there (never, when the
// caller knows the chunk is WHOLE).
template <bool MINS, bool FIFTH, bool WHOLE = false>
inline __m128i q4_codes(const uint8_t* first, int i, int64_t n) {
  if (!WHOLE && i >= n) return _mm_setzero_si128();
  return _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(first + i * q4_block_bytes<MINS, FIFTH>() + q4_block_codes<MINS, FIFTH>()));
}

// The fifth bits of the blocks i0 and i0 + 1 of those from `first` (zero past the n there): bits 0-15 of each (its
// weights 0-15) side by side in the low 32 bits, bits 16-31 (weights 16-31) in the high 32.
template <bool MINS, bool WHOLE>
inline uint64_t q5_fifth_pair(const uint8_t* first, int i0, int64_t n) {
  constexpr int64_t kBytes = q4_block_bytes<MINS, true>(), kHigh = q4_block_high<MINS>();
  uint32_t qh[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    if (WHOLE || i0 + i < n) std::memcpy(qh + i, first + (i0 + i) * kBytes + kHigh, 4);
  }
  return (qh[0] & 0xFFFFu) | (qh[1] & 0xFFFFu) << 16 | static_cast<uint64_t>((qh[0] >> 16) | (qh[1] >> 16) << 16) << 32;
}



}  // namespace isa
}  // namespace
#endif
