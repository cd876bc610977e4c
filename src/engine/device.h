// Where the model runs: --device auto|cpu|cuda[:N], resolved once against
// this build and machine, and the StepRunner for that device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace tandem {

struct Model;
class KvPool;
class StepRunner;
class ThreadPool;
class VisionTower;

struct DeviceChoice {
  bool cuda = false;
  int index = 0;             // the CUDA device (cuda only)
  std::string name() const;  // "cpu" or "cuda:N"
};

// --device as written: nullopt for "auto"; Error naming the flag and the
// accepted values for anything but auto, cpu, cuda, cuda:N.
std::optional<DeviceChoice> parse_device(const std::string& flag);

// parse_device, checked against this build and machine. auto: cuda:0 when a
// CUDA device is usable, else cpu with one line on stderr saying why. cuda or
// cuda:N without the CUDA backend, without a usable device or with N out of
// range: Error saying what to do.
DeviceChoice resolve_device(const std::string& flag);

// --gemm-precision: what the matrix products over bf16 weights of steps
// past the decode GEMV (prefill chunks, batched decode; on the GPU also the
// prefill attention) take as their f32 inputs. "bf16" (the default):
// rounded to bf16, as vLLM and llama.cpp do — on the GPU into its
// tensor-core GEMMs, on the CPU into bf16 dot products (cpu::MatmulInputs);
// "f32": f32-level on the GPU (each as two bf16 halves; prefill ~1.6x
// slower), exact f32 products on the CPU (~1.8x slower prefill). Returns
// whether it is bf16. Error naming the flag for any other value.
bool resolve_gemm_precision(const std::string& flag);

// The CPU Decoder, or cuda::Decoder on `device` (whose KvPool must be
// created without host storage: see kv_host_storage) with bf16 GEMM inputs
// or f32-level ones (resolve_gemm_precision).
std::unique_ptr<StepRunner> make_step_runner(const DeviceChoice& device, const Model& model,
                                             ThreadPool& pool, KvPool& kv_pool,
                                             int64_t max_step_tokens, bool bf16_gemm = true);
// Runs `tower`'s image encodes on `device` when it is a CUDA device
// (backend/cuda/vision_ops.h) and TANDEM_CUDA_VISION is not 0: warmed up
// once there, so its weights are in device memory before a KV cache is
// sized. If the GPU path fails, one warning line and the tower stays on the
// CPU (correct, slower). Nothing for the CPU.
void place_vision_tower(VisionTower& tower, const DeviceChoice& device);
// Whether the KvPool of a runner on `device` holds the rows in host memory.
inline bool kv_host_storage(const DeviceChoice& device) {
  return !device.cuda;
}
// --kv-cache-dtype checked against `device`: "auto" is BF16 on CUDA (half
// the KV bytes each decode step reads, as vLLM and llama.cpp keep by
// default) and F32 on the CPU; "f32" and "bf16" ask for one. Error naming
// the flag for any other value, and for bf16 on the CPU (its decoder keeps
// f32 rows).
DType resolve_kv_dtype(const std::string& flag, const DeviceChoice& device);

// A CUDA device: its name, its memory now (cudaMemGetInfo) and its nominal
// memory bandwidth. Error for the CPU or without the CUDA backend.
struct GpuInfo {
  std::string name;
  size_t total_bytes = 0, free_bytes = 0;
  double peak_bandwidth_gbs = 0;
};
GpuInfo gpu_info(const DeviceChoice& device);

// Device memory set aside for activations, cuBLAS workspaces and CUDA graphs
// when the KV cache is sized from --gpu-memory-fraction.
constexpr size_t kGpuScratchBytes = size_t(512) << 20;

// KV cache bytes for --gpu-memory-fraction f on a CUDA device:
// f × total − (total − free) − the model's weights − kGpuScratchBytes.
// Error when that leaves nothing.
size_t kv_bytes_from_fraction(const DeviceChoice& device, const Model& model, double fraction);

}  // namespace tandem
