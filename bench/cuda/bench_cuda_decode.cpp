// Batch-1 decode on the GPU through the CUDA sequence decoder (the
// correctness path: no CUDA graph, one host sync per token) on a random
// checkpoint at a real model's shapes:
//
//   bench_cuda_decode CONFIG.json [--dtype bf16] [--context 128] [--tokens 128]
//
// Writes the checkpoint to a temporary folder (tandem synth), prefills
// `context` tokens, then times `tokens` single-token steps. Prints tok/s,
// the weight bytes streamed per token, GB/s and the fraction of the
// measured device copy bandwidth, as one JSON line.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/sequence_decoder.h"
#include "model/model.h"
#include "model/synth.h"

using namespace tandem;

namespace {

double copy_gbs() {
  const size_t bytes = size_t(2) << 30;
  cuda::DeviceBuffer a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i)
    CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * double(bytes) * 10 / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr, "usage: bench_cuda_decode CONFIG.json [--dtype bf16] [--context N] [--tokens N]\n");
    return 2;
  }
  std::string config = argv[1], dtype = "bf16";
  int64_t context = 128, tokens = 128;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    if (!std::strcmp(argv[i], "--context")) context = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
  }
  std::string why;
  if (cuda::device_count(&why) == 0) {
    std::fprintf(stderr, "bench_cuda_decode: no usable CUDA device: %s\n", why.c_str());
    return 1;
  }
  const std::string dir = (std::filesystem::temp_directory_path() / "tandem-bench-model").string();
  std::filesystem::remove_all(dir);
  synth_checkpoint(config, dir, dtype == "f32" ? DType::F32 : DType::BF16, 1);
  auto model = load_model(dir);
  cuda::SequenceDecoder dec(*model, context + tokens + 1);
  const int64_t V = model->spec.vocab;
  std::vector<int32_t> prompt(static_cast<size_t>(context));
  for (int64_t i = 0; i < context; ++i) prompt[size_t(i)] = int32_t((i * 7919) % V);
  std::vector<float> logits(static_cast<size_t>(V));
  const auto p0 = std::chrono::steady_clock::now();
  dec.feed(prompt.data(), context, logits.data(), false);
  const double prefill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
  int32_t id = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < tokens; ++i) {
    dec.feed(&id, 1, logits.data(), false);
    id = int32_t((id * 31 + 7) % V);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tps = double(tokens) / s;
  const double gbs = double(dec.weight_bytes()) * tps / 1e9;
  const double peak = copy_gbs();
  std::printf(
      "{\"config\": \"%s\", \"dtype\": \"%s\", \"context\": %lld, \"tokens\": %lld, "
      "\"decode_tok_s\": %.1f, \"prefill_tok_s\": %.1f, \"weight_bytes\": %zu, \"gbs\": %.1f, "
      "\"copy_gbs\": %.1f, \"fraction\": %.3f}\n",
      config.c_str(), dtype.c_str(), (long long)context, (long long)tokens, tps,
      double(context) / prefill_s, dec.weight_bytes(), gbs, peak, gbs / peak);
  std::filesystem::remove_all(dir);
  return 0;
}
