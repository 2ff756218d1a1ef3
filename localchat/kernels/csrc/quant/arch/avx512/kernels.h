// The AVX-512 VNNI kernels (docs/kernels.md): every layout's GEMV and panel, and the row restore.
#pragma once
#include "../../generic/blocks.h"
#include "k_blocks.h"
#include "linear.h"
#include "mxfp4.h"
#include "q4_q5_blocks.h"
#include "q6k.h"
#include "q8_0.h"
#include "restore.h"
#include "../x86_pick.h"

#if LC_VNNI
#define LC_ISA_NAME "avx512-vnni"
#define LC_ISA_RESTORE 1  // dequantize_row(_bf16), u6_chunk_values, gather_pass_row, unpack_row
namespace {
namespace isa {

// This ISA's unpack_row for a type's blocks (generic/blocks.h), or null where the generic one serves.
inline generic::RowUnpackFn unpack_row(Arrangement file) {
  switch (file) {
    case kBlocksQ6_K:
      return [](const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float*) -> const Layout& {
        std::memcpy(codes, row, L.row_bytes(K));
        q6k_row_scales(row, K / L.group_size, scales);
        return L;
      };
    case kBlocksQ4_K:
    case kBlocksQ5_K:
      return [](const Layout& L, const uint8_t* row, int64_t K, uint8_t* codes, float* scales, float* mins)
                 -> const Layout& {
        k_blocks_row(L, row, K, codes, scales, mins);
        return L.file == kBlocksQ5_K ? kU8 : kU4;
      };
    default: return nullptr;
  }
}

}  // namespace isa
}  // namespace
#endif
