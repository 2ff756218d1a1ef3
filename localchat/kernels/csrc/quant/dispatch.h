// Which kernel runs a weight: this build's ISA's (quant/arch/<isa>/kernels.h) where it has one, else the generic one
// (quant/generic/), as ggml-cpu's arch-fallback.h maps what an ISA lacks to the generic functions. Each ISA's
// kernels.h defines isa::pick_gemv and isa::pick_panel (null for a layout it has no kernel for) and LC_ISA_NAME;
// with LC_ISA_RESTORE, its own row restore (dequantize_row, u6_chunk_values, gather_pass_row, unpack_row).
#pragma once
#include "common.h"
#include "generic/blocks.h"
#include "generic/kernels.h"
#include "generic/restore.h"
#if LC_VNNI
#include "arch/avx512/kernels.h"
#elif LC_AVX2
#include "arch/avx2/kernels.h"
#elif LC_NEON
#include "arch/neon/kernels.h"
#endif
#ifndef LC_ISA_NAME
#define LC_ISA_NAME ""
#endif
#ifndef LC_ISA_RESTORE
#define LC_ISA_RESTORE 0
#endif

namespace {
namespace isa {
#if !LC_ISA_RESTORE
using generic::dequantize_row;
using generic::gather_pass_row;
using generic::u6_chunk_values;
inline generic::RowUnpackFn unpack_row(Arrangement) { return nullptr; }
#endif
#if !(LC_VNNI || LC_AVX2 || LC_NEON)
inline GemvFn pick_gemv(bool, bool, bool, const Layout&) { return nullptr; }
inline PanelFn pick_panel(bool, bool, bool, const Layout&) { return nullptr; }
#endif
}  // namespace isa

// The GEMV and the panel kernel for a weight of layout L (symmetric: without mins; kq: K-quant scales): this ISA's,
// else the generic one; with vector=false, the generic one.
GemvFn pick_gemv(bool precise, bool symmetric, bool kq, const Layout& L, bool vector = true) {
  const GemvFn own = vector ? isa::pick_gemv(precise, symmetric, kq, L) : nullptr;
  return own ? own : generic::pick_gemv(precise, symmetric, kq, L);
}

PanelFn pick_panel(bool precise, bool symmetric, bool kq, const Layout& L, bool vector = true) {
  const PanelFn own = vector ? isa::pick_panel(precise, symmetric, kq, L) : nullptr;
  return own ? own : generic::pick_panel(precise, symmetric, kq, L);
}

// The row unpack of a type's blocks: this ISA's, else the generic one.
inline generic::RowUnpackFn unpack_row(Arrangement file) {
  const generic::RowUnpackFn own = isa::unpack_row(file);
  return own ? own : generic::kUnpackRow[file - 2];
}

}  // namespace
