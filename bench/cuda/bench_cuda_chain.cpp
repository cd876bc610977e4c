// What a persistent decode kernel would save at batch 1: every layer's four
// projections of a model shape (q/k/v, o, gate/up gated, down; one weight
// copy a layer, so each streams from HBM), chained as in a decode step (each
// reads what the one before wrote), run two ways:
//
//   graph       one gemv_bf16 launch a projection with PDL, captured in a
//               CUDA graph (the decoder's batch-1 chain, without attention
//               and norms);
//   persistent  one GemvChain launch: the projections as phases of one
//               kernel, a grid barrier between them, under each prefetch
//               mode (none, L2, registers).
//
// Then the same number of tiny projections (8 x 64), which prices one link
// of each chain. Prints µs a step, GB/s of weights and the fraction of the
// device-to-device copy bandwidth, and the largest difference of the last
// projection's outputs from the graph's.
//
//   bench_cuda_chain [--json] [--model NAME] [--blocks-per-sm N]
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv_chain.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "cuda_bench_util.h"

using namespace tandem;

namespace {

struct Shape {
  const char* model;
  int64_t layers, hidden, qkv_rows, o_cols, ff;
  cuda::GemvGate act;
};

// bf16 bits of small random values, for weights that keep the chain's
// activations finite.
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<uint16_t> v(n);
  for (uint16_t& b : v) b = f32_to_bf16(d(rng));
  return v;
}

// A model's worth of chained projections: weights, activations, phases.
struct Chain {
  std::vector<cuda::DeviceBuffer> weights;
  cuda::DeviceBuffer qkv, o, gate_up, down, start;
  std::vector<cuda::GemvChainPhase> phases;
  int64_t hidden = 0;

  Chain(const Shape& s, bool tiny) {
    const int64_t d = tiny ? 64 : s.hidden, q = tiny ? 8 : s.qkv_rows, oc = tiny ? 8 : s.o_cols,
                  ff = tiny ? 8 : s.ff;
    hidden = d;
    qkv = cuda::DeviceBuffer(size_t(std::max(q, d)) * 4);
    o = cuda::DeviceBuffer(size_t(d) * 4);
    gate_up = cuda::DeviceBuffer(size_t(ff) * 4);
    down = cuda::DeviceBuffer(size_t(d) * 4);
    start = cuda::DeviceBuffer(size_t(d) * 4);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(d));
    for (float& v : x) v = nd(rng);
    start.upload(x.data(), x.size() * 4);
    // One host block of random weights, uploaded at offsets into every copy.
    const std::vector<uint16_t> pool = random_bf16(size_t(1) << 24, 3, 0.03f);
    auto matrix = [&](int64_t rows, int64_t cols) {
      cuda::DeviceBuffer w(size_t(rows * cols) * 2);
      for (size_t done = 0; done < size_t(rows * cols);) {
        const size_t n = std::min(pool.size(), size_t(rows * cols) - done);
        CUDA_CHECK(cudaMemcpy(w.as<uint16_t>() + done, pool.data(), n * 2, cudaMemcpyHostToDevice));
        done += n;
      }
      weights.push_back(std::move(w));
      return weights.back().as<uint16_t>();
    };
    for (int64_t l = 0; l < s.layers; ++l) {
      const float* in = l == 0 ? start.as<float>() : down.as<float>();
      phases.push_back({matrix(q, d), q, d, in, qkv.as<float>(), cuda::GemvGate::None});
      phases.push_back(
          {matrix(d, oc), d, oc, qkv.as<float>(), o.as<float>(), cuda::GemvGate::None});
      phases.push_back({matrix(2 * ff, d), 2 * ff, d, o.as<float>(), gate_up.as<float>(), s.act});
      phases.push_back(
          {matrix(d, ff), d, ff, gate_up.as<float>(), down.as<float>(), cuda::GemvGate::None});
    }
  }

  // The chain as gemv_bf16 launches (PDL on), into a graph.
  cudaGraphExec_t graph(cudaStream_t stream) const {
    cuda::PdlScope pdl(true);
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (const cuda::GemvChainPhase& p : phases) {
      cuda::GemvFusion f;
      f.gate = p.gate;
      cuda::gemv_bf16(p.w, p.rows, p.cols, p.x, 1, p.y, stream, f);
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    return exec;
  }

  std::vector<float> result() const {
    std::vector<float> y(static_cast<size_t>(hidden));
    CUDA_CHECK(cudaDeviceSynchronize());
    down.download(y.data(), y.size() * 4);
    return y;
  }
};

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(a[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string only;
  int blocks_per_sm = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0)
      json = true;
    else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc)
      only = argv[++i];
    else if (std::strcmp(argv[i], "--blocks-per-sm") == 0 && i + 1 < argc)
      blocks_per_sm = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_cuda_chain [--json] [--model NAME] [--blocks-per-sm N]\n");
      return 2;
    }
  }
  if (!bench::have_device("bench_cuda_chain")) return 1;
  const cuda::DeviceInfo dev = cuda::device_info(0);
  const double peak = bench::copy_gbs();
  std::fprintf(stderr, "%s: copy bandwidth %.0f GB/s\n", dev.name.c_str(), peak);
  const std::vector<Shape> shapes = {
      {"gemma-3-1b", 26, 1152, 1536, 1024, 6912, cuda::GemvGate::GeluTanh},
      {"llama-3.2-1b", 16, 2048, 3072, 2048, 8192, cuda::GemvGate::SiLU},
      {"gemma-4-e2b", 35, 1536, 2560, 2048, 6144, cuda::GemvGate::GeluTanh},
      {"ministral-3-3b", 26, 3072, 6144, 4096, 9216, cuda::GemvGate::SiLU},
  };
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const Shape& s : shapes) {
    if (!only.empty() && only != s.model) continue;
    for (bool tiny : {false, true}) {
      const Chain chain(s, tiny);
      cuda::GemvChain persistent(chain.phases, blocks_per_sm);
      const double bytes = double(persistent.weight_bytes());
      auto report = [&](const char* mode, double sec, double diff) {
        const double gbs = bytes / sec / 1e9;
        const double link_us = sec * 1e6 / double(chain.phases.size());
        if (json)
          std::printf(
              "{\"model\": \"%s\", \"weights\": \"%s\", \"mode\": \"%s\", \"phases\": %zu, "
              "\"blocks\": %d, \"us\": %.1f, \"us_per_phase\": %.3f, \"gbs\": %.0f, "
              "\"fraction\": %.3f, \"max_rel_diff\": %.2e}\n",
              s.model, tiny ? "tiny" : "real", mode, chain.phases.size(), persistent.blocks(),
              sec * 1e6, link_us, gbs, gbs / peak, diff);
        else
          std::printf(
              "%-15s %-4s %-22s %4zu phases %8.1f us  %6.3f us/phase  %6.0f GB/s  %3.0f%%  "
              "diff %.1e\n",
              s.model, tiny ? "tiny" : "real", mode, chain.phases.size(), sec * 1e6, link_us, gbs,
              100 * gbs / peak, diff);
      };
      cudaGraphExec_t exec = chain.graph(stream);
      auto reset = [&] {
        CUDA_CHECK(cudaMemcpyAsync(chain.down.get(), chain.start.get(), chain.start.bytes(),
                                   cudaMemcpyDeviceToDevice, stream));
      };
      reset();
      CUDA_CHECK(cudaGraphLaunch(exec, stream));
      const std::vector<float> want = chain.result();
      const double graph_s =
          bench::seconds_per_call([&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, 20, stream);
      report("graph (gemv_bf16, PDL)", graph_s, 0);
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      const std::pair<const char*, cuda::ChainPrefetch> modes[] = {
          {"persistent", cuda::ChainPrefetch::None},
          {"persistent + L2", cuda::ChainPrefetch::L2},
          {"persistent + registers", cuda::ChainPrefetch::Registers}};
      for (const auto& [name, mode] : modes) {
        reset();
        persistent.run(stream, mode);
        const double diff = max_rel_diff(want, chain.result());
        const double sec =
            bench::seconds_per_call([&] { persistent.run(stream, mode); }, 20, stream);
        report(name, sec, diff);
      }
    }
  }
  return 0;
}
