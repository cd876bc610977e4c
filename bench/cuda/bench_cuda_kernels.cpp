// Bandwidth of the CUDA decode kernels at real model shapes: each GEMV of a
// layer (and the LM head) at batch 1, 4, 8 and 16, timed with CUDA events
// over many launches; the weights of a whole model's GEMVs are several times
// the L2, so every launch streams from HBM. Prints GB/s and the fraction of
// the measured device-to-device copy bandwidth (the reachable peak).
//
//   bench_cuda_kernels [--json]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench_util.h"

using namespace tandem;

namespace {

struct Gemm {
  const char* name;
  int64_t rows, cols;
};

struct ModelShape {
  const char* model;
  std::vector<Gemm> gemms;  // one decoder layer's projections, then the head
  int64_t layers;
};

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  if (!bench::have_device("bench_cuda_kernels")) return 1;
  const cuda::DeviceInfo dev = cuda::device_info(0);
  const double peak = bench::copy_gbs();
  std::fprintf(stderr, "%s: copy bandwidth %.0f GB/s (nominal %.0f)\n", dev.name.c_str(), peak,
               dev.peak_bandwidth_gbs);
  const std::vector<ModelShape> models = {
      {"llama-3.2-1b",
       {{"qkv", 3072, 2048},
        {"o", 2048, 2048},
        {"gate_up", 16384, 2048},
        {"down", 2048, 8192},
        {"lm_head", 128256, 2048}},
       16},
      {"qwen3-1.7b",
       {{"qkv", 4096, 2048},
        {"o", 2048, 2048},
        {"gate_up", 12288, 2048},
        {"down", 2048, 6144},
        {"lm_head", 151936, 2048}},
       28},
      {"ministral-3-3b",
       {{"qkv", 5120, 3072},
        {"o", 3072, 4096},
        {"gate_up", 18432, 3072},
        {"down", 3072, 9216},
        {"lm_head", 131072, 3072}},
       26},
  };
  for (const ModelShape& m : models) {
    // One buffer per layer and projection, so a step streams the model's
    // real weight bytes (not an L2-resident copy).
    std::vector<std::vector<cuda::DeviceBuffer>> weights(size_t(m.layers));
    size_t model_bytes = 0;
    int64_t max_rows = 0, max_cols = 0;
    for (auto& layer : weights)
      for (const Gemm& g : m.gemms) {
        if (&g == &m.gemms.back() && &layer != &weights.back()) continue;  // one head
        layer.emplace_back(size_t(g.rows * g.cols) * 2);
        CUDA_CHECK(cudaMemset(layer.back().get(), 0x3c, layer.back().bytes()));
        model_bytes += layer.back().bytes();
        max_rows = std::max(max_rows, g.rows);
        max_cols = std::max(max_cols, g.cols);
      }
    for (int64_t n : {1, 4, 8, 16}) {
      cuda::DeviceBuffer x(size_t(n * max_cols) * 4), y(size_t(n * max_rows) * 4);
      CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
      auto step = [&] {
        for (size_t l = 0; l < weights.size(); ++l)
          for (size_t k = 0; k < weights[l].size(); ++k) {
            const Gemm& g = m.gemms[k];
            cuda::gemv_bf16(weights[l][k].as<uint16_t>(), g.rows, g.cols, x.as<float>(), n,
                            y.as<float>(), nullptr);
          }
      };
      const double step_s = bench::seconds_per_call(step, 20);
      const double gbs = double(model_bytes) / step_s / 1e9;
      const int launches = int(m.layers) * int(m.gemms.size() - 1) + 1;
      if (json)
        std::printf(
            "{\"model\": \"%s\", \"batch\": %lld, \"weight_bytes\": %zu, \"launches\": %d, "
            "\"step_ms\": %.4f, \"gbs\": %.1f, \"copy_gbs\": %.1f, \"fraction\": %.3f}\n",
            m.model, (long long)n, model_bytes, launches, step_s * 1e3, gbs, peak, gbs / peak);
      else
        std::printf(
            "%-16s batch %2lld  %6.2f GB of GEMV weights  %7.3f ms/step  %6.0f GB/s  "
            "%4.0f%% of copy bandwidth\n",
            m.model, (long long)n, model_bytes / 1e9, step_s * 1e3, gbs, 100 * gbs / peak);
    }
  }
  return 0;
}
