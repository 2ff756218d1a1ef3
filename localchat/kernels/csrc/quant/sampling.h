// The sampler's passes over a row of logits of this build: the ISA's (quant/arch/<isa>/sampling.h) where it has a
// function, else the generic one (quant/generic/sampling.h, where the functions are described). Each ISA header
// defines LC_ISA_<FUNCTION> for each function it has. Nothing here needs torch.
#pragma once
#include "common.h"
#include "generic/sampling.h"
#if LC_VNNI
#include "arch/avx512/sampling.h"
#elif LC_AVX2
#include "arch/avx2/sampling.h"
#elif LC_NEON
#include "arch/neon/sampling.h"
#endif

#ifndef LC_ISA_ARGMAX
#define LC_ISA_ARGMAX 0
#endif
#ifndef LC_ISA_WEIGH
#define LC_ISA_WEIGH 0
#endif

namespace {
namespace sampling_rows {
#if LC_ISA_ARGMAX
using isa::argmax;
#else
using generic::argmax;
#endif
#if LC_ISA_WEIGH
using isa::weigh;
#else
using generic::weigh;
#endif
}  // namespace sampling_rows
}  // namespace
