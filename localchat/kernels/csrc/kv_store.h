// The per-op path's KV store into a q8_0 pool (kernels/kv_cache.py; the fused decode stores its own): each token's
// key and value rows quantized into their slot, as kernels/kv_quant.quantize_q8_0 does, bit for bit.
#pragma once
#include "torch_api.h"

#include "kv_rows.h"

// key/value: [T, Hkv, D] (any float dtype, strided); caches: int8 [blocks, block_size, Hkv, D / 32 * 34];
// slot_mapping: [T] int64, -1 = skip.
void store_kv_q8_0(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor k_cache, torch::Tensor v_cache,
                   const torch::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes(), "key and value: [tokens, kv_heads, head_dim]");
  const int64_t tokens = key.size(0), kv_heads = key.size(1), D = key.size(2);
  TORCH_CHECK(k_cache.scalar_type() == torch::kChar && v_cache.scalar_type() == torch::kChar &&
              k_cache.is_contiguous() && v_cache.is_contiguous(), "a q8_0 pool: contiguous int8, k and v alike");
  check_pool_rows(k_cache, kv_heads, D);
  check_pool_rows(v_cache, kv_heads, D);
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && slot_mapping.numel() == tokens, "slot_mapping: [T] int64");
  const torch::Tensor k = key.to(torch::kFloat).contiguous(), v = value.to(torch::kFloat).contiguous();
  const torch::Tensor slots = slot_mapping.contiguous();
  const int64_t slot_count = k_cache.size(0) * k_cache.size(1), row = kv_heads * D, units = kv_heads * (D / 32);
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slot[t] < slot_count, "slot_mapping past the pool");
  auto* k_pool = reinterpret_cast<KvQ8Block*>(k_cache.data_ptr<int8_t>());
  auto* v_pool = reinterpret_cast<KvQ8Block*>(v_cache.data_ptr<int8_t>());
  const float* k_rows = k.data_ptr<float>();
  const float* v_rows = v.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      store_row(k_pool + slot[t] * units, k_rows + t * row, row);
      store_row(v_pool + slot[t] * units, v_rows + t * row, row);
    }
  });
}
