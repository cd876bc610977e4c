// The CUDA devices this process can use, and device memory that frees
// itself. Built only with the CUDA backend (TANDEM_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace tandem::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int multiprocessors = 0;
  size_t total_bytes = 0, free_bytes = 0;
  double peak_bandwidth_gbs = 0;  // from the memory clock and bus width (nominal)
};

// Number of usable devices; 0 with `why` set when there is none (no driver,
// driver older than the runtime, no GPU).
int device_count(std::string* why);
DeviceInfo device_info(int index);
// What kernel launches check of a device, queried once per device (cheap to
// ask per launch): its compute capability major, the shared memory a block
// may opt in to and its multiprocessor count (zeros for a device that cannot
// be queried).
struct LaunchLimits {
  int cc_major = 0;
  size_t smem_optin = 0;
  int multiprocessors = 0;
};
LaunchLimits launch_limits(int device);
// launch_limits of the current device; all zeros where there is none usable
// (so a rule sized by them takes its no-device answer: no split, no cluster).
LaunchLimits current_launch_limits();
// Whether the current device launches thread-block clusters (sm_90+; false
// when there is no usable device).
bool clusters_supported();
// Lets `kernel` (a __global__ function's address) take up to the current
// device's opt-in shared memory per block, less its static shared memory,
// as dynamic shared memory: cudaFuncSetAttribute, a per-device setting, done
// once per kernel and device.
void allow_opt_in_shared_memory(const void* kernel);
// EXPERIMENT (TANDEM_CUDA_CARVEOUT=P, unset by default): asks every kernel
// launch.h starts to prefer P percent of an SM's unified L1 / shared memory
// as shared memory (cudaFuncAttributePreferredSharedMemoryCarveout, once
// per kernel and device). Session 43 measured 100 and 70 (slower: the
// GEMVs lose L1). Session 44's probe (bench_cuda_cluster_pdl, table 3):
// behind a kernel without shared memory, a kernel asking for any (8 KB and
// up) enters only when its predecessor ends, not early under PDL — unless
// it prefers 0% (table 4), which also left the kernels after it a larger
// L1. So P = 0 is measured next. With TANDEM_CUDA_CARVEOUT_SCOPE=small, only
// kernels whose blocks ask for 1 byte to 64 KB of shared memory (static
// plus `dynamic_smem` at their first launch) get the preference: those the
// probe shows waiting, while kernels without shared memory (which enter
// early anyway) and the attention's 160-220 KB keep the default. No-op when
// unset.
void prefer_shared_carveout(const void* kernel, size_t dynamic_smem);
// Whether the kernels this thread launches now use programmatic dependent
// launch (launch.h): the device is sm_90 or newer and either a PdlScope
// asks for it or TANDEM_CUDA_PDL=1 (TANDEM_CUDA_PDL=0: never). Measured on
// the H200: batch-1 decode +6% (llama-3.2-1b shapes) and +11% (gemma-3-1b);
// on the H100 4-16 sequences +4-16%, 32 -1.6% to +3.4% by shape; the
// decoder asks for it on decode-sized steps (Decoder::Impl::pdl_tokens).
bool pdl_enabled();
// Asks for PDL (or not) for the launches of this thread until destroyed.
class PdlScope {
 public:
  explicit PdlScope(bool want);
  ~PdlScope();
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool previous_;
};
// Environment switches for measuring one path against another
// (docs/architecture.md lists them): whether `name` is set to `value`, and
// a non-negative count with its default.
bool env_is(const char* name, const char* value);
int64_t env_count(const char* name, int64_t fallback);
// The runtime and driver versions as "13.0" strings.
std::string runtime_version();
std::string driver_version();

// Device memory of `bytes`, freed on destruction (movable, not copyable).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);    // synchronous
  void download(void* host, size_t bytes) const;  // synchronous

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tandem::cuda
