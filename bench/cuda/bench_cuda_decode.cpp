// Decode and prefill on the GPU through the CUDA decoder (the engine's
// StepRunner: decode steps replayed from CUDA graphs) on a random checkpoint
// at a real model's shapes:
//
//   bench_cuda_decode CONFIG.json [--dtype bf16] [--context 128] [--tokens 128]
//                     [--batch 1] [--prefill 512] [--quantize 4|8] [--host-logits]
//                     [--kv-dtype bf16|f32] [--gemm-precision bf16|f32] [--profile]
//                     [--knockout]
//
// Writes the checkpoint to a temporary folder (tandem synth; kept, and
// reused by later runs on the same config and dtype), prefills
// `batch` sequences of `context` tokens, then times `tokens` steps that
// decode one token of every sequence. Prints, as one JSON line: aggregate
// tok/s, the bytes a step reads (the streamed weights — all but the
// embedding tables that are only gathered from — and the KV rows attended),
// GB/s and
// the fraction of the measured device copy bandwidth; and the prefill of
// `prefill` tokens in one sequence: tok/s and TFLOP/s (2 · streamed
// parameters per token, attention excluded).
//
// --kv-dtype sets the KV rows' type (bf16 by default, as the engine on
// CUDA; the bytes a step reads count it). --gemm-precision: the inputs of the
// cuBLAS GEMMs (prefill, 3+ sequences): bf16 (the default, as the engine's)
// or f32 (hi/lo halves).
// --quantize quantizes the checkpoint on load (affine, group 64, as
// `--quantize q4|q8`); at 4 bits (at 8 with TANDEM_CUDA_PACKED_QUANT=1) the device keeps the
// codes packed, so the bytes streamed are the codes, scales and biases
// (otherwise they are dequantized to bf16 at upload). Decode steps sample greedily on the device,
// as the engine does for requests without constraints or logprobs; --host-logits copies every
// sequence's logits to the host instead (the engine's other path).
// --profile then runs one more step eagerly with a timing event after each
// op and prints, per op kind, its device time, share of the step and
// achieved weight bandwidth (Decoder::profile_step).
// --knockout then times the replayed step again with one kind of op left out
// at a time (Decoder::leave_out), then without everything but the
// projections, then without every op: what each costs where PDL overlaps
// kernels (the last line is the step's fixed cost: host work, the input
// copy, embedding, sampling).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/decoder.h"
#include "backend/cuda/device_matrix.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench_util.h"
#include "model/decoder.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "model/synth.h"

using namespace tandem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_cuda_decode CONFIG.json [--dtype bf16] [--context N] [--tokens N] "
                 "[--batch N] [--prefill N]\n");
    return 2;
  }
  std::string config = argv[1], dtype = "bf16", kv_dtype = "bf16", gemm = "bf16";
  int64_t context = 128, tokens = 128, batch = 1, prefill = 512, quantize = 0;
  bool host_logits = false, profile = false, knockout = false;
  // --knockout: the ops left out one at a time (profile names, by substring).
  const std::vector<std::string> knockout_ops = {"qkv proj",        "qkv post",     "attention",
                                                 "o proj",          "gate/up proj", "down proj",
                                                 "residual + norm", "ple",          "head"};
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--host-logits")) host_logits = true;
    if (!std::strcmp(argv[i], "--profile")) profile = true;
    if (!std::strcmp(argv[i], "--knockout")) knockout = true;
  }
  for (int i = 2; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    if (!std::strcmp(argv[i], "--kv-dtype")) kv_dtype = argv[i + 1];
    if (!std::strcmp(argv[i], "--gemm-precision")) gemm = argv[i + 1];
    if (!std::strcmp(argv[i], "--context")) context = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--prefill")) prefill = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--quantize")) quantize = std::atoll(argv[i + 1]);
  }
  if (!bench::have_device("bench_cuda_decode")) return 1;
  // One random checkpoint per config and dtype, kept for the next run.
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("tandem-bench-" + std::filesystem::path(config).stem().string() + "-" + dtype))
          .string();
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    std::filesystem::remove_all(dir);
    synth_checkpoint(config, dir, dtype == "f32" ? DType::F32 : DType::BF16, 1);
  }
  LoadOptions load;
  load.quantize_bits = int(quantize);
  load.quantize_group_size = 64;
  auto model = load_model(dir, load);
  const ModelSpec& s = model->spec;
  const int64_t V = s.vocab, step_tokens = std::max<int64_t>({256, batch, prefill});
  const int64_t per_seq = context + tokens + 1;
  const int64_t full_blocks =
      (batch * per_seq + prefill + 2 * KvPool::kBlockSize) / KvPool::kBlockSize + batch + 1;
  const int64_t sliding_blocks = (batch + 1) * KvPool::sliding_blocks_per_sequence(s, step_tokens);
  if (gemm != "bf16" && gemm != "f32") {
    std::fprintf(stderr, "bench_cuda_decode: --gemm-precision %s (bf16 or f32)\n", gemm.c_str());
    return 2;
  }
  if (kv_dtype != "bf16" && kv_dtype != "f32") {
    std::fprintf(stderr, "bench_cuda_decode: --kv-dtype %s (bf16 or f32)\n", kv_dtype.c_str());
    return 2;
  }
  const DType rows = kv_dtype == "bf16" ? DType::BF16 : DType::F32;
  KvPool kv_pool(s, full_blocks, sliding_blocks, /*host_storage=*/false, rows);
  cuda::Decoder dec(*model, kv_pool, step_tokens, 0,
                    gemm == "f32" ? cuda::GemmInputs::HiLo : cuda::GemmInputs::Bf16);

  // Prefill timing: one sequence of `prefill` tokens (a warm-up run first).
  std::vector<int32_t> ids(static_cast<size_t>(std::max(context, prefill)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((int64_t(i) * 7919) % V);
  std::vector<float> logits(static_cast<size_t>(V * batch));
  double prefill_s = 0;
  for (int run = 0; run < 2; ++run) {
    SequenceKv kv;
    const auto p0 = std::chrono::steady_clock::now();
    run_sequence(dec, ids.data(), prefill, kv, logits.data(), false);
    prefill_s = seconds_since(p0);
    kv_release(kv_pool, kv);
  }
  // Decode: `batch` sequences at `context`.
  std::vector<SequenceKv> kv(static_cast<size_t>(batch));
  for (auto& q : kv) run_sequence(dec, ids.data(), context, q, logits.data(), false);
  std::vector<int32_t> next(static_cast<size_t>(batch), 1), sampled(static_cast<size_t>(batch));
  std::vector<StepSampling> sampling(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) sampling[size_t(b)].token = &sampled[size_t(b)];
  auto decode_step = [&](bool profiled) {
    std::vector<SeqStep> step;
    for (int64_t b = 0; b < batch; ++b) {
      if (!kv_reserve(kv_pool, s, kv[size_t(b)], kv[size_t(b)].length + 1)) {
        std::fprintf(stderr, "bench_cuda_decode: KV pool exhausted\n");
        std::exit(1);
      }
      SeqStep q{&next[size_t(b)], 1, &kv[size_t(b)], nullptr, false};
      if (host_logits)
        q.logits = logits.data() + b * V;
      else
        q.sampling = &sampling[size_t(b)];
      step.push_back(q);
    }
    if (!profiled) {
      dec.step(step);
    } else {
      const auto ops = dec.profile_step(step);
      double total = 0;
      for (const auto& op : ops) total += op.ms;
      std::fprintf(stderr, "profile: %s batch %lld context %lld, one step, ops summed: %.3f ms\n",
                   config.c_str(), (long long)batch, (long long)context, total);
      std::fprintf(stderr, "  %-34s %5s %9s %6s %9s\n", "op", "calls", "ms", "share", "GB/s");
      for (const auto& op : ops)
        std::fprintf(stderr, "  %-34s %5d %9.4f %5.1f%% %9.0f\n", op.op.c_str(), op.calls, op.ms,
                     100.0 * op.ms / total, op.bytes ? double(op.bytes) / (op.ms * 1e6) : 0.0);
    }
    for (int64_t b = 0; b < batch; ++b) {
      kv_trim_sliding(kv_pool, s, kv[size_t(b)]);
      next[size_t(b)] = int32_t((next[size_t(b)] * 31 + 7 + b) % V);
    }
  };
  for (int i = 0; i < 3; ++i) decode_step(false);  // captures the graph
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < tokens; ++i) decode_step(false);
  const double secs = seconds_since(t0);
  if (profile) decode_step(true);
  const double steps_s = double(tokens) / secs;
  if (knockout) {
    // Each op's marginal cost in the replayed step: the step's time without
    // it (Decoder::leave_out), against the step's time with everything.
    // Every step decodes at the same position (its KV row rewritten), so
    // the context, and the pool's use, stay as they are.
    std::vector<int64_t> lengths;
    for (const SequenceKv& q : kv) lengths.push_back(q.length);
    auto same_position_step = [&] {
      decode_step(false);
      for (size_t b = 0; b < kv.size(); ++b) kv[b].length = lengths[b];
    };
    auto step_ms = [&] {
      for (int i = 0; i < 3; ++i) same_position_step();  // captures the graph
      const auto k0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < tokens; ++i) same_position_step();
      return 1e3 * seconds_since(k0) / double(tokens);
    };
    const double all = step_ms();
    std::fprintf(stderr, "knockout: %s batch %lld context %lld, step %.4f ms\n", config.c_str(),
                 (long long)batch, (long long)context, all);
    auto report = [&](const std::string& label, std::vector<std::string> ops) {
      dec.leave_out(std::move(ops));
      const double ms = step_ms();
      std::fprintf(stderr, "  without %-44s %8.4f ms  (costs %7.1f us)\n", label.c_str(), ms,
                   1e3 * (all - ms));
    };
    for (const std::string& op : knockout_ops) report(op, {op});
    report("every op but the projections", {"qkv post", "attention", "residual + norm"});
    report("every op", {""});
    dec.leave_out({});
  }
  // Bytes one step reads: the weights once, and each sequence's K and V rows
  // in the positions its layers attend (the window on sliding layers).
  double kv_bytes = 0;
  const double mid = double(context) + double(tokens) / 2 + 3;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerSpec& ls = s.layer[size_t(l)];
    const double seen = ls.kind == AttentionKind::Sliding && s.sliding_window > 0
                            ? std::min(mid, double(s.sliding_window))
                            : mid;
    kv_bytes += 2.0 * seen * double(ls.kv_dim()) * double(dtype_size(rows));
  }
  const double step_bytes = double(dec.streamed_bytes()) + double(batch) * kv_bytes;
  const double gbs = step_bytes * steps_s / 1e9;
  const double peak = bench::copy_gbs();
  // Parameters streamed (for prefill TFLOP/s): bytes over the width on the
  // device (kept packed: the codes plus f32 scale and bias per group of 64;
  // else dequantized to bf16 at upload, which the first version counted as
  // packed, 3.2x too many parameters at 4 bits).
  const bool packed = quantize && cuda::keeps_packed(int(quantize));
  const double width = packed ? double(quantize) / 8 + 8.0 / 64 : dtype == "f32" ? 4.0 : 2.0;
  const double params = double(dec.streamed_bytes()) / width;
  std::printf(
      "{\"config\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, "
      "\"logits\": \"%s\", \"quantized\": \"%s\", \"kv_dtype\": \"%s\", \"gemm_precision\": "
      "\"%s\", "
      "\"context\": %lld, \"tokens\": %lld, \"decode_tok_s\": %.1f, \"step_ms\": %.3f, "
      "\"weight_bytes\": %zu, \"streamed_bytes\": %zu, \"kv_bytes_per_step\": %.0f, \"gbs\": %.1f, "
      "\"copy_gbs\": %.1f, "
      "\"fraction\": %.3f, \"prefill_tokens\": %lld, \"prefill_tok_s\": %.1f, "
      "\"prefill_tflops\": %.2f}\n",
      config.c_str(), cuda::device_info(0).name.c_str(), dtype.c_str(), (long long)batch,
      host_logits ? "host" : "device greedy", quantize ? (quantize == 4 ? "q4" : "q8") : "",
      kv_dtype.c_str(), gemm.c_str(), (long long)context, (long long)tokens,
      steps_s * double(batch), 1e3 / steps_s, dec.weight_bytes(), dec.streamed_bytes(),
      double(batch) * kv_bytes, gbs, peak, gbs / peak, (long long)prefill,
      double(prefill) / prefill_s, 2.0 * params * double(prefill) / prefill_s / 1e12);
  return 0;
}

// Errors (an unreadable config, a model that does not fit) end the run with
// their message and status 1, not an uncaught exception's abort.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_decode: %s\n", e.what());
    return 1;
  }
}
