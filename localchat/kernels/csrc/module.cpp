// The CPU kernels as one Python module. One translation unit: parsing torch's headers is most of the
// build, so the kernels are included here rather than compiled separately.
#include "block_cache.h"
#include "core_round_trip.h"
#include "decode_attention.h"
#include "decode_layer.h"
#include "gguf_repack.h"
#include "gguf_transcode.h"
#include "kv_store.h"
#include "quant_linear.h"
#include "quant_restore.h"
#include "rms_norm.h"
#include "sampling.h"

// Every kernel runs without the GIL (its arguments are converted before, its result after): the event
// loop thread, a chat's UI or a server's, runs Python while the engine thread is in a kernel, instead of
// taking the GIL in the engine's short Python stretches between them and making it wait for it back.
using NoGil = pybind11::call_guard<pybind11::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quant_linear", &quant_linear, NoGil(), "y = x @ W.T for a packed weight (int8 activations; the ISA's kernels, else the generic ones)");
  m.def("decode_attention", &decode_attention, NoGil(), "rotary + KV store + paged attention for a batch of decodes");
  m.def("store_kv_q8_0", &store_kv_q8_0, NoGil(), "quantize keys and values into their slots of a q8_0 KV pool");
  m.def("add_rms_norm", &add_rms_norm, NoGil(), "residual += x; rms_norm(residual) (float32)");
  m.def("repack_gguf", &repack_gguf, NoGil(), "GGUF quantized blocks -> [qweight, scales(, mins)] of a PackedWeight");
  m.def("transcode_gguf", &transcode_gguf, NoGil(), "Q3_K, IQ4_NL, IQ4_XS or Q2_K blocks -> Q6_K or Q8_0 blocks");
  m.def("sample_tokens", &sample_tokens, NoGil(), "one token per logits row: greedy, or temperature/top-k/top-p/min-p and the race");
  m.def("interleave_weight", &interleave_weight, NoGil(), "a packed weight's rows into (or, back=True, out of) the interleaved layout, in place");
  m.def("dequantize", &dequantize, NoGil(), "the dense float32 weight of a packed u4/u8 weight");
  m.def("dequantize_rows", &dequantize_rows, NoGil(), "rows of a packed weight as float32 (an embedding lookup)");
  m.def("dense_linear_bf16", &dense_linear_bf16, NoGil(), "x @ W.T through bfloat16: one oneDNN GEMM per band of restored weight rows (prefill)");
  // module-local: a process may load a second build (the tests load the AVX2 one beside the AVX-512 one)
  pybind11::class_<DecodeLayer, std::shared_ptr<DecodeLayer>>(m, "DecodeLayer", pybind11::module_local())
      .def(pybind11::init<torch::Tensor, torch::Tensor, double, std::vector<std::vector<torch::Tensor>>,
                          std::vector<int64_t>, std::vector<int64_t>, c10::optional<torch::Tensor>,
                          c10::optional<torch::Tensor>, c10::optional<torch::Tensor>, int64_t, int64_t, int64_t,
                          std::vector<bool>>())
      .def("bind_cache", &DecodeLayer::bind_cache)
      .def("set_moe", &DecodeLayer::set_moe);
  pybind11::class_<MoeMlp, std::shared_ptr<MoeMlp>>(m, "MoeMlp", pybind11::module_local())
      .def(pybind11::init<torch::Tensor, std::vector<std::vector<torch::Tensor>>, std::vector<int64_t>,
                          std::vector<int64_t>, int64_t, bool, std::vector<bool>>())
      .def("batchable", &MoeMlp::batchable, "whether forward_batch runs these experts (one activation layout each)")
      .def("forward_batch", &MoeMlp::forward_batch, NoGil(),
           "(hidden [T, H], ids [T, k], weights [T, k], run [experts] bool): the experts in `run`, summed per token");
  pybind11::class_<DecodeStack>(m, "DecodeStack", pybind11::module_local())
      .def(pybind11::init<std::vector<std::shared_ptr<DecodeLayer>>, torch::Tensor, double>())
      .def("bind_caches", &DecodeStack::bind_caches)
      .def("forward", &DecodeStack::forward, NoGil(),
           "(x [T, hidden], cos, sin, slot_mapping, block_tables, seq_lens, query_start_loc): T tokens' final hidden states")
      .def_static("max_rows", [] { return kMaxStackRows; }, "the most tokens one forward runs")
      .def("profile", &DecodeStack::profile, "start/stop counting cycles per phase; returns and resets the totals");
  m.def("install_block_cache", &install_block_cache, "keep freed CPU blocks of 1 MiB and more for reuse, up to this many bytes");
  m.def("block_cache_stats", &block_cache_stats, "(bytes cached, blocks cached, requests served from the cache)");
  m.def("core_round_trip_ns", &core_round_trip_ns, NoGil(), "ns per round trip of a cache line between two pinned CPUs (-1: cannot pin)");
  m.def("simd_isa", &simd_isa, "the vector kernels compiled in: 'avx512-vnni', 'avx2', 'neon', or '' (the generic kernels only)");
}
