// The rate of one file-block type's GEMV (a decode's projection) on one thread, without torch: a fast loop
// for kernel work (seconds to build, where the extension takes one to two minutes), run from the repository root:
//
//   g++ -std=c++17 -O2 -march=native -I localchat/kernels/csrc benchmarks/gemv_rate.cpp -o /tmp/gemv_rate
//   /tmp/gemv_rate Q4_K 256 2048     # type, rows, columns: 0.3 MB, in L2
//   /tmp/gemv_rate Q4_K 32768 2048   # 38 MB, from DRAM
//   /tmp/gemv_rate Q4_K 256 2048 generic   # the generic kernel instead of this build's ISA's
//
// Random blocks (each block's float16 d, and dmin or m, or MXFP4's exponent set to a normal value), random
// activations quantized as the extension quantizes them (one int8 code each, a large model's decode); the best of
// 30 runs, three times, as GB/s of weights read. A GEMV whose rate does not fall from the L2-sized weight to the
// DRAM-sized one is bound by its instructions, not by memory. (On a noisy VM, compare variants inside one run.)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "quant/dispatch.h"

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 5 && std::string(argv[4]) == "generic")) {
    std::fprintf(stderr, "usage: gemv_rate TYPE ROWS COLUMNS [generic] (TYPE: a row of quant/types.def)\n");
    return 2;
  }
  int type = -1;
  for (int t = 0; t < kQuantTypeCount; ++t) {
    if (std::string(kQuantTypes[t].name) == argv[1]) type = t;
  }
  const int64_t N = std::atoll(argv[2]), K = std::atoll(argv[3]);
  if (type < 0 || N < 1 || K < 1) {
    std::fprintf(stderr, "unknown type, or rows and columns not positive\n");
    return 2;
  }
  const QuantTraits& q = kQuantTypes[type];
  const Arrangement file = static_cast<Arrangement>(type + 2);
  if (K % q.block_weights != 0) {
    std::fprintf(stderr, "columns must be a multiple of %ld for %s\n", static_cast<long>(q.block_weights), q.name);
    return 2;
  }
  const Layout L = make_layout(q.bits, q.group_size, file);
  const int64_t row_bytes = L.row_bytes(K), blocks = K / q.block_weights;
  std::mt19937 rng(1);
  std::vector<uint8_t> w(N * row_bytes);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t scale = float_to_half_bits(0.01f);
  for (int64_t b = 0; b < N * blocks; ++b) {  // float16 scales first in a block, last in Q6_K's; MXFP4's E8M0
    uint8_t* block = w.data() + b * q.block_bytes;
    if (file == kBlocksMXFP4) {
      block[0] = 127 - 7;  // 2^-7
    } else if (file == kBlocksQ6_K) {
      std::memcpy(block + q.block_bytes - 2, &scale, 2);
    } else {
      std::memcpy(block, &scale, 2);
      if (q.mins) std::memcpy(block + 2, &scale, 2);  // dmin (K-quants) or m (Q4_1, Q5_1)
    }
  }
  std::vector<float> x(K);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = normal(rng);
  ActivationBuffers act(1, K, L);
  quantize_row(x.data(), K, L, act.chunks, false, q.zero_point, act.rows[0]);
  std::vector<float> out(N);
  const bool symmetric = !q.mins, kq = q.k_scales;
  auto rate = [&](GemvFn gemv) {
    double best = 1e30;
    for (int run = 0; run < 30; ++run) {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t n = 0; n < N; n += kRowsPerPass) {
        const PassView v = pass_view(w.data(), nullptr, nullptr, nullptr, n, N, row_bytes, K / L.group_size, false);
        gemv(v, row_bytes, K / L.group_size, act.chunks, L.code_bytes(K), L, act.rows[0],
             static_cast<int>(std::min<int64_t>(kRowsPerPass, N - n)), out.data() + n);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return N * row_bytes / best / 1e9;
  };
  const bool vector = argc == 4;
  const GemvFn gemv = pick_gemv(false, symmetric, kq, L, vector);
  const char* isa = vector && LC_ISA_NAME[0] ? LC_ISA_NAME : "generic";
  for (int round = 0; round < 3; ++round) {
    std::printf("%s %ld x %ld (%.2f MB), %s: %.2f GB/s\n", q.name, static_cast<long>(N), static_cast<long>(K),
                N * row_bytes / 1e6, isa, rate(gemv));
  }
  return 0;
}
