// The projections of batched decode steps at real model shapes, through the
// decoder's cuBLAS call (cublasGemmEx, bf16 x bf16 -> f32), for 8 to 128
// tokens. Each projection is timed over one weight buffer per layer (a
// model's worth, several times the L2), so every launch streams from HBM,
// captured in one CUDA graph as the decoder's steps are (device time, no
// per-call host overhead). Prints µs a launch, GB/s of weights and the
// fraction of the device-to-device copy bandwidth, one line per (model,
// projection, tokens).
//
// --lt also times every algorithm cuBLASLt's heuristic offers for the same
// GEMM (up to 32; split-K and tile variants the default call does not pick)
// and prints the fastest beside the default: whether decode's batched
// projections would gain from choosing algorithms at load.
//
//   bench_cuda_gemm [--json] [--model NAME] [--tokens N] [--lt]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/blas_stream.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "backend/cuda/gemm_tuner.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench_util.h"

using namespace tandem;

namespace {

struct Projection {
  const char* name;
  int64_t rows, cols;
};

struct ModelShape {
  const char* model;
  int64_t layers;
  std::vector<Projection> projections;  // the last one (head) has one copy
};

}  // namespace

int main(int argc, char** argv) {
  bool json = false, lt_search = false;
  std::string only;
  std::vector<int64_t> token_counts = {8, 16, 32, 64, 128};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0)
      json = true;
    else if (std::strcmp(argv[i], "--lt") == 0)
      lt_search = true;
    else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc)
      only = argv[++i];
    else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
      token_counts = {std::atoll(argv[++i])};
    else {
      std::fprintf(stderr, "usage: bench_cuda_gemm [--json] [--model NAME] [--tokens N] [--lt]\n");
      return 2;
    }
  }
  if (!bench::have_device("bench_cuda_gemm")) return 1;
  const cuda::DeviceInfo dev = cuda::device_info(0);
  const double peak = bench::copy_gbs();
  std::fprintf(stderr, "%s: copy bandwidth %.0f GB/s\n", dev.name.c_str(), peak);
  const std::vector<ModelShape> models = {
      {"llama-3.2-1b",
       16,
       {{"qkv", 3072, 2048},
        {"o", 2048, 2048},
        {"gate_up", 16384, 2048},
        {"down", 2048, 8192},
        {"head", 128256, 2048}}},
      {"gemma-3-1b",
       26,
       {{"qkv", 1536, 1152},
        {"o", 1152, 1024},
        {"gate_up", 13824, 1152},
        {"down", 1152, 6912},
        {"head", 262144, 1152}}},
      {"qwen3-1.7b",
       28,
       {{"qkv", 4096, 2048},
        {"o", 2048, 2048},
        {"gate_up", 12288, 2048},
        {"down", 2048, 6144},
        {"head", 151936, 2048}}},
      {"gemma-4-e2b",
       35,
       {{"qkv", 2560, 1536},
        {"o", 1536, 2048},
        {"gate_up", 12288, 1536},
        {"down", 1536, 6144},
        {"ple gate", 256, 1536},
        {"ple proj", 1536, 256},
        {"head", 262144, 1536}}},
      {"ministral-3-3b",
       26,
       {{"qkv", 6144, 3072},
        {"o", 3072, 4096},
        {"gate_up", 18432, 3072},
        {"down", 3072, 9216},
        {"head", 131072, 3072}}},
  };
  const cuda::BlasOnStream handles;
  cudaStream_t stream = handles.stream;
  cublasHandle_t blas = handles.blas;
  cublasLtHandle_t lt = handles.lt;
  const cuda::DeviceBuffer& workspace = handles.workspace;
  for (const ModelShape& m : models) {
    if (!only.empty() && only != m.model) continue;
    for (const Projection& p : m.projections) {
      const bool head = std::strcmp(p.name, "head") == 0;
      const int64_t copies = head ? 1 : m.layers;
      std::vector<cuda::DeviceBuffer> weights;
      for (int64_t l = 0; l < copies; ++l) {
        weights.emplace_back(size_t(p.rows * p.cols) * 2);
        CUDA_CHECK(cudaMemset(weights.back().get(), 0x3c, weights.back().bytes()));
      }
      const double bytes = double(p.rows * p.cols) * 2;
      cuda::DeviceBuffer x(size_t(128 * p.cols) * 2), y(size_t(128 * p.rows) * 4);
      CUDA_CHECK(cudaMemset(x.get(), 0x3c, x.bytes()));
      for (int64_t n : token_counts) {
        const float one = 1.f, zero = 0.f;
        auto launch_all = [&] {
          for (const cuda::DeviceBuffer& w : weights)
            CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(p.rows), int(n),
                                      int(p.cols), &one, w.get(), CUDA_R_16BF, int(p.cols), x.get(),
                                      CUDA_R_16BF, int(p.cols), &zero, y.get(), CUDA_R_32F,
                                      int(p.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        const int reps = head ? 20 : 10;
        const double s = bench::graph_seconds(launch_all, reps, stream) / double(copies);
        // The fastest of cuBLASLt's algorithms: its µs and rank in the
        // heuristic's order (0: the heuristic's first choice).
        double best_s = 0;
        int best_rank = -1, offered = 0;
        if (lt_search) {
          const cuda::LtGemmShape g(p.rows, p.cols, n);
          const std::vector<cublasLtMatmulAlgo_t> algos = g.algorithms(lt, workspace.bytes(), 32);
          offered = int(algos.size());
          for (int r = 0; r < offered; ++r) {
            const cublasLtMatmulAlgo_t* algo = &algos[size_t(r)];
            auto launch_lt = [&] {
              for (const cuda::DeviceBuffer& w : weights)
                CUBLAS_CHECK(cublasLtMatmul(lt, g.desc, &one, w.get(), g.a, x.get(), g.b, &zero,
                                            y.get(), g.c, y.get(), g.c, algo, workspace.get(),
                                            workspace.bytes(), stream));
            };
            const double t = bench::graph_seconds(launch_lt, reps, stream) / double(copies);
            if (best_rank < 0 || t < best_s) best_s = t, best_rank = r;
          }
        }
        const double gbs = bytes / s / 1e9;
        const double best_gbs = best_rank < 0 ? 0 : bytes / best_s / 1e9;
        if (json)
          std::printf(
              "{\"model\": \"%s\", \"projection\": \"%s\", \"rows\": %lld, \"cols\": %lld, "
              "\"tokens\": %lld, \"us\": %.2f, \"gbs\": %.0f, \"fraction\": %.3f, "
              "\"lt_offered\": %d, \"lt_best_rank\": %d, \"lt_best_us\": %.2f, "
              "\"lt_best_fraction\": %.3f}\n",
              m.model, p.name, (long long)p.rows, (long long)p.cols, (long long)n, s * 1e6, gbs,
              gbs / peak, offered, best_rank, best_s * 1e6, best_gbs / peak);
        else if (best_rank >= 0)
          std::printf(
              "%-15s %-9s %6lldx%-5lld n=%-3lld %8.2f us  %6.0f GB/s  %3.0f%%   lt best of %2d: "
              "#%-2d %8.2f us  %3.0f%%\n",
              m.model, p.name, (long long)p.rows, (long long)p.cols, (long long)n, s * 1e6, gbs,
              100 * gbs / peak, offered, best_rank, best_s * 1e6, 100 * best_gbs / peak);
        else
          std::printf("%-15s %-9s %6lldx%-5lld n=%-3lld %8.2f us  %6.0f GB/s  %3.0f%%\n", m.model,
                      p.name, (long long)p.rows, (long long)p.cols, (long long)n, s * 1e6, gbs,
                      100 * gbs / peak);
      }
    }
  }
  return 0;
}
