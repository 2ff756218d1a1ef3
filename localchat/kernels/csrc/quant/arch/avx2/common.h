// Quantized projections on AVX2 CPUs without AVX-512 VNNI (AMD Zen 2 and 3, Intel client cores): the layouts,
// activation codes and integer arithmetic of quant_linear.h's VNNI kernels, 32 bytes at a time.
//
// vpmaddubsw multiplies unsigned weight codes by signed activation codes into int16 pairs and vpmaddwd sums those
// into the int32 lanes vpdpbusd fills, so a 64-byte chunk's 16 dot-product lanes are two 8-lane halves. vpmaddubsw
// saturates at 2^15 - 1: u4 and u6 codes (< 64) times int8 codes (|q| <= 127) stay below it, even with a chunk's
// low- and high-nibble products added in int16 (2 * 2 * 63 * 127 = 32004). u8 codes go in shifted to signed
// (code - 128) and multiply as |w| x sign(a, w) (at most 2 * 128 * 127), with 128 * sum(a) added back in int32,
// so every dot product is exact, as on VNNI.
//
// A decode (gemv_rows) and a batch (panel_dots) run the same operations in the same order for each (activation
// row, weight row) pair, so a row's result does not depend on the batch around it.
//
// This file: the building blocks (a half chunk's codes, the lanes' scales, the lanes' integer dot products).
#pragma once
#include "../x86_shared.h"

#if LC_AVX2
namespace {
namespace isa {


// 32 bytes (a half) of a weight row's chunk, unpacked: the codes the low- and high-nibble activations meet (u8:
// the signed codes code - 128 and their magnitudes).
struct HalfCodes {
  __m256i lo, hi;
};

// Per chunk j of a block of kGroupBlock groups and half h of its lanes: the half of the block's 16 scales the
// lanes' groups lie in, and each lane's index in it.
struct HalfIndex {
  int source[kGroupBlock / 2][2];
  alignas(32) int32_t lanes[kGroupBlock / 2][2][8];
  explicit HalfIndex(int groups_per_chunk) {
    const int lanes_per_group = 16 / groups_per_chunk;
    for (int j = 0; j < kGroupBlock / 2; ++j) {
      for (int h = 0; h < 2; ++h) {
        const int first = std::min(15, j * groups_per_chunk + 8 * h / lanes_per_group);
        source[j][h] = first / 8;
        for (int lane = 0; lane < 8; ++lane) {
          const int group = std::min(15, j * groups_per_chunk + (8 * h + lane) / lanes_per_group);
          lanes[j][h][lane] = group - 8 * source[j][h];
        }
      }
    }
  }
};
const HalfIndex kHalfIndex2(2), kHalfIndex4(4), kHalfIndex8(8);

inline const HalfIndex& half_index(int groups_per_chunk) {
  return groups_per_chunk == 8 ? kHalfIndex8 : groups_per_chunk == 4 ? kHalfIndex4 : kHalfIndex2;
}

// A row's short end is read with masked loads (vpmaskmovd: masked-off lanes are never touched, so nothing past
// the tensor is read) rather than copied into a buffer, whose wider reloads would stall on store forwarding
// once per row and pass. Its lengths are whole 32-bit lanes but for an odd count of float16 values, which are
// copied.

// The first `bytes` (a multiple of 4, at most 16) bytes at p, zero above.
inline __m128i load_low_bytes(const void* p, int64_t bytes) {
  if (bytes >= 16) return _mm_loadu_si128(static_cast<const __m128i*>(p));
  const __m128i lane = _mm_setr_epi32(0, 1, 2, 3);
  const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(bytes / 4)), lane);
  return _mm_maskload_epi32(static_cast<const int*>(p), mask);
}

// The first `bytes` (a multiple of 4, at most 32) bytes at p, zero above.
inline __m256i load_low_bytes32(const void* p, int64_t bytes) {
  if (bytes >= 32) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(bytes / 4)), lane);
  return _mm256_maskload_epi32(static_cast<const int*>(p), mask);
}

// n (clamped to 0..8) float16 values as floats, zero above n.
inline __m256 halves_to_floats(const uint16_t* p, int64_t n) {
  if (n >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if (n <= 0) return _mm256_setzero_ps();
  if (n % 2 == 0) return _mm256_cvtph_ps(load_low_bytes(p, 2 * n));
  alignas(16) uint16_t buffer[8] = {};
  std::memcpy(buffer, p, n * sizeof(uint16_t));
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(buffer)));
}

// (load_low_bytes' masked loads need byte counts in whole 32-bit lanes: weight rows' code bytes are multiples of
// 16, and an odd count of float16 values is copied.)

// The two float16 values that open each of the n (clamped to 0..kGroupBlock) blocks from `block`, `bytes` apart (a
// Q4_1 or Q5_1 block's d and m), as floats: groups 0-7 and 8-15, zero past n. Each block's first 4 bytes are
// gathered into a lane (masked past n). (Copying the values one by one into buffers read back 16 bytes at a time
// stalled the reads on store forwarding: 60% of a Q4_1 GEMV's time on a Zen 3. Types with one float16 a block
// measured no faster gathered, and Q8_0 slower.)
inline void block_half_pairs(const uint8_t* block, int64_t n, int32_t bytes, __m256 first[2], __m256 second[2]) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i offsets = _mm256_mullo_epi32(lane, _mm256_set1_epi32(bytes));
  auto gather = [&](const uint8_t* from, int64_t left) {  // blocks from .. from + min(left, 8)
    if (left >= 8) return _mm256_i32gather_epi32(reinterpret_cast<const int*>(from), offsets, 1);
    if (left <= 0) return _mm256_setzero_si256();
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane);
    return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(from), offsets, mask, 1);
  };
  const __m256i low = gather(block, n), high = gather(block + 8 * static_cast<int64_t>(bytes), n - 8);
  // a value of both gathers' lanes packed into groups 0-7 | 8-15, as floats
  auto floats = [](__m256i a, __m256i b, __m256 out[2]) {
    const __m256i values = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    out[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(values));
    out[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(values, 1));
  };
  const __m256i mask = _mm256_set1_epi32(0xFFFF);
  floats(_mm256_and_si256(low, mask), _mm256_and_si256(high, mask), first);
  floats(_mm256_srli_epi32(low, 16), _mm256_srli_epi32(high, 16), second);
}

// The (d, dmin, d, dmin) halves of row r's block b as floats (one super-block's pair at a short end).
inline void load_supers(const PassView& v, int r, int64_t b, int64_t groups_left, float out[4]) {
  const uint16_t* p = v.supers(r, b);
  const int n = groups_left > 8 ? 4 : 2;
  for (int i = 0; i < 4; ++i) out[i] = i < n ? half_to_float(p[i]) : 0.f;
}

// The low 8 bytes as floats.
inline __m256 low_bytes_to_floats(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

// Row r's weight scales of the block of kGroupBlock groups from g0 (left of them in the row), per half of 8
// groups: float16 scales, or K-quant sub-scales times their super-block's d. With `offsets` (K-quants), the
// block's mins times the activation's group terms are taken off it too, as row_offsets does.
template <bool KQ>
inline void block_scales(const PassView& v, int r, int64_t g0, int64_t left, __m256 out[2],
                         const float* terms = nullptr, __m256* offsets = nullptr) {
  if (KQ) {
    float supers[4];
    load_supers(v, r, g0 / kGroupBlock, left, supers);
    __m128i sub, mins;
    k_sub_params(v, r, g0, left, sub, mins);
    out[0] = _mm256_mul_ps(low_bytes_to_floats(sub), _mm256_set1_ps(supers[0]));
    out[1] = _mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(sub, 8)), _mm256_set1_ps(supers[2]));
    if (offsets) {
      const float* t = terms + g0;
      *offsets = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(mins), _mm256_set1_ps(supers[1])),
                                  _mm256_loadu_ps(t), *offsets);
      *offsets = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(mins, 8)), _mm256_set1_ps(supers[3])),
                                  _mm256_loadu_ps(t + 8), *offsets);
    }
  } else {
    const uint16_t* s = v.group<uint16_t>(v.s, r, g0);
    out[0] = halves_to_floats(s, left);
    out[1] = halves_to_floats(s + 8, left - 8);
  }
}

// block_scales<true> for all kRowsPerPass rows of an interleaved pass's block b, whose 16 groups are all there: the
// rows' packed sub-scales and sub-mins lie side by side (k_sub_params' unpacking, two rows a vector) and so do their
// (d, dmin) halves. The same products as block_scales, bit for bit; with `offsets`, the mins' lanes taken off them
// against the block's activation terms (terms: the block's first).
inline void k_pass_scales(const PassView& v, int64_t b, __m256 out[][2], const float* terms = nullptr,
                          __m256* offsets = nullptr) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const uint8_t* low = static_cast<const uint8_t*>(v.s) + b * v.g_block_step;
  const uint8_t* top = static_cast<const uint8_t*>(v.m) + b * v.g_block_step / 2;
  for (int pair = 0; pair < kRowsPerPass / 2; ++pair) {  // rows 2 * pair and 2 * pair + 1, one a 128-bit lane
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + 32 * pair));
    // word j of a row's lane: the top byte of groups 2j and 2j + 1; the even group takes its low nibble (the
    // masks below keep only its bits), the odd group its high one
    const __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(top + 16 * pair)));
    const __m256i bits =
        _mm256_blendv_epi8(words, _mm256_slli_epi16(words, 4), _mm256_set1_epi16(static_cast<int16_t>(0xFF00)));
    const __m256i sub = _mm256_or_si256(_mm256_and_si256(lo, nibble),
                                        _mm256_slli_epi16(_mm256_and_si256(bits, _mm256_set1_epi8(3)), 4));
    const __m256i mins = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), nibble),
                                         _mm256_slli_epi16(_mm256_and_si256(bits, _mm256_set1_epi8(12)), 2));
    // the two rows' (d, dmin, d, dmin)
    const __m256 supers = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(v.sup + b * v.sup_block_step + 8 * pair)));
    for (int i = 0; i < 2; ++i) {
      const int r = 2 * pair + i;
      const __m128i s = i == 0 ? _mm256_castsi256_si128(sub) : _mm256_extracti128_si256(sub, 1);
      auto super = [&](int k) { return _mm256_permutevar8x32_ps(supers, _mm256_set1_epi32(4 * i + k)); };
      out[r][0] = _mm256_mul_ps(low_bytes_to_floats(s), super(0));
      out[r][1] = _mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(s, 8)), super(2));
      if (offsets) {
        const __m128i m = i == 0 ? _mm256_castsi256_si128(mins) : _mm256_extracti128_si256(mins, 1);
        offsets[r] = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(m), super(1)), _mm256_loadu_ps(terms),
                                      offsets[r]);
        offsets[r] = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(m, 8)), super(3)),
                                      _mm256_loadu_ps(terms + 8), offsets[r]);
      }
    }
  }
}

// block_scales for each of a pass's kRowsPerPass rows (a short pass repeats its first row): k_pass_scales where a
// K-quant pass holds the whole block, else row by row; with `offsets`, each row's mins as block_scales takes them.
template <bool KQ>
inline void pass_block_scales(const PassView& v, int rows, int64_t g0, int64_t groups, __m256 out[][2],
                              const float* terms = nullptr, __m256* offsets = nullptr) {
  if (KQ && v.holds_block(g0 / kGroupBlock)) {
    k_pass_scales(v, g0 / kGroupBlock, out, terms ? terms + g0 : nullptr, offsets);
    return;
  }
  for (int r = 0; r < kRowsPerPass; ++r) {
    block_scales<KQ>(v, r < rows ? r : 0, g0, groups - g0, out[r], terms, offsets ? &offsets[r] : nullptr);
  }
}

// Half h of row r's chunk c (weight_bytes - c * 64 of its bytes left) as the vectors the dot products take.
template <int BITS>
inline HalfCodes unpack_half(const PassView& v, int r, int64_t c, int64_t top0, int64_t left, int h) {
  const int64_t bytes = left - 32 * h;  // (std::max would take its operands by reference, through memory)
  const __m256i raw = load_low_bytes32(v.codes(r, c) + 32 * h, bytes > 0 ? bytes : 0);
  HalfCodes w;
  if (BITS == 8) {
    w.lo = _mm256_xor_si256(raw, _mm256_set1_epi8(static_cast<char>(0x80)));  // code - 128, signed
    w.hi = _mm256_abs_epi8(w.lo);  // its magnitude (128 stays 0x80: 128 as unsigned)
    return w;
  }
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  w.lo = _mm256_and_si256(raw, low_mask);
  w.hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
  if (BITS == 6) {  // the top two bits: half 0 takes bit pairs 0-1 and 4-5 of each byte, half 1 pairs 2-3 and 6-7
    const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.codes(r, top0 + c / 2) + 32 * (c & 1)));
    const __m256i pair = _mm256_set1_epi8(0x30);
    const __m256i top_lo = h == 0 ? _mm256_slli_epi16(top, 4) : _mm256_slli_epi16(top, 2);
    const __m256i top_hi = h == 0 ? top : _mm256_srli_epi16(top, 2);
    w.lo = _mm256_or_si256(w.lo, _mm256_and_si256(top_lo, pair));
    w.hi = _mm256_or_si256(w.hi, _mm256_and_si256(top_hi, pair));
  }
  return w;
}

// The int32 lanes of half h of one weight chunk times one level of activation codes (chunk: that level's codes).
template <int BITS>
inline __m256i half_dot(const HalfCodes& w, int h, const int8_t* chunk) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
  if (BITS == 8) return _mm256_madd_epi16(_mm256_maddubs_epi16(w.hi, _mm256_sign_epi8(a, w.lo)), ones);
  const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(chunk + 64 + 32 * h));
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w.lo, a), _mm256_maddubs_epi16(w.hi, b)), ones);
}

// The exact integer dot products of half h of weight chunk c (codes w) with activation row a, one per lane:
// with the second level's (precise), less the zero point's (symmetric), and with u8's 128 x sum(a) put back.
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline __m256i lane_dots(const HalfCodes& w, int h, const ActivationRow& a, int64_t c, const Layout& L) {
  const int64_t at = c * L.act_chunk_bytes, lane = c * 16 + 8 * h;
  __m256i dot = half_dot<BITS>(w, h, a.codes + at);
  if (PRECISE) dot = _mm256_add_epi32(_mm256_slli_epi32(dot, 8), half_dot<BITS>(w, h, a.codes2 + at));
  if (BITS == 8) {  // (128 - zero_point) * sum(a): both corrections at once
    dot = _mm256_add_epi32(dot, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.lane_u8_fix + lane)));
  } else if (SYMMETRIC) {
    dot = _mm256_sub_epi32(dot, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.lane_zsums + lane)));
  }
  return dot;
}

// A block of 16 groups' weight scales (two halves of 8, from group g0) times the activation's group scales: the
// products gemv_rows forms.
inline void times_activation_scales(__m256 sd[2], const ActivationRow& a, int64_t g0) {
  sd[0] = _mm256_mul_ps(sd[0], _mm256_loadu_ps(a.group_scales + g0));
  sd[1] = _mm256_mul_ps(sd[1], _mm256_loadu_ps(a.group_scales + g0 + 8));
}

// Chunk j's lanes of half h from a block's 16 per-group values (two halves of 8).
inline __m256 to_lanes(const __m256 block[2], const HalfIndex& index, int64_t j, int h) {
  return _mm256_permutevar8x32_ps(block[index.source[j][h]],
                                  _mm256_load_si256(reinterpret_cast<const __m256i*>(index.lanes[j][h])));
}

// to_lanes' values for a GEMV, a lane-crossing shuffle per 8 groups rather than one (and an index load) per half:
// each half of 8 scales is reordered once so that an in-lane permute gives every half's lanes. With 4 groups a chunk
// (groups 2k and 2k + 1 of the 8 fill half h of chunk j's low and high lanes, k = 2 * (j % 2) + h) evens go to the
// low lane and odds to the high one; with 8 (groups 4h .. 4h + 3 of chunk j's 8, two lanes each) groups 0, 1, 4, 5
// to the low lane. Other chunk sizes keep to_lanes.
template <int GROUPS_PER_CHUNK>
struct BlockLanes {
  static constexpr bool kInLane = GROUPS_PER_CHUNK == 4 || GROUPS_PER_CHUNK == 8;
  __m256 source[2];
  const HalfIndex* index;

  BlockLanes(const __m256 block[2], const HalfIndex& halves) : index(&halves) {
    const __m256i order = GROUPS_PER_CHUNK == 4 ? _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)
                                                : _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int i = 0; i < 2; ++i) source[i] = kInLane ? _mm256_permutevar8x32_ps(block[i], order) : block[i];
  }

  __m256 at(int64_t j, int h) const {
    if (!kInLane) return to_lanes(source, *index, j, h);
    alignas(32) static const int32_t picks[4][8] = {
        {0, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2, 2, 2}, {3, 3, 3, 3, 3, 3, 3, 3}};
    alignas(32) static const int32_t pairs[2][8] = {{0, 0, 1, 1, 0, 0, 1, 1}, {2, 2, 3, 3, 2, 2, 3, 3}};
    const int32_t* pick = GROUPS_PER_CHUNK == 4 ? picks[2 * (j % 2) + h] : pairs[h];
    return _mm256_permutevar_ps(source[GROUPS_PER_CHUNK == 4 ? j / 2 : j],
                                _mm256_load_si256(reinterpret_cast<const __m256i*>(pick)));
  }
};

// The lanes of an asymmetric weight row's mins times the activation group sums (terms), 16 groups at a time
// (gemv_rows forms a K-quant's in the same order as it goes).
template <bool SYMMETRIC, bool KQ>
inline __m256 row_offsets(const PassView& v, int r, const float* terms, int64_t groups) {
  __m256 acc = _mm256_setzero_ps();
  // (terms past the last group are the activation row's block scales, finite, so zero mins cancel them)
  for (int64_t g = 0; !SYMMETRIC && g < groups; g += 16) {
    const int64_t left = groups - g;
    const float* t = terms + g;
    if (KQ) {  // the mins are -dmin * m
      const __m128i m = k_sub_bytes(v, r, g, left, 1);
      float supers[4];
      load_supers(v, r, g / kGroupBlock, left, supers);
      acc = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(m), _mm256_set1_ps(supers[1])), _mm256_loadu_ps(t), acc);
      acc = _mm256_fnmadd_ps(_mm256_mul_ps(low_bytes_to_floats(_mm_srli_si128(m, 8)), _mm256_set1_ps(supers[3])),
                             _mm256_loadu_ps(t + 8), acc);
    } else {
      const uint16_t* m = v.group<uint16_t>(v.m, r, g);
      acc = _mm256_fmadd_ps(halves_to_floats(m, left), _mm256_loadu_ps(t), acc);
      acc = _mm256_fmadd_ps(halves_to_floats(m + 8, left - 8), _mm256_loadu_ps(t + 8), acc);
    }
  }
  return acc;
}

// The sum of a (row, row) pair's lanes: its dot products' and (asymmetric weights) its mins'.
template <bool SYMMETRIC>
inline float finish_row(__m256 acc, __m256 offsets) {
  if (!SYMMETRIC) acc = _mm256_add_ps(acc, offsets);
  const __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
  return _mm_cvtss_f32(_mm_add_ss(sum2, _mm_shuffle_ps(sum2, sum2, 1)));
}


// Chunk c of a pass's kRowsPerPass weight rows (w: their codes, s: their lanes' weight scales) against activation
// row a, added to its accumulators sums[r]: a lane's scale is its weight scale times its activation scale, the
// product gemv_rows forms before its permute.
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline void chunk_products(const HalfCodes w[][2], const __m256 s[][2], const ActivationRow& a, int64_t c,
                           const Layout& L, __m256 sums[]) {
  const __m256 lane_scale[2] = {_mm256_load_ps(a.lane_scales + c * 16), _mm256_load_ps(a.lane_scales + c * 16 + 8)};
  for (int r = 0; r < kRowsPerPass; ++r) {
    for (int h = 0; h < 2; ++h) {
      const __m256i dot = lane_dots<PRECISE, SYMMETRIC, BITS>(w[r][h], h, a, c, L);
      sums[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s[r][h], lane_scale[h]), sums[r]);
    }
  }
}

// chunk_products of chunk c against activation rows acts[0 .. mt), into their accumulators acc[t * kRowsPerPass + r].
template <bool PRECISE, bool SYMMETRIC, int BITS>
inline void panel_chunk(const HalfCodes w[][2], const __m256 s[][2], const ActivationRow* acts, int64_t mt, int64_t c,
                        const Layout& L, __m256* acc) {
  for (int64_t t = 0; t < mt; ++t) {
    // the row's sums in registers while the chunk's products go in (stores to the accumulators between them would
    // make the compiler load the activation's codes again for every weight row: they may alias)
    __m256 sums[kRowsPerPass];
    for (int r = 0; r < kRowsPerPass; ++r) sums[r] = acc[t * kRowsPerPass + r];
    chunk_products<PRECISE, SYMMETRIC, BITS>(w, s, acts[t], c, L, sums);
    for (int r = 0; r < kRowsPerPass; ++r) acc[t * kRowsPerPass + r] = sums[r];
  }
}

// One chunk of a pass's kRowsPerPass weight rows, unpacked: its halves' codes and their lanes' weight scales.
struct UnpackedChunk {
  HalfCodes w[kRowsPerPass][2];
  __m256 s[kRowsPerPass][2];
};

// Chunks of a pass unpacked at a time by panel_accumulate (12 KiB: in L1 beside the accumulators).
constexpr int64_t kPanelChunks = 16;

// A pass's chunks against activation rows acts[0 .. mt), into their accumulators acc[t * kRowsPerPass + r] (zeroed
// here): unpack(c, chunk) fills each chunk, in ascending order, kPanelChunks at a time, then each activation row
// runs through those with its accumulators in registers (chunk_products, each pair's products added in chunk
// order, as panel_chunk adds them).
// (Unpacking a chunk, then running every activation row through it, held 24 vectors of codes and scales, more than
// AVX2's 16 registers: the compiler spilled them and loaded them back, with the accumulators, for every row. This
// order made the file blocks' Q4_K panels 1.09-1.25x as fast and Q6_K's 0.98-1.33x on a Zen 3, with the same bits.
// The repacked weights' panel_dots keeps panel_chunk's order: there this one measured 0.88-1.22x, with the default
// model's 576-wide rows at long prompts on the slow side.)
template <bool PRECISE, bool SYMMETRIC, int BITS, typename Unpack>
inline void panel_accumulate(int64_t chunks, const Layout& L, const ActivationRow* acts, int64_t mt, __m256* acc,
                             const Unpack& unpack) {
  for (int64_t i = 0; i < mt * kRowsPerPass; ++i) acc[i] = _mm256_setzero_ps();
  UnpackedChunk unpacked[kPanelChunks];
  for (int64_t c0 = 0; c0 < chunks; c0 += kPanelChunks) {
    const int64_t n = std::min(kPanelChunks, chunks - c0);
    for (int64_t i = 0; i < n; ++i) unpack(c0 + i, unpacked[i]);
    for (int64_t t = 0; t < mt; ++t) {
      const ActivationRow& a = acts[t];
      __m256 sums[kRowsPerPass];
      for (int r = 0; r < kRowsPerPass; ++r) sums[r] = acc[t * kRowsPerPass + r];
      for (int64_t i = 0; i < n; ++i) {
        chunk_products<PRECISE, SYMMETRIC, BITS>(unpacked[i].w, unpacked[i].s, a, c0 + i, L, sums);
      }
      for (int r = 0; r < kRowsPerPass; ++r) acc[t * kRowsPerPass + r] = sums[r];
    }
  }
}

// The GEMV of a pass of rows of file blocks whose groups are blocks (Q4_0/Q4_1/Q5_0/Q5_1, Q8_0, MXFP4), as each of
// those types runs it: a row at a time, each kGroupBlock groups' weight scales (and, where the weights have mins,
// their terms into offsets) from params(row + g0 blocks, groups left, sd, offsets) after prefetching the stream
// `ahead` bytes on, times the activation's group scales, then each chunk's halves (half(row, c, h)) through
// lane_dots, and the row's lanes summed by finish_row.
template <bool PRECISE, bool SYMMETRIC, int BITS, int GROUPS_PER_CHUNK, typename Params, typename Half>
void gemv_group_blocks(const PassView& v, int64_t groups, int64_t chunks, const Layout& L, const ActivationRow& a,
                       int rows, float* out, int64_t block_bytes, int64_t ahead, const Params& params,
                       const Half& half) {
  const HalfIndex& index = half_index(L.groups_per_chunk);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = v.w + r * v.row_step;
    __m256 acc = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < groups; g0 += kGroupBlock) {
      prefetch_ahead(row + g0 * block_bytes, ahead, kGroupBlock * block_bytes);
      __m256 sd[2];
      params(row + g0 * block_bytes, groups - g0, g0, sd, offsets);
      times_activation_scales(sd, a, g0);
      const BlockLanes<GROUPS_PER_CHUNK> lanes(sd, index);
      const int64_t c0 = g0 / GROUPS_PER_CHUNK, c1 = std::min(chunks, c0 + kGroupBlock / GROUPS_PER_CHUNK);
      for (int64_t c = c0; c < c1; ++c) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i dot = lane_dots<PRECISE, SYMMETRIC, BITS>(half(row, c, h), h, a, c, L);
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lanes.at(c - c0, h), acc);
        }
      }
    }
    out[r] = finish_row<SYMMETRIC>(acc, offsets);
  }
}

// The panel (panel_dots) of a pass of rows of file blocks, as every block type's runs it (arch/avx512/common.h's
// panel_blocks on 256-bit vectors): chunk c of weight row r unpacked by chunk(r, row, c, w, s) (its two halves'
// codes and lanes' weight scales; r's state across chunks is the hook's), then panel_accumulate, and each
// pair's lanes summed by finish_row with the offsets of each weight row against every activation row where the
// weights have mins (!SYMMETRIC: offsets(row, acts, mt, extra) fills extra[0 .. mt), the row's mins read once for
// all of them).
template <bool PRECISE, bool SYMMETRIC, int BITS, typename Chunk, typename Offsets>
void panel_blocks(const PassView& v, int64_t chunks, const Layout& L, const ActivationRow* acts, int64_t mt, int rows,
                  float* out, int64_t out_stride, void* scratch, const Chunk& chunk, const Offsets& offsets) {
  __m256* acc = static_cast<__m256*>(scratch);  // [mt][kRowsPerPass]
  auto row = [&](int r) { return v.w + (r < rows ? r : 0) * v.row_step; };  // a short pass repeats row 0
  panel_accumulate<PRECISE, SYMMETRIC, BITS>(chunks, L, acts, mt, acc, [&](int64_t c, UnpackedChunk& u) {
    for (int r = 0; r < kRowsPerPass; ++r) chunk(r, row(r), c, u.w[r], u.s[r]);
  });
  __m256 extra[kPanelRows];  // a weight row's offsets against each activation row
  for (int r = 0; r < rows; ++r) {
    if (SYMMETRIC) {
      for (int64_t t = 0; t < mt; ++t) extra[t] = _mm256_setzero_ps();
    } else {
      offsets(row(r), acts, mt, extra);
    }
    for (int64_t t = 0; t < mt; ++t) out[t * out_stride + r] = finish_row<SYMMETRIC>(acc[t * kRowsPerPass + r], extra[t]);
  }
}

// panel_blocks' offsets for weights without mins
constexpr auto kNoOffsets = [](const uint8_t*, const ActivationRow*, int64_t, __m256*) {};

}  // namespace isa
}  // namespace
#endif
