// GGUF block types the kernels do not read, rewritten into blocks of a type they do (Q3_K -> Q6_K, IQ4_NL and
// IQ4_XS and Q2_K -> Q8_0). localchat/engine/loading/gguf_transcode.py documents the mappings; its numpy version
// is the reference this equals bit for bit (Q2_K's requantization within its rounding). Blocks shared between
// threads: numpy's version took most of a second per 60M weights.
#pragma once
#include "torch_api.h"

#include <cstdint>
#include <cstring>

#include "quant/common.h"
#include "quant/generic/kv_q8.h"

namespace {

constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// A Q3_K block (hmask[32] qs[64] scales[12] d) as a Q6_K block (ql[128] qh[64] scales[16] d) of the same values.
inline void q3_k_to_q6_k(const uint8_t* in, uint8_t* out) {
  const uint8_t *hmask = in, *qs = in + 32, *packed = in + 96;
  uint8_t codes[256];  // value + 32: weight 128 h + 32 j + i has low bits (qs[32 h + i] >> 2 j) & 3, its high
                       // bit (set: as is, clear: 4 below) in bit 4 h + j of hmask[i]
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (int i = 0; i < 32; ++i) {
        const int low = (qs[32 * h + i] >> (2 * j)) & 3, high = (hmask[i] >> (4 * h + j)) & 1;
        codes[128 * h + 32 * j + i] = static_cast<uint8_t>(low + 4 * high + 28);
      }
    }
  }
  uint8_t *ql = out, *qh = out + 128, *scales = out + 192;
  for (int h = 0; h < 2; ++h) {
    const uint8_t* c = codes + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = static_cast<uint8_t>((c[l] & 0xF) | (c[64 + l] << 4));
      ql[64 * h + 32 + l] = static_cast<uint8_t>((c[32 + l] & 0xF) | (c[96 + l] << 4));
      qh[32 * h + l] =
          static_cast<uint8_t>((c[l] >> 4) | ((c[32 + l] >> 4) << 2) | ((c[64 + l] >> 4) << 4) | ((c[96 + l] >> 4) << 6));
    }
  }
  for (int k = 0; k < 16; ++k) {  // 6-bit sub-scales: a nibble from bytes 0-7, two top bits from bytes 8-11
    const int low = k < 8 ? packed[k] & 0xF : packed[k - 8] >> 4;
    const int top = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
    scales[k] = static_cast<uint8_t>(static_cast<int8_t>((low | (top << 4)) - 32));
  }
  std::memcpy(out + 208, in + 108, 2);
}

// 32 IQ4 codes (bytes j: weights j and j + 16 in the low and high nibble) as Q8_0's int8 values.
inline void iq4_values(const uint8_t* qs, uint8_t* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<uint8_t>(kIq4Values[qs[j] & 0xF]);
    out[16 + j] = static_cast<uint8_t>(kIq4Values[qs[j] >> 4]);
  }
}

// An IQ4_XS block (d scales_h scales_l[4] qs[128]) as 8 Q8_0 blocks, each scale d * (sub-scale - 32) in float16.
inline void iq4_xs_to_q8_0(const uint8_t* in, uint8_t* out) {
  const float d = half_to_float(load_half_bits(in));
  uint16_t high;
  std::memcpy(&high, in + 2, 2);
  for (int g = 0; g < 8; ++g) {
    const int sub = ((in[4 + g / 2] >> (4 * (g % 2))) & 0xF) | (((high >> (2 * g)) & 3) << 4);
    const uint16_t scale = float_to_half(d * static_cast<float>(sub - 32));
    std::memcpy(out + 34 * g, &scale, 2);
    iq4_values(in + 8 + 16 * g, out + 34 * g + 2);
  }
}

// A Q2_K block (scales[16] qs[64] d dmin) dequantized as ggml does, then as 8 Q8_0 blocks quantized as the q8_0 KV
// pool's are (generic::kv_q8_quantize: d = max |x| / 127, codes x / d rounded to nearest even).
inline void q2_k_to_q8_0(const uint8_t* in, uint8_t* out) {
  const uint8_t *scales = in, *qs = in + 16;
  const float d = half_to_float(load_half_bits(in + 80)), dmin = half_to_float(load_half_bits(in + 82));
  float y[256];
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const int sc = scales[8 * h + 2 * j + half];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          const int q = (qs[32 * h + 16 * half + l] >> (2 * j)) & 3;
          y[128 * h + 32 * j + 16 * half + l] = dl * static_cast<float>(q) - ml;
        }
      }
    }
  }
  generic::kv_q8_quantize(y, 256, reinterpret_cast<KvQ8Block*>(out));
}

}  // namespace

// raw (uint8 [rows, row bytes] of GGML type `type`: Q3_K, IQ4_NL, IQ4_XS or Q2_K) as uint8 [rows, row bytes] of
// Q6_K (from Q3_K) or Q8_0 blocks.
torch::Tensor transcode_gguf(const torch::Tensor& raw, int64_t type) {
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == torch::kUInt8 && raw.stride(1) == 1, "raw must be uint8 [rows, bytes]");
  // GGML ids: Q2_K 10, Q3_K 11, IQ4_NL 20, IQ4_XS 23; (bytes in, bytes out) a block
  int64_t in_bytes, out_bytes;
  switch (type) {
    case 10: in_bytes = 84, out_bytes = 8 * 34; break;
    case 11: in_bytes = 110, out_bytes = 210; break;
    case 20: in_bytes = 18, out_bytes = 34; break;
    case 23: in_bytes = 136, out_bytes = 8 * 34; break;
    default: TORCH_CHECK(false, "no transcoding for GGML type ", type);
  }
  const int64_t rows = raw.size(0), row_bytes = raw.size(1);
  TORCH_CHECK(row_bytes % in_bytes == 0, "a row is not a whole number of blocks");
  const int64_t blocks = row_bytes / in_bytes;
  torch::Tensor out = torch::empty({rows, blocks * out_bytes}, torch::TensorOptions().dtype(torch::kUInt8));
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t stride = raw.stride(0);
  at::parallel_for(0, rows * blocks, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* in = src + (i / blocks) * stride + (i % blocks) * in_bytes;
      uint8_t* o = dst + i * out_bytes;
      switch (type) {
        case 10: q2_k_to_q8_0(in, o); break;
        case 11: q3_k_to_q6_k(in, o); break;
        case 20: std::memcpy(o, in, 2), iq4_values(in + 2, o + 2); break;
        default: iq4_xs_to_q8_0(in, o); break;
      }
    }
  });
  return out;
}
