// The paged KV pool's float32, float16 and bfloat16 row functions of this build: the ISA's
// (quant/arch/<isa>/kv_rows.h) where it has a function, else the generic one (quant/generic/kv_rows.h, where
// RowType and the functions are described). Each ISA header defines LC_ISA_<FUNCTION> for each function it has.
// Nothing here needs torch.
#pragma once
#include "common.h"
#include "generic/kv_rows.h"
#if LC_VNNI
#include "arch/avx512/kv_rows.h"
#elif LC_AVX2
#include "arch/avx2/kv_rows.h"
#elif LC_NEON
#include "arch/neon/kv_rows.h"
#endif

#ifndef LC_ISA_DOT_ROW
#define LC_ISA_DOT_ROW 0
#endif
#ifndef LC_ISA_DOT_HEADS
#define LC_ISA_DOT_HEADS 0
#endif
#ifndef LC_ISA_ADD_SCALED_ROW
#define LC_ISA_ADD_SCALED_ROW 0
#endif
#ifndef LC_ISA_ADD_ROWS
#define LC_ISA_ADD_ROWS 0
#endif
#ifndef LC_ISA_STORE_ROW
#define LC_ISA_STORE_ROW 0
#endif

namespace {
namespace kv_rows {
#if LC_ISA_DOT_ROW
using isa::dot_row;
#else
using generic::dot_row;
#endif
#if LC_ISA_DOT_HEADS
using isa::dot_heads;
#else
using generic::dot_heads;
#endif
#if LC_ISA_ADD_SCALED_ROW
using isa::add_scaled_row;
#else
using generic::add_scaled_row;
#endif
#if LC_ISA_ADD_ROWS
using isa::add_rows;
#else
using generic::add_rows;
#endif
#if LC_ISA_STORE_ROW
using isa::store_row;
#else
using generic::store_row;
#endif
}  // namespace kv_rows
}  // namespace
