// The vector API of this build (namespace vec; docs/kernels.md): the ISA's (quant/arch/<isa>/vec.h) or, in the generic
// build, the plain C++ one (quant/generic/vec.h, where each function is described). The float loops of kv_rows.h,
// kv_q8.h, vector_math.h and sampling.h are written once against it. LC_VEC says whether it is an ISA's (the pickers
// then take those loops, else the plain C++ functions of quant/generic/). Nothing here needs torch.
#pragma once
#include "common.h"
#if LC_VNNI
#include "arch/avx512/vec.h"
#elif LC_AVX2
#include "arch/avx2/vec.h"
#elif LC_NEON
#include "arch/neon/vec.h"
#else
#include "generic/vec.h"
#endif
#define LC_VEC (LC_VNNI || LC_AVX2 || LC_NEON)

static_assert(32 % vec::kWidth == 0, "a q8_0 block of 32 values is whole vectors");
static_assert((vec::kWidth * vec::kColumns) % 32 == 0 || 32 % (vec::kWidth * vec::kColumns) == 0,
              "a run of columns (kv_q8.h) starts a q8_0 block or lies in one");
