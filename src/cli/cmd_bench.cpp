// tandem bench: prefill and batch-1 decode speed of a model on this machine,
// reported as tokens/s, achieved GB/s and the fraction of the measured memory
// read bandwidth (decode is memory-bound: every token streams every weight).
#include <cstdio>
#include <fstream>
#include <random>

#include "backend/cpu/kernels.h"
#include "backend/cpu/membw.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "model/decoder.h"

namespace tandem::cli {

namespace {

struct BenchOptions {
  std::string model;
  int prompt_tokens = 64;
  int decode_tokens = 32;
  int threads = 0;
  std::string device = "auto";
  std::string kv_cache_dtype = "auto";
  std::string gemm_precision = "bf16";
  double peak_gbs = 0.0;
  std::string quantize;
  std::string mmproj;  // --mmproj FILE: checked; bench runs the language model only
};

// Bytes a decode step must read: every matmul weight once (quantized: codes,
// scales and biases), one embedding row, and the K and V rows attended to at
// position `pos` in every layer (rows of `kv_dtype`).
double decode_bytes(const Model& m, int64_t pos, DType kv_dtype) {
  const ModelSpec& s = m.spec;
  const Weights& w = m.weights;
  auto row = [](const WeightMatrix& x) { return double(x.nbytes()) / double(x.rows); };
  double bytes = double(w.head.nbytes()) + row(w.embed);
  if (s.ple_dim > 0) bytes += double(w.ple_model_proj.nbytes()) + row(w.ple_embed);
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    for (const WeightMatrix* x :
         {&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down, &lw.ple_gate, &lw.ple_proj})
      bytes += double(x->nbytes());
    const LayerSpec& ls = s.layer[size_t(l)];
    int64_t seen = pos + 1;
    if (ls.kind == AttentionKind::Sliding) seen = std::min(seen, s.sliding_window);
    bytes += 2.0 * double(seen * ls.kv_dim()) * double(dtype_size(kv_dtype));
  }
  return bytes;
}

int run_bench(const BenchOptions& o) {
  if (o.prompt_tokens < 1 || o.decode_tokens < 1)
    fail("--prompt-tokens and --tokens must be at least 1");
  const DeviceChoice device = resolve_device(o.device);
  const DType kv_dtype = resolve_kv_dtype(o.kv_cache_dtype, device);
  const bool bf16_inputs = resolve_gemm_precision(o.gemm_precision);
  ThreadPool pool(o.threads);
  // Measured before the model is touched, so its 1 GiB buffer is freed before
  // the weights become resident and stays out of the RSS figure below. On a
  // GPU: the device's nominal bandwidth.
  double peak = o.peak_gbs;
  if (peak <= 0.0)
    peak = device.cuda ? gpu_info(device).peak_bandwidth_gbs : cpu::measure_read_bandwidth(pool);
  // Reset the peak-RSS mark (Linux >= 4.0), so a model smaller than that
  // buffer is not charged for it.
  std::ofstream("/proc/self/clear_refs") << "5";
  auto model = load_model_verbose(o.model, load_options(o.quantize, device));
  const ModelSpec& s = model->spec;

  std::mt19937 rng(1);
  std::vector<int32_t> prompt(size_t(o.prompt_tokens));
  for (auto& id : prompt) id = int32_t(rng() % uint32_t(s.vocab));
  SequenceRunner seq =
      make_sequence_runner(device, *model, pool, o.prompt_tokens + o.decode_tokens + 2,
                           o.kv_cache_dtype, o.gemm_precision);
  StepRunner& decoder = *seq.runner;
  KvPool& kv_pool = *seq.kv_pool;
  std::vector<float> logits(size_t(s.vocab));

  // Warm-up pass (page cache, allocator, thread spin-up), then the timed runs.
  {
    SequenceKv warm;
    run_sequence(decoder, prompt.data(), o.prompt_tokens, warm, logits.data(), false);
    int32_t id = argmax(logits.data(), s.vocab);
    run_sequence(decoder, &id, 1, warm, logits.data(), false);
    kv_release(kv_pool, warm);
  }
  SequenceKv kv;
  const double t0 = now_seconds();
  run_sequence(decoder, prompt.data(), o.prompt_tokens, kv, logits.data(), false);
  const double t1 = now_seconds();
  double bytes = 0.0;
  for (int i = 0; i < o.decode_tokens; ++i) {
    int32_t id = argmax(logits.data(), s.vocab);
    bytes += decode_bytes(*model, kv.length, kv_dtype);
    run_sequence(decoder, &id, 1, kv, logits.data(), false);
  }
  const double t2 = now_seconds();

  const double prefill_tps = o.prompt_tokens / (t1 - t0);
  const double decode_tps = o.decode_tokens / (t2 - t1);
  const double gbs = bytes / (t2 - t1) / 1e9;
  std::printf("model        %s (%s, %s weights, %.2f GB)\n", o.model.c_str(), s.arch.c_str(),
              weight_format_name(*model).c_str(), double(model_weight_bytes(*model)) / 1e9);
  if (device.cuda) {
    const GpuInfo gpu = gpu_info(device);
    std::printf("device       %s (%s), %.1f of %.1f GB in use, nominal bandwidth %.1f GB/s%s\n",
                device.name().c_str(), gpu.name.c_str(),
                double(gpu.total_bytes - gpu.free_bytes) / 1e9, double(gpu.total_bytes) / 1e9, peak,
                o.peak_gbs > 0 ? " (given)" : "");
  } else {
    std::printf("device       cpu\n");
    std::printf(
        "machine      %d threads, ISA %s (quantized kernels %s), measured read bandwidth "
        "%.1f GB/s%s\n",
        pool.size(), std::string(cpu::active_isa()).c_str(),
        std::string(cpu::active_quant_isa()).c_str(), peak, o.peak_gbs > 0 ? " (given)" : "");
  }
  // What the prefill's matmuls over bf16 weights multiplied (--gemm-precision).
  const char* products = device.cuda ? (bf16_inputs ? "bf16 GEMM inputs" : "f32-level GEMM inputs")
                         : !bf16_inputs             ? "f32 products"
                         : cpu::bf16_dot_products() ? "bf16 inputs on AVX-512 BF16 dot products"
                                                    : "bf16 inputs on f32 kernels";
  std::printf("prefill      %d tokens: %.1f tok/s (%s)\n", o.prompt_tokens, prefill_tps, products);
  std::printf("decode       %d tokens: %.2f tok/s, %.1f GB/s, %.0f%% of %s bandwidth\n",
              o.decode_tokens, decode_tps, gbs, 100.0 * gbs / peak,
              o.peak_gbs > 0 ? "the given" : device.cuda ? "nominal" : "measured");
  const uint64_t weight_bytes = model_weight_bytes(*model);
  const double rss = double(peak_rss_bytes()), owned = double(model->owned_bytes);
  const double mapped = double(weight_bytes) - owned, kv_mb = double(kv_pool.bytes()) / 1e6;
  if (device.cuda) {
    std::printf("memory       peak host RSS %.2f GB; weights %.2f GB and KV cache %.1f MB on %s\n",
                rss / 1e9, double(weight_bytes) / 1e9, kv_mb, device.name().c_str());
    return 0;
  }
  // Mmapped weights are resident only where read: a table gathered row by
  // row (Gemma 4's per-layer embeddings) can leave most of it on disk, and
  // then what is left of the RSS says nothing about other memory.
  const double other = rss - double(weight_bytes) - double(kv_pool.bytes());
  if (other >= 0)
    std::printf(
        "memory       peak RSS %.2f GB = weights %.2f GB (%.2f GB converted at load, the "
        "rest mmapped) + KV cache %.1f MB + %.0f MB other\n",
        rss / 1e9, double(weight_bytes) / 1e9, owned / 1e9, kv_mb, other / 1e6);
  else
    std::printf(
        "memory       peak RSS %.2f GB: weights %.2f GB (%.2f GB converted at load, %.2f GB "
        "mmapped, at least %.2f GB of it never read) + KV cache %.1f MB\n",
        rss / 1e9, double(weight_bytes) / 1e9, owned / 1e9, mapped / 1e9, -other / 1e9, kv_mb);
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Measure prefill and batch-1 decode speed of a model");
  cmd->add_option("model", o->model, "Model folder (config.json + *.safetensors)")->required();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length")->capture_default_str();
  cmd->add_option("--tokens", o->decode_tokens, "Tokens to decode")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)");
  add_device_option(cmd, o->device);
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_gemm_precision_option(cmd, o->gemm_precision);
  cmd->add_option("--peak-gbs", o->peak_gbs,
                  "Memory read bandwidth to compare with (default: measure it)");
  add_quantize_option(cmd, o->quantize);
  add_mmproj_option(cmd, o->mmproj);
  return [o] {
    check_mmproj(o->mmproj);
    return run_bench(*o);
  };
}

}  // namespace tandem::cli
