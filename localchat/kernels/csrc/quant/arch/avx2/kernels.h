// The AVX2 kernels (docs/kernels.md): every layout's GEMV and panel.
#pragma once
#include "k_blocks.h"
#include "linear.h"
#include "mxfp4.h"
#include "q4_q5_blocks.h"
#include "q6k.h"
#include "q8_0.h"
#include "../x86_pick.h"

#if LC_AVX2
#define LC_ISA_NAME "avx2"
#endif
