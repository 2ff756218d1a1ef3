// The decode path's element-wise math of this build: the ISA's (quant/arch/<isa>/vector_math.h) where it has a
// function, else the generic one (quant/generic/vector_math.h, where the functions are described). Each ISA header
// defines LC_ISA_<FUNCTION> for each function it has. Nothing here needs torch.
#pragma once
#include "common.h"
#include "generic/vector_math.h"
#if LC_VNNI
#include "arch/avx512/vector_math.h"
#elif LC_AVX2
#include "arch/avx2/vector_math.h"
#elif LC_NEON
#include "arch/neon/vector_math.h"
#endif

#ifndef LC_ISA_SILU_AND_MUL
#define LC_ISA_SILU_AND_MUL 0
#endif
#ifndef LC_ISA_EXP_SHIFTED
#define LC_ISA_EXP_SHIFTED 0
#endif

namespace {
namespace vector_math {
#if LC_ISA_SILU_AND_MUL
using isa::silu_and_mul;
#else
using generic::silu_and_mul;
#endif
#if LC_ISA_EXP_SHIFTED
using isa::exp_shifted;
#else
using generic::exp_shifted;
#endif
}  // namespace vector_math
}  // namespace
