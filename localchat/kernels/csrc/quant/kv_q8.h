// The q8_0 KV pool's row functions of this build: the ISA's (quant/arch/<isa>/kv_q8.h) where it has them, else the
// generic ones (quant/generic/kv_q8.h, where KvQ8Block and the functions are described). Nothing here needs torch.
#pragma once
#include "common.h"
#include "generic/kv_q8.h"
#if LC_VNNI
#include "arch/avx512/kv_q8.h"
#elif LC_AVX2
#include "arch/avx2/kv_q8.h"
#elif LC_NEON
#include "arch/neon/kv_q8.h"
#endif
#ifndef LC_KV_Q8_ISA
#define LC_KV_Q8_ISA 0
#endif

namespace {
namespace kv_q8 {
#if LC_KV_Q8_ISA
using isa::kv_q8_add_rows;
using isa::kv_q8_dot;
using isa::kv_q8_quantize;
#else
using generic::kv_q8_add_rows;
using generic::kv_q8_dot;
using generic::kv_q8_quantize;
#endif
}  // namespace kv_q8
}  // namespace
