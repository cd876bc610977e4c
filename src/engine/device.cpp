#include "engine/device.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "model/decoder.h"
#include "model/kv_pool.h"
#include "model/step_runner.h"
#include "model/vision_tower.h"

#if TANDEM_HAVE_CUDA
#include "backend/cuda/decoder.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/vision_ops.h"
#endif

namespace tandem {

namespace {

#if TANDEM_HAVE_CUDA
// Error, saying what to do, unless CUDA device `index` is usable here
// (`flag`: the --device value, for the message).
void check_usable(const std::string& flag, int index) {
  std::string why;
  const int n = cuda::device_count(&why);
  if (n == 0)
    fail(
        "--device %s: no usable CUDA device (%s); check the NVIDIA driver (nvidia-smi), or use "
        "--device cpu",
        flag.c_str(), why.c_str());
  if (index >= n)
    fail(
        "--device %s: this machine has %d CUDA device%s (cuda:0 to cuda:%d); pick one of them, or "
        "use --device cpu",
        flag.c_str(), n, n == 1 ? "" : "s", n - 1);
}
#else
[[noreturn]] void no_cuda_backend(const std::string& flag) {
  fail(
      "--device %s: this tandem was built without the CUDA backend; use --device cpu, or rebuild "
      "with -DTANDEM_CUDA=ON on a machine with the CUDA toolkit",
      flag.c_str());
}
#endif

}  // namespace

std::string DeviceChoice::name() const {
  return cuda ? "cuda:" + std::to_string(index) : "cpu";
}

std::optional<DeviceChoice> parse_device(const std::string& flag) {
  if (flag == "auto") return std::nullopt;
  if (flag == "cpu") return DeviceChoice{};
  if (flag == "cuda") return DeviceChoice{.cuda = true, .index = 0};
  const std::string prefix = "cuda:";
  if (flag.starts_with(prefix) && flag.size() > prefix.size() && flag.size() <= prefix.size() + 4 &&
      flag.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
    return DeviceChoice{.cuda = true, .index = std::stoi(flag.substr(prefix.size()))};
  fail("--device: '%s' is not a device; use auto, cpu, cuda or cuda:N (N: the CUDA device index)",
       flag.c_str());
}

DeviceChoice resolve_device(const std::string& flag) {
  const std::optional<DeviceChoice> parsed = parse_device(flag);
  if (parsed && !parsed->cuda) return *parsed;
#if TANDEM_HAVE_CUDA
  if (!parsed) {
    std::string why;
    if (cuda::device_count(&why) > 0) return DeviceChoice{.cuda = true, .index = 0};
    std::fprintf(stderr, "tandem: --device auto: no usable CUDA device (%s), running on the CPU\n",
                 why.c_str());
    return DeviceChoice{};
  }
  check_usable(flag, parsed->index);
  return *parsed;
#else
  if (!parsed) {
    std::fprintf(stderr,
                 "tandem: --device auto: this build has no CUDA backend, running on the CPU\n");
    return DeviceChoice{};
  }
  no_cuda_backend(flag);
#endif
}

DType resolve_kv_dtype(const std::string& flag, const DeviceChoice& device) {
  if (flag == "auto") return device.cuda ? DType::BF16 : DType::F32;
  if (flag == "f32") return DType::F32;
  if (flag == "bf16") {
    if (!device.cuda)
      fail("--kv-cache-dtype bf16: the CPU keeps f32 KV rows; use f32 or auto with --device %s",
           device.name().c_str());
    return DType::BF16;
  }
  fail("--kv-cache-dtype: '%s' is not a KV row type; use auto, f32 or bf16", flag.c_str());
}

bool resolve_gemm_precision(const std::string& flag) {
  if (flag == "bf16") return true;
  if (flag == "f32") return false;
  fail("--gemm-precision: '%s' is not a GEMM precision; use bf16 or f32", flag.c_str());
}

std::unique_ptr<StepRunner> make_step_runner(const DeviceChoice& device, const Model& model,
                                             ThreadPool& pool, KvPool& kv_pool,
                                             int64_t max_step_tokens, bool bf16_gemm) {
  if (!device.cuda) {
    auto cpu = std::make_unique<Decoder>(model, pool, kv_pool, max_step_tokens);
    if (bf16_gemm) cpu->round_bf16_matmul_inputs(cpu::gemm_min_rows());
    return cpu;
  }
#if TANDEM_HAVE_CUDA
  check_usable(device.name(), device.index);
  return std::make_unique<cuda::Decoder>(
      model, kv_pool, max_step_tokens, device.index,
      bf16_gemm ? cuda::GemmInputs::Bf16 : cuda::GemmInputs::HiLo);
#else
  no_cuda_backend(device.name());
#endif
}

void place_vision_tower(VisionTower& tower, const DeviceChoice& device) {
  if (!device.cuda) return;
  const char* env = std::getenv("TANDEM_CUDA_VISION");
  if (env && std::strcmp(env, "0") == 0) {
    std::fprintf(stderr, "tandem: TANDEM_CUDA_VISION=0: the vision tower runs on the CPU\n");
    return;
  }
#if TANDEM_HAVE_CUDA
  try {
    const auto start = std::chrono::steady_clock::now();
    tower.run_on(cuda::cuda_vision_ops(device.index));
    tower.warm_up();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "tandem: vision tower on %s (weights uploaded, warm-up %.2f s)\n",
                 device.name().c_str(), s);
  } catch (const Error& e) {
    tower.run_on(nullptr);
    std::fprintf(stderr,
                 "tandem: warning: the vision tower cannot run on %s (%s); it runs on the CPU, "
                 "slower\n",
                 device.name().c_str(), e.what());
  }
#else
  no_cuda_backend(device.name());
#endif
}

GpuInfo gpu_info(const DeviceChoice& device) {
  if (!device.cuda) fail("gpu_info: %s is not a CUDA device", device.name().c_str());
#if TANDEM_HAVE_CUDA
  check_usable(device.name(), device.index);
  const cuda::DeviceInfo info = cuda::device_info(device.index);
  return {info.name, info.total_bytes, info.free_bytes, info.peak_bandwidth_gbs};
#else
  no_cuda_backend(device.name());
#endif
}

size_t kv_bytes_from_fraction(const DeviceChoice& device, const Model& model, double fraction) {
  if (!(fraction > 0 && fraction <= 1))
    fail("--gpu-memory-fraction must be in (0, 1], got %g", fraction);
  const GpuInfo mem = gpu_info(device);
#if TANDEM_HAVE_CUDA
  const double weights = double(cuda::Decoder::weight_bytes_for(model));
#else
  const double weights = 0;
#endif
  const double in_use = double(mem.total_bytes - mem.free_bytes);
  const double kv =
      fraction * double(mem.total_bytes) - in_use - weights - double(kGpuScratchBytes);
  if (kv <= 0)
    fail(
        "--gpu-memory-fraction %g leaves no room for the KV cache on %s: %.2f GB of %.2f GB minus "
        "%.2f GB already in use, %.2f GB of weights and %.2f GB of scratch; raise the fraction or "
        "give --kv-memory",
        fraction, device.name().c_str(), fraction * double(mem.total_bytes) / 1e9,
        double(mem.total_bytes) / 1e9, in_use / 1e9, weights / 1e9, double(kGpuScratchBytes) / 1e9);
  return size_t(kv);
}

}  // namespace tandem
