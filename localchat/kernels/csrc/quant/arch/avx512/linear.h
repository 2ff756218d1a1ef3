// The AVX-512 VNNI kernels of the repacked layouts (u4, u6, u8; row-major or interleaved): a decode's GEMV and a
// batch's panel.
#pragma once
#include "common.h"

#if LC_VNNI
namespace {
namespace isa {

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
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(group_mask, v.group<uint16_t>(v.s, r, g0))), da);
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
            _mm_maskz_loadu_epi16(scale_mask, v.group<uint16_t>(v.s, rr, first_group)))));
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

}  // namespace isa
}  // namespace
#endif
