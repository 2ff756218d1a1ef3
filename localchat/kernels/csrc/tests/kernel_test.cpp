// Every kernel of this build's ISA against the generic one (quant/generic/), without torch, so that it builds for
// another CPU: tests/kernels/cpu/test_kernel_isas.py builds it natively (AVX-512 VNNI, AVX2) and for ARM with
// aarch64-linux-gnu-g++, running the ARM build under qemu-user.
//
//   g++ -std=c++17 -O2 -march=native -I localchat/kernels/csrc kernel_test.cpp -o kernel_test && ./kernel_test
//   aarch64-linux-gnu-g++ -std=c++17 -O2 -march=armv8.2-a+dotprod -static -I ... && qemu-aarch64 ./kernel_test
//
// For every layout (u4, u6 and u8, row-major and interleaved, with float16 scales, mins or a zero point, or K-quant
// scales; every type's blocks in types.def) and both activation precisions, a decode (the GEMV, a pass of rows at a
// time) and a panel (several activation rows), on random weights and activations with an outlier:
// - the GEMV and the panel of an ISA give the same bits (a row's result does not depend on its batch), and so do the
//   generic ones;
// - an ISA that keeps the generic order (NEON) gives the generic results bit for bit; the x86 kernels, which sum in
//   other lanes, within float rounding; and on representable values (power-of-two scales, activations that quantize
//   to themselves), where every sum is exact, all of them bit for bit;
// - the row restore (unpack_row) and float_to_half give the generic values;
// - the loops written once against the vector API (namespace vec: this ISA's quant/arch/<isa>/vec.h, one lane of
//   quant/generic/vec.h in the generic build) against the plain C++ functions of quant/generic/:
// - the q8_0 KV rows (quant/kv_q8.h): the quantize gives the generic codes and scales bit for bit, the key dot
//   products and value sums the generic ones within float rounding.
// - the float32, float16 and bfloat16 KV rows (quant/kv_rows.h): the store gives the generic bits, the key dot
//   products and value sums the generic ones within float rounding;
// - the decode path's SiLU and softmax exp (quant/vector_math.h) and the sampler's passes (quant/sampling.h): the
//   exp within 2e-6 of std::exp's, the same argmax (NaN never winning), the likely ids of its own weights.
// Prints a line per layout and exits non-zero on any difference.
#include <cstdio>
#include <random>
#include <string>

#include "../quant/dispatch.h"
#include "../quant/kv_q8.h"
#include "../quant/kv_rows.h"
#include "../quant/restore.h"
#include "../quant/sampling.h"
#include "../quant/vector_math.h"

namespace {

std::mt19937 rng(1234);
int failures = 0;

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Where each type's float16 fields lie in its block (the test sets them to sane values: random bits can be inf).
struct BlockFields {
  const char* type;
  std::vector<int> halves;  // offsets of float16 values
  int e8m0 = -1;            // offset of an E8M0 scale byte, or -1
};
const BlockFields kBlockFields[] = {
    {"Q6_K", {208}}, {"Q4_K", {0, 2}}, {"Q5_K", {0, 2}}, {"Q8_0", {0}}, {"Q4_0", {0}},
    {"Q4_1", {0, 2}}, {"Q5_0", {0}},   {"Q5_1", {0, 2}}, {"MXFP4", {}, 0},
};

// A weight in some layout, as the kernels read it.
struct Weight {
  std::string name;
  Layout L;
  int64_t N, K;
  std::vector<uint8_t> q, kscales, kmins;
  std::vector<uint16_t> scales, mins, supers;
  int zero_point = 0;
  bool has_mins = false, k_scales = false, interleaved = false;

  int64_t w_row() const { return L.row_bytes(K); }
  int64_t groups() const { return K / L.group_size; }
  const void* scale_ptr() const { return k_scales ? static_cast<const void*>(kscales.data()) : scales.data(); }
  const void* min_ptr() const {
    if (!has_mins) return nullptr;
    return k_scales ? static_cast<const void*>(kmins.data()) : mins.data();
  }
  PassView view(int64_t n) const {
    return pass_view(q.data(), scale_ptr(), min_ptr(), k_scales ? supers.data() : nullptr, n, N, w_row(), groups(),
                     interleaved);
  }
};

uint16_t half_of(float x) { return float_to_half_bits(x); }

// (exact: one power of two for every group, so that all terms are multiples of one unit)
float small_scale(bool exact) { return exact ? 0x1p-8f : uniform(1e-4f, 2e-2f); }

Weight repacked(const std::string& name, int bits, int group, int64_t N, int64_t K, int zero_point, bool mins,
                bool k_scales, bool exact) {
  Weight w{name, make_layout(bits, group), N, K};
  const int top = bits == 4 ? 16 : bits == 6 ? 64 : 256;
  std::vector<uint8_t> codes(N * K);
  for (auto& c : codes) c = static_cast<uint8_t>(exact && bits == 8 ? integer(0, 31) : integer(0, top - 1));
  if (bits == 4) {  // byte j of a group: weight j low, j + 16 high
    w.q.resize(N * K / 2);
    for (int64_t i = 0; i < N * K / 32; ++i) {
      for (int j = 0; j < 16; ++j) w.q[16 * i + j] = codes[32 * i + j] | (codes[32 * i + 16 + j] << 4);
    }
  } else if (bits == 6) {  // packed_weight.py's pack_u6, chunk by chunk
    w.q.resize(N * (K / 2 + K / 4));
    for (int64_t n = 0; n < N; ++n) {
      uint8_t* row = w.q.data() + n * (K / 2 + K / 4);
      const uint8_t* c = codes.data() + n * K;
      for (int64_t g = 0; g < K / 16; ++g) {
        for (int i = 0; i < 8; ++i) row[8 * g + i] = (c[16 * g + i] & 15) | ((c[16 * g + 8 + i] & 15) << 4);
      }
      for (int64_t ch = 0; ch < K / 128; ++ch) {
        const uint8_t* cc = c + 128 * ch;
        auto at = [&](int vector, int p) { return cc[(p / 8) * 16 + vector * 8 + p % 8] >> 4; };  // (lo/hi vectors)
        for (int j = 0; j < 32; ++j) {
          row[K / 2 + 32 * ch + j] =
              static_cast<uint8_t>(at(0, j) | (at(0, 32 + j) << 2) | (at(1, j) << 4) | (at(1, 32 + j) << 6));
        }
      }
    }
  } else {
    w.q = codes;
  }
  const int64_t groups = K / group;
  w.zero_point = mins || k_scales ? 0 : zero_point;
  w.has_mins = mins || k_scales;
  w.k_scales = k_scales;
  if (k_scales) {
    w.kscales.resize(N * groups);
    w.kmins.resize(N * groups / 2);
    w.supers.resize(N * groups / 4);
    for (auto& b : w.kscales) b = static_cast<uint8_t>(exact ? integer(0, 3) : integer(0, 255));
    for (auto& b : w.kmins) b = static_cast<uint8_t>(exact ? 0 : integer(0, 255));
    for (auto& h : w.supers) h = half_of(small_scale(exact));
  } else {
    w.scales.resize(N * groups);
    for (auto& h : w.scales) h = half_of(small_scale(exact));
    if (mins) {
      w.mins.resize(N * groups);
      for (auto& h : w.mins) h = half_of(exact ? -std::ldexp(1.f, integer(-6, -3)) : uniform(-0.1f, 0.f));
    }
  }
  return w;
}

// The weight in the interleaved arrangement (quant_linear.h's interleave_weight, without torch).
Weight interleaved(Weight w) {
  auto each_block = [&](auto* base, int64_t width, int64_t unit) {
    using T = std::remove_pointer_t<decltype(base)>;
    std::vector<T> scratch(kRowsPerPass * width);
    for (int64_t b = 0; b < w.N / kRowsPerPass; ++b) {
      interleave_block(base + b * kRowsPerPass * width, width, unit, false, scratch.data());
    }
  };
  const int64_t groups = w.groups();
  each_block(w.q.data(), w.w_row(), kChunkBytes);
  if (w.k_scales) {
    each_block(w.kscales.data(), groups, kGroupBlock);
    each_block(w.kmins.data(), groups / 2, kGroupBlock / 2);
    each_block(w.supers.data(), super_row(groups), kSupersPerBlock);
  } else {
    each_block(w.scales.data(), groups, kGroupBlock);
    if (w.has_mins) each_block(w.mins.data(), groups, kGroupBlock);
  }
  w.interleaved = true;
  w.name += " interleaved";
  return w;
}

Weight blocks(int type, int64_t N, int64_t K, bool exact) {
  const QuantTraits& t = kQuantTypes[type];
  const Arrangement file = static_cast<Arrangement>(type + 2);
  Weight w{std::string(t.name) + " blocks", make_layout(t.bits, t.group_size, file), N, K};
  w.q.resize(N * K / t.block_weights * t.block_bytes);
  for (auto& b : w.q) b = static_cast<uint8_t>(integer(0, 255));
  const BlockFields* fields = nullptr;
  for (const auto& f : kBlockFields) {
    if (std::string(f.type) == t.name) fields = &f;
  }
  if (!fields) {
    std::printf("FAIL %s: add its block's scale fields to kBlockFields\n", t.name);
    ++failures;
    return w;
  }
  for (int64_t b = 0; b < N * K / t.block_weights; ++b) {
    uint8_t* block = w.q.data() + b * t.block_bytes;
    for (int offset : fields->halves) {
      const uint16_t h = half_of(exact ? small_scale(true) : uniform(-2e-3f, 2e-3f));
      std::memcpy(block + offset, &h, 2);
    }
    if (fields->e8m0 >= 0) block[fields->e8m0] = static_cast<uint8_t>(exact ? 120 : integer(110, 130));
    if (exact && t.k_scales) {  // small sub-scales, no sub-mins: every product exact
      for (int i = 4; i < 16; ++i) block[i] = static_cast<uint8_t>(integer(0, 3));
    }
    if (exact && t.mins && !t.k_scales) {
      const uint16_t m = half_of(-std::ldexp(1.f, integer(-6, -3)));
      std::memcpy(block + 2, &m, 2);
    }
    if (exact && std::string(t.name) == "Q6_K") {
      for (int i = 0; i < 16; ++i) block[kQ6KSubScales + i] = static_cast<uint8_t>(integer(-2, 2));
    }
  }
  w.zero_point = t.zero_point;
  return w;
}

// Activation rows: random floats with an outlier, or (exact) integers whose 32-blocks peak at 127.
std::vector<float> activations(int64_t M, int64_t K, bool exact) {
  std::vector<float> x(M * K);
  for (auto& v : x) v = exact ? static_cast<float>(integer(-15, 15)) : uniform(-1.f, 1.f);
  for (int64_t b = 0; exact && b < M * K / 32; ++b) x[32 * b + integer(0, 31)] = 127.f;
  if (!exact) x[3] = 25.f;
  return x;
}

bool same(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Every output of a weight: the GEMV per pass, then a panel of all activation rows; into gemv[M * N] / panel[M * N].
void run(const Weight& w, const std::vector<ActivationRow>& acts, bool vector, std::vector<float>& gemv,
         std::vector<float>& panel, bool& has_isa) {
  const int64_t M = static_cast<int64_t>(acts.size()), chunks = (w.K + w.L.chunk_values - 1) / w.L.chunk_values;
  const bool precise = acts[0].precise;
  const GemvFn own_gemv = isa::pick_gemv(precise, !w.has_mins, w.k_scales, w.L);
  const PanelFn own_panel = isa::pick_panel(precise, !w.has_mins, w.k_scales, w.L);
  has_isa = own_gemv != nullptr && own_panel != nullptr;
  const GemvFn g = vector && own_gemv ? own_gemv : generic::pick_gemv(precise, !w.has_mins, w.k_scales, w.L);
  const PanelFn p = vector && own_panel ? own_panel : generic::pick_panel(precise, !w.has_mins, w.k_scales, w.L);
  gemv.assign(M * w.N, 0.f);
  panel.assign(M * w.N, 0.f);
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  std::vector<Line> scratch(M * kPanelScratchPerRow / sizeof(Line) + 1);
  for (int64_t n = 0; n < w.N; n += kRowsPerPass) {
    const int count = static_cast<int>(std::min<int64_t>(kRowsPerPass, w.N - n));
    const PassView v = w.view(n);
    for (int64_t m = 0; m < M; ++m) {
      float dots[kRowsPerPass];
      g(v, w.w_row(), w.groups(), chunks, w.L.code_bytes(w.K), w.L, acts[m], count, dots);
      for (int r = 0; r < count; ++r) gemv[m * w.N + n + r] = dots[r];
    }
    std::vector<float> dots(M * kRowsPerPass);
    p(v, w.groups(), chunks, w.L.code_bytes(w.K), w.L, acts.data(), M, count, dots.data(), kRowsPerPass,
      scratch.data());
    for (int64_t m = 0; m < M; ++m) {
      for (int r = 0; r < count; ++r) panel[m * w.N + n + r] = dots[m * kRowsPerPass + r];
    }
  }
}

void check(const Weight& w, bool exact) {
  const int64_t M = 5;
  const std::vector<float> x = activations(M, w.K, exact);
  for (bool precise : {true, false}) {
    ActivationBuffers buffers(M, w.K, w.L);
    for (int64_t m = 0; m < M; ++m) {
      quantize_row(x.data() + m * w.K, w.K, w.L, buffers.chunks, precise, w.has_mins ? 0 : w.zero_point,
                   buffers.rows[m]);
    }
    std::vector<float> gemv, panel, ref_gemv, ref_panel;
    bool has_isa = false, unused;
    run(w, buffers.rows, true, gemv, panel, has_isa);
    run(w, buffers.rows, false, ref_gemv, ref_panel, unused);
    float scale = 0.f;
    for (float v : ref_gemv) scale = std::max(scale, std::fabs(v));
    int bad = 0, inexact = 0;
    float worst = 0.f;
    for (size_t i = 0; i < gemv.size(); ++i) {
      if (!same(gemv[i], panel[i]) || !same(ref_gemv[i], ref_panel[i])) ++bad;  // a row's result, whatever its batch
      const float diff = std::fabs(gemv[i] - ref_gemv[i]);
      worst = std::max(worst, diff);
      if (!same(gemv[i], ref_gemv[i])) ++inexact;
    }
    // NEON keeps the generic order; the x86 kernels sum in other lanes (float rounding), except on exact values
    const bool must_equal = LC_NEON || exact;
    if (must_equal && inexact) ++bad;
    if (!must_equal && worst > 2e-5f * scale) ++bad;
    std::printf("%s %-34s %s %-7s %s: %s (largest difference %.3g of %.3g)\n", bad ? "FAIL" : "ok  ", w.name.c_str(),
                exact ? "exact " : "random", precise ? "precise" : "int8", has_isa ? LC_ISA_NAME : "generic only",
                !inexact ? "bit for bit" : bad ? "differs" : "within rounding", worst, scale);
    failures += bad != 0;
  }
  if (w.L.file_blocks()) {  // the row restore: this ISA's unpack_row gives the generic values
    std::vector<uint8_t> a(std::max(w.w_row(), w.K)), b(a.size());
    std::vector<float> sa(w.groups()), sb(w.groups()), ma(w.groups()), mb(w.groups());
    for (int64_t n = 0; n < w.N; ++n) {
      const uint8_t* row = w.q.data() + n * w.w_row();
      const Layout& la = unpack_row(w.L.file)(w.L, row, w.K, a.data(), sa.data(), ma.data());
      const Layout& lb = generic::kUnpackRow[w.L.file - 2](w.L, row, w.K, b.data(), sb.data(), mb.data());
      const bool equal = la.nibbles == lb.nibbles && std::memcmp(a.data(), b.data(), la.row_bytes(w.K)) == 0 &&
                         std::memcmp(sa.data(), sb.data(), 4 * sa.size()) == 0 &&
                         (!w.L.block_mins() || std::memcmp(ma.data(), mb.data(), 4 * ma.size()) == 0);
      if (!equal) {
        std::printf("FAIL %s: row %lld restores otherwise than the generic unpack_row\n", w.name.c_str(),
                    static_cast<long long>(n));
        ++failures;
        break;
      }
    }
  }
}

void check_half_conversion() {
  int bad = 0;
  std::vector<uint32_t> bits = {0, 0x80000000u, 0x33000000u, 0x33000001u, 0x38800000u, 0x387FFFFFu, 0x477FEFFFu,
                                0x477FF000u, 0x7F800000u, 0x3F800000u, 0x3A800000u};
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<uint32_t>(rng()) & 0xBFFFFFFFu);
  for (uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
#if defined(__F16C__)
    const uint16_t hardware = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#elif defined(__aarch64__)
    const __fp16 h16 = static_cast<__fp16>(f);
    uint16_t hardware;
    std::memcpy(&hardware, &h16, 2);
#else
    const uint16_t hardware = float_to_half_bits(f);
#endif
    if (hardware != float_to_half_bits(f)) ++bad;
    const uint16_t h = float_to_half_bits(f);
    if ((h & 0x7C00) != 0x7C00 && !same(half_to_float(h), half_to_float(h))) ++bad;
  }
  std::printf("%s float32 -> float16 rounding: %zu values%s\n", bad ? "FAIL" : "ok  ", bits.size(),
              bad ? ", differing from the hardware's" : ", the hardware's");
  failures += bad != 0;
}

// The q8_0 KV row functions on this build's vector API (vec::, kv_q8:: of an ISA build) against the generic ones.
template <int G>
int check_kv_q8_group(const std::vector<KvQ8Block>& rows, int64_t D, int64_t count, int64_t row) {
  int bad = 0;
  std::vector<float> q(G * D), w(G * count);
  for (auto& x : q) x = uniform(-2.f, 2.f);
  for (auto& x : w) x = uniform(0.f, 1.f);
  for (int64_t j = 0; j < count; ++j) {
    float got[G], want[G];
    vec::kv_q8_dot<G>(q.data(), rows.data() + j * row, D, 0.125f, got, 1);
    generic::kv_q8_dot<G>(q.data(), rows.data() + j * row, D, 0.125f, want, 1);
    for (int g = 0; g < G; ++g) bad += std::fabs(got[g] - want[g]) > 1e-5f * (1.f + std::fabs(want[g]));
  }
  std::vector<float> got(G * D, 0.5f), want(G * D, 0.5f);
  vec::kv_q8_add_rows<G>(rows.data(), row, count, w.data(), count, D, got.data(), D);
  generic::kv_q8_add_rows<G>(rows.data(), row, count, w.data(), count, D, want.data(), D);
  for (int64_t i = 0; i < G * D; ++i) bad += std::fabs(got[i] - want[i]) > 1e-5f * (1.f + std::fabs(want[i]));
  return bad;
}

void check_kv_q8() {
  for (int64_t D : {int64_t{32}, int64_t{64}, int64_t{96}, int64_t{128}, int64_t{256}}) {
    const int64_t count = 13, heads = 3, row = heads * D / 32;  // a run of 13 tokens' rows, 3 KV heads each
    std::vector<float> x(count * heads * D);
    for (auto& v : x) v = uniform(-1.f, 1.f) * (integer(0, 9) == 0 ? 40.f : 1.f);
    std::fill(x.begin(), x.begin() + 32, 0.f);  // a block of zeros: scale 0, codes 0
    for (int i = 0; i < 32; ++i) x[32 + i] = 0.5f * static_cast<float>(i - 16);  // ties x / d = k + 0.5
    x[32 + 31] = 127.f;                                                          // (d = 1)
    std::vector<KvQ8Block> got(x.size() / 32), want(x.size() / 32);
    vec::kv_q8_quantize(x.data(), static_cast<int64_t>(x.size()), got.data());
    generic::kv_q8_quantize(x.data(), static_cast<int64_t>(x.size()), want.data());
    int bad = std::memcmp(got.data(), want.data(), got.size() * sizeof(KvQ8Block)) != 0;
    bad += want[1].qs[1] != -8 || want[1].qs[3] != -6 || want[1].qs[31] != 127;  // -7.5, -6.5: to even
    bad += check_kv_q8_group<1>(want, D, count, row) + check_kv_q8_group<2>(want, D, count, row) +
           check_kv_q8_group<3>(want, D, count, row) + check_kv_q8_group<4>(want, D, count, row);
    std::printf("%s q8_0 KV rows, head_dim %-3lld %s\n", bad ? "FAIL" : "ok  ", static_cast<long long>(D),
                LC_VEC ? "the ISA's quantize, dot and sums" : "one lane's quantize, dot and sums");
    failures += bad != 0;
  }
}

// |got - want| within tol of magnitude (the sum of the terms' sizes)
bool near(float got, float want, float tol, float magnitude) {
  return std::fabs(got - want) <= tol * (1.f + magnitude);
}

const char* row_type_name(RowType R) {
  return R == RowType::kFloat ? "float32" : R == RowType::kHalf ? "float16" : "bfloat16";
}

// reduce_add_lanes against reduce_add, vector by vector: the same bits (the dot products of a chunk of keys take it
// where one key at a time takes reduce_add)
void check_reduce_add_lanes() {
  int bad = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(vec::kWidth * vec::kWidth);
    for (auto& v : x) v = uniform(-1.f, 1.f) * std::ldexp(1.f, integer(-20, 20));
    vec::Partial parts[vec::kWidth];
    for (int i = 0; i < vec::kWidth; ++i) parts[i] = vec::partial_sum(vec::load(x.data() + i * vec::kWidth));
    float lanes[vec::kWidth];
    vec::store(lanes, vec::reduce_add_lanes(parts));
    for (int i = 0; i < vec::kWidth; ++i) {
      const float want = vec::reduce_add(vec::load(x.data() + i * vec::kWidth));
      bad += std::memcmp(&lanes[i], &want, sizeof want) != 0;
    }
  }
  std::printf("%s reduce_add_lanes: reduce_add's bits in every lane\n", bad ? "FAIL" : "ok  ");
  failures += bad != 0;
}

// The KV row functions on this build's vector API (vec::, kv_rows:: of an ISA build) for G heads against the
// generic ones.
template <int G, RowType R>
int check_kv_rows_group(const std::vector<RowElement<R>>& rows, int64_t D, int64_t count, int64_t row) {
  int bad = 0;
  std::vector<float> q(G * D), w(G * count);
  for (auto& x : q) x = uniform(-2.f, 2.f);
  for (auto& x : w) x = uniform(0.f, 1.f);
  for (int64_t j = 0; j < count; ++j) {
    const RowElement<R>* k = rows.data() + j * row;
    float got[G], want[G];
    vec::dot_heads<G, R>(q.data(), k, D, 0.125f, got, 1);
    generic::dot_heads<G, R>(q.data(), k, D, 0.125f, want, 1);
    for (int g = 0; g < G; ++g) {
      float magnitude = 0.f;
      for (int64_t i = 0; i < D; ++i) magnitude += std::fabs(q[g * D + i] * widen<R>(k[i]));
      bad += !near(got[g], want[g], 1e-5f, 0.125f * magnitude);
      bad += !near(vec::dot_row<R>(q.data() + g * D, k, D), generic::dot_row<R>(q.data() + g * D, k, D), 1e-5f,
                   magnitude);
    }
  }
  // a chunk of keys at once: dot_heads' bits, key by key
  const int64_t available = static_cast<int64_t>(rows.size()) / row;
  for (int count : {1, 5, kDotKeys}) {
    const RowElement<R>* keys[kDotKeys];
    for (int j = 0; j < count; ++j) keys[j] = rows.data() + (j * 7 % available) * row;  // (any rows, in any order)
    std::vector<float> got(G * kDotKeys, -1.f), want(G * kDotKeys, -1.f);
    vec::dot_keys<G, R>(q.data(), keys, count, D, 0.125f, got.data(), kDotKeys);
    for (int j = 0; j < count; ++j) vec::dot_heads<G, R>(q.data(), keys[j], D, 0.125f, want.data() + j, kDotKeys);
    bad += std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0;
  }
  std::vector<float> got(G * D, 0.5f), want(G * D, 0.5f), magnitude(G * D, 0.5f);
  vec::add_rows<G, R>(rows.data(), row, count, w.data(), count, D, got.data(), D);
  generic::add_rows<G, R>(rows.data(), row, count, w.data(), count, D, want.data(), D);
  for (int g = 0; g < G; ++g) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t i = 0; i < D; ++i) magnitude[g * D + i] += std::fabs(w[g * count + j] * widen<R>(rows[j * row + i]));
    }
  }
  for (int64_t i = 0; i < G * D; ++i) bad += !near(got[i], want[i], 1e-5f, magnitude[i]);
  std::vector<float> acc(D, 0.25f), ref(D, 0.25f);
  vec::add_scaled_row<R>(acc.data(), w[0], rows.data(), D);
  generic::add_scaled_row<R>(ref.data(), w[0], rows.data(), D);
  for (int64_t i = 0; i < D; ++i) bad += !near(acc[i], ref[i], 1e-6f, 0.25f + std::fabs(widen<R>(rows[i])));
  return bad;
}

template <RowType R>
void check_kv_rows() {
  for (int64_t D : {int64_t{16}, int64_t{64}, int64_t{72}, int64_t{80}, int64_t{128}, int64_t{256}}) {
    const int64_t count = 13, heads = 3, row = heads * D;  // a run of 13 tokens' rows, 3 KV heads each
    std::vector<float> x(count * row);
    for (auto& v : x) v = uniform(-1.f, 1.f) * (integer(0, 9) == 0 ? 40.f : 1.f);
    x[1] = 1e-6f, x[2] = -70000.f, x[3] = 1.00048828125f, x[4] = 1.000732421875f;  // subnormal, inf, ties to even
    std::vector<RowElement<R>> got(x.size()), want(x.size());
    vec::store_row<R>(got.data(), x.data(), static_cast<int64_t>(x.size()));
    generic::store_row<R>(want.data(), x.data(), static_cast<int64_t>(x.size()));
    int bad = std::memcmp(got.data(), want.data(), got.size() * sizeof(RowElement<R>)) != 0;
    if (R != RowType::kFloat) want[2] = narrow<R>(-1.f);  // (no inf in the sums)
    bad += check_kv_rows_group<1, R>(want, D, count, row) + check_kv_rows_group<2, R>(want, D, count, row) +
           check_kv_rows_group<3, R>(want, D, count, row) + check_kv_rows_group<4, R>(want, D, count, row);
    std::printf("%s %-8s KV rows, head_dim %-3lld %s\n", bad ? "FAIL" : "ok  ", row_type_name(R),
                static_cast<long long>(D),
                LC_VEC ? "the ISA's store (the same bits), dots and sums (within 1e-5), chunks' dots (the same bits)"
                       : "one lane's store (the same bits), dots and sums (within 1e-5), chunks' dots (the same bits)");
    failures += bad != 0;
  }
}

// The decode path's SiLU and exp, and the sampler's passes, on this build's vector API against the generic ones.
void check_vector_math_and_sampling() {
  int bad = 0;
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{77}, int64_t{256}}) {
    std::vector<float> gate(n), up(n), got(n), want(n);
    for (auto& v : gate) v = uniform(-20.f, 20.f);
    for (auto& v : up) v = uniform(-1.f, 1.f);
    vec::silu_and_mul(gate.data(), up.data(), got.data(), n);
    generic::silu_and_mul(gate.data(), up.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) bad += std::fabs(got[i] - want[i]) > 2e-6f * std::fabs(want[i]);
    std::vector<float> scores(n);
    for (auto& v : scores) v = uniform(-30.f, 5.f);
    scores[0] = -200.f;  // (underflows to 0)
    float top = -INFINITY;
    for (float v : scores) top = std::max(top, v);
    std::vector<float> e = scores, ref = scores;
    const float total = vec::exp_shifted(e.data(), n, top);
    const float ref_total = generic::exp_shifted(ref.data(), n, top);
    for (int64_t i = 0; i < n; ++i) bad += std::fabs(e[i] - ref[i]) > 2e-6f * ref[i] + 1e-37f;
    bad += std::fabs(total - ref_total) > 1e-5f * ref_total;
  }
  std::printf("%s SiLU and softmax exp: %s\n", bad ? "FAIL" : "ok  ",
              LC_VEC ? "the ISA's, within 2e-6 of std::exp" : "one lane's, within 2e-6 of std::exp");
  failures += bad != 0;
  bad = 0;
  for (int64_t n : {int64_t{5}, int64_t{16}, int64_t{1000}, int64_t{4099}}) {
    std::vector<float> logits(n);
    for (auto& v : logits) v = uniform(-10.f, 10.f);
    logits[n / 3] = -INFINITY;
    logits[n - 1] = 12.f;
    if (n > 100) logits[n / 2] = 12.f;  // a tie: the first wins
    bad += vec::argmax(logits.data(), n) != generic::argmax(logits.data(), n);
    if (n > 100) {  // a NaN after the maximum, in its lane (the lanes' maxima must skip it, not restart from it)
      std::vector<float> with_nan = logits;
      with_nan[n - 1] = 0.f, with_nan[n / 2 + 32] = NAN;
      bad += vec::argmax(with_nan.data(), n) != generic::argmax(with_nan.data(), n);
    }
    std::vector<float> minus_inf(n, -INFINITY);
    bad += vec::argmax(minus_inf.data(), n) != generic::argmax(minus_inf.data(), n);
    std::vector<float> w(n), ref_w(n);
    std::vector<int32_t> ids(n), ref_ids(n);
    int64_t count = 0, ref_count = 0;
    const float floor = 0x1p-20f, inv_t = 1.f / 0.7f;
    const double total = vec::weigh(logits.data(), n, 12.f, inv_t, floor, w.data(), ids.data(), count);
    const double ref_total = generic::weigh(logits.data(), n, 12.f, inv_t, floor, ref_w.data(), ref_ids.data(),
                                            ref_count);
    for (int64_t i = 0; i < n; ++i) bad += std::fabs(w[i] - ref_w[i]) > 2e-6f * ref_w[i];
    bad += std::fabs(total - ref_total) > 1e-6 * ref_total;
    int64_t expected = 0;  // the ids of its own weights at least the floor, in order
    for (int64_t i = 0; i < n; ++i) {
      if (w[i] >= floor) bad += expected >= count || ids[expected++] != i;
    }
    bad += expected != count;
  }
  std::printf("%s sampling argmax and weights: %s\n", bad ? "FAIL" : "ok  ",
              LC_VEC ? "the ISA's, the same argmax, weights within 2e-6"
                     : "one lane's, the same argmax, weights within 2e-6");
  failures += bad != 0;
}

}  // namespace

int main() {
  std::printf("kernels: %s\n", LC_ISA_NAME[0] ? LC_ISA_NAME : "generic only");
  check_half_conversion();
  check_kv_q8();
  check_reduce_add_lanes();
  check_kv_rows<RowType::kFloat>();
  check_kv_rows<RowType::kHalf>();
  check_kv_rows<RowType::kBFloat16>();
  check_vector_math_and_sampling();
  // rows: two whole passes and a short one; inputs: whole and short chunks and blocks of 16 groups
  for (bool exact : {false, true}) {
    for (int64_t K : {int64_t{256}, int64_t{1280}}) {
      const int64_t N = 9;
      const Weight layouts[] = {
          repacked("u4 symmetric", 4, 32, N, K, 8, false, false, exact),
          repacked("u4 mins", 4, 32, N, K, 0, true, false, exact),
          repacked("u4 K-quant", 4, 32, N, K, 0, false, true, exact),
          repacked("u8 symmetric", 8, 32, N, K, 128, false, false, exact),
          repacked("u8 group 16", 8, 16, N, K, 32, false, false, exact),
          repacked("u8 mins", 8, 32, N, K, 0, true, false, exact),
          repacked("u8 K-quant", 8, 32, N, K, 0, false, true, exact),
          repacked("u6", 6, 16, N, K, 32, false, false, exact),
      };
      for (const Weight& w : layouts) {
        check(w, exact);
        check(interleaved(w), exact);
      }
      for (int type = 0; type < kQuantTypeCount; ++type) check(blocks(type, N, K, exact), exact);
    }
    for (int type = 0; type < kQuantTypeCount; ++type) {  // one-group blocks: odd counts of groups
      if (kQuantTypes[type].block_weights == 32) check(blocks(type, 7, 800, exact), exact);
    }
  }
  std::printf("%s\n", failures ? "FAILED" : "all kernels agree with the generic ones");
  return failures ? 1 : 0;
}
