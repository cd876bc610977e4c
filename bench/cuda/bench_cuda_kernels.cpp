// The decode GEMVs of real model shapes, one projection at a time: every
// matrix shape of a model's layers at batch 1 and 2, through gemv_bf16 as
// the decoder calls it (the input norm fused into q/k/v and gate/up, gate/up
// gated), timed over one weight copy per layer that has the shape (at least
// 128 MB of copies, past the L2, so each launch streams from HBM), the
// launches captured in one CUDA graph as the decoder's steps are. Prints the
// launch shape — rows a warp, column split, warps launched against one wave
// of warp slots (past 1.0 the last warps run after the first wave, nearly
// alone) — then µs a launch, GB/s and the fraction of the device-to-device
// copy bandwidth. Shapes come from the configs (bench/configs/*.json under
// TANDEM_SOURCE_DIR or the current directory when none are named): q/k/v
// (q alone on layers that attend another layer's keys), o, gate/up, down,
// and the head.
//
// --list prints the shapes without measuring (no device needed).
//
//   bench_cuda_kernels [--json] [--list] [CONFIG.json ...]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/error.h"
#include "cuda_bench_util.h"
#include "model/model.h"

using namespace tandem;

namespace {

struct Projection {
  std::string name;
  int64_t rows = 0, cols = 0;
  bool gated = false, normed = false;
  int64_t layers = 0;  // how many of the model's layers have this shape
};

// The distinct GEMV shapes of a model's decode step, with how many layers
// have each.
std::vector<Projection> projections_of(const ModelSpec& s) {
  std::vector<Projection> out;
  auto add = [&](const char* name, int64_t rows, int64_t cols, bool gated, bool normed) {
    for (Projection& p : out)
      if (p.name == name && p.rows == rows && p.cols == cols) {
        ++p.layers;
        return;
      }
    out.push_back({name, rows, cols, gated, normed, 1});
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerSpec& ls = s.layer[size_t(l)];
    const bool own_kv = ls.kv_source == l;
    const int64_t q = ls.q_dim(s.heads), kv = ls.kv_dim();
    add("q/k/v", q + (own_kv ? kv : 0) + (own_kv && !ls.k_eq_v ? kv : 0), s.hidden, false, true);
    add("o", s.hidden, q, false, false);
    add("gate/up", 2 * ls.intermediate, s.hidden, true, true);
    add("down", s.hidden, ls.intermediate, false, false);
  }
  add("head", s.vocab, s.hidden, false, true);
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read %s", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> default_configs() {
  const char* root = std::getenv("TANDEM_SOURCE_DIR");
  const std::filesystem::path dir = std::filesystem::path(root ? root : ".") / "bench" / "configs";
  std::vector<std::string> out;
  if (std::filesystem::is_directory(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void bench_projection(const std::string& model, const Projection& p, double peak, bool json) {
  const size_t bytes = size_t(p.rows * p.cols) * 2;
  const int64_t copies = std::max<int64_t>(p.layers, int64_t((size_t(128) << 20) / bytes) + 1);
  std::vector<cuda::DeviceBuffer> weights;
  for (int64_t i = 0; i < copies; ++i) {
    weights.emplace_back(bytes);
    CUDA_CHECK(cudaMemset(weights.back().get(), 0x3c, bytes));
  }
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const int64_t n : {1, 2}) {
    cuda::DeviceBuffer x(size_t(n * p.cols) * 4), y(size_t(n * p.rows) * 4),
        norm(size_t(p.cols) * 4);
    CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
    CUDA_CHECK(cudaMemset(norm.get(), 0, norm.bytes()));
    cuda::GemvFusion f;
    if (p.gated) f.gate = cuda::GemvGate::SiLU;
    if (p.normed) {
      f.normalize = true;
      f.norm_weight = norm.as<float>();
      f.norm_eps = 1e-6f;
    }
    auto launch_all = [&] {
      for (const cuda::DeviceBuffer& w : weights)
        cuda::gemv_bf16(w.as<uint16_t>(), p.rows, p.cols, x.as<float>(), n, y.as<float>(), stream,
                        f);
    };
    const double us = 1e6 * bench::graph_seconds(launch_all, 5, stream) / double(copies);
    const cuda::GemvLaunchShape shape = cuda::gemv_bf16_launch_shape(p.rows, p.cols, n, p.gated);
    const double waves = double(shape.warps) / double(shape.wave_warps);
    const double gbs = double(bytes) / (us * 1e-6) / 1e9;
    if (json)
      std::printf(
          "{\"model\": \"%s\", \"projection\": \"%s\", \"rows\": %lld, \"cols\": %lld, "
          "\"layers\": %lld, \"batch\": %lld, \"rows_per_warp\": %d, \"split\": %d, \"warps\": "
          "%lld, \"waves\": %.2f, \"us\": %.2f, \"gbs\": %.1f, \"copy_gbs\": %.1f, \"fraction\": "
          "%.3f}\n",
          model.c_str(), p.name.c_str(), (long long)p.rows, (long long)p.cols, (long long)p.layers,
          (long long)n, shape.rows_per_warp, shape.split, (long long)shape.warps, waves, us, gbs,
          peak, gbs / peak);
    else
      std::printf(
          "%-16s %-8s %6lld x %-5lld x%-3lld batch %lld  %d rows a warp, split %d: %6lld warps "
          "%5.2f waves  %8.2f us  %6.0f GB/s  %4.0f%%\n",
          model.c_str(), p.name.c_str(), (long long)p.rows, (long long)p.cols, (long long)p.layers,
          (long long)n, shape.rows_per_warp, shape.split, (long long)shape.warps, waves, us, gbs,
          100 * gbs / peak);
  }
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, list = false;
  std::vector<std::string> configs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json"))
      json = true;
    else if (!std::strcmp(argv[i], "--list"))
      list = true;
    else
      configs.push_back(argv[i]);
  }
  if (configs.empty()) configs = default_configs();
  if (configs.empty()) {
    std::fprintf(stderr, "bench_cuda_kernels: no configs named and none in bench/configs\n");
    return 1;
  }
  try {
    if (list) {
      for (const std::string& path : configs)
        for (const Projection& p : projections_of(parse_model_spec(read_text(path), path)))
          std::printf("%-16s %-8s %6lld x %-5lld  layers: %lld%s\n",
                      std::filesystem::path(path).stem().string().c_str(), p.name.c_str(),
                      (long long)p.rows, (long long)p.cols, (long long)p.layers,
                      p.gated ? ", gated" : "");
      return 0;
    }
    if (!bench::have_device("bench_cuda_kernels")) return 1;
    const cuda::DeviceInfo dev = cuda::device_info(0);
    const double peak = bench::copy_gbs();
    std::fprintf(stderr, "%s: copy bandwidth %.0f GB/s (nominal %.0f)\n", dev.name.c_str(), peak,
                 dev.peak_bandwidth_gbs);
    for (const std::string& path : configs) {
      const ModelSpec spec = parse_model_spec(read_text(path), path);
      const std::string model = std::filesystem::path(path).stem().string();
      for (const Projection& p : projections_of(spec)) bench_projection(model, p, peak, json);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
