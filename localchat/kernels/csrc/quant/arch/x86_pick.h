// The x86 kernels' picks (included by arch/avx512/kernels.h and arch/avx2/kernels.h, whose kernels share their names):
// the kernel for a weight of layout L, or null where the ISA has none for it (quant/dispatch.h then takes the
// generic one).
#pragma once

#if LC_SIMD
namespace {
namespace isa {

template <bool FOR_GEMV>
using KernelFn = std::conditional_t<FOR_GEMV, GemvFn, PanelFn>;

template <bool FOR_GEMV>
KernelFn<FOR_GEMV> pick(bool precise, bool symmetric, bool kq, const Layout& L) {
  using Fn = KernelFn<FOR_GEMV>;
  // the instantiation of a kernel template for the precision, as the GEMV or the panel
#define LC_PICK(GEMV, PANEL, ...)                                                               \
  if constexpr (FOR_GEMV) return precise ? Fn(GEMV<true, ##__VA_ARGS__>) : Fn(GEMV<false, ##__VA_ARGS__>); \
  else return precise ? Fn(PANEL<true, ##__VA_ARGS__>) : Fn(PANEL<false, ##__VA_ARGS__>)
  switch (L.file) {
    case kRowMajor:  // u4, u6, u8, row-major or interleaved
      return pick_kernel(precise, symmetric, L.bits(), kq, [](auto p, auto s, auto u, auto k) -> Fn {
        constexpr bool P = decltype(p)::value, S = decltype(s)::value, K = decltype(k)::value;
        constexpr int U = decltype(u)::value;
        if constexpr (FOR_GEMV) return gemv_rows<P, S, U, K>;
        else return panel_dots<P, S, U, K>;
      });
    case kBlocksQ6_K: LC_PICK(gemv_q6k, panel_q6k);
    case kBlocksQ4_K: LC_PICK(gemv_k_blocks, panel_k_blocks, 4);
    case kBlocksQ5_K: LC_PICK(gemv_k_blocks, panel_k_blocks, 5);
    case kBlocksQ8_0: LC_PICK(gemv_q8_0, panel_q8_0);
    case kBlocksQ4_0: LC_PICK(gemv_q4, panel_q4, false, false);
    case kBlocksQ4_1: LC_PICK(gemv_q4, panel_q4, true, false);
    case kBlocksQ5_0: LC_PICK(gemv_q4, panel_q4, false, true);
    case kBlocksQ5_1: LC_PICK(gemv_q4, panel_q4, true, true);
    case kBlocksMXFP4: LC_PICK(gemv_mxfp4, panel_mxfp4);
    default: return nullptr;
  }
#undef LC_PICK
}

GemvFn pick_gemv(bool precise, bool symmetric, bool kq, const Layout& L) {
  return pick<true>(precise, symmetric, kq, L);
}

PanelFn pick_panel(bool precise, bool symmetric, bool kq, const Layout& L) {
  return pick<false>(precise, symmetric, kq, L);
}

}  // namespace isa
}  // namespace
#endif
