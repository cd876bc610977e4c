#include "backend/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "backend/cuda/check.h"

namespace tandem::cuda {

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  fail("CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), call, file,
       line);
}

namespace {

thread_local bool t_pdl_wanted = false;

// TANDEM_CUDA_PDL: unset, the decoder's choice; "0" never; "1" always.
const char* pdl_env() {
  static const char* e = std::getenv("TANDEM_CUDA_PDL");
  return e;
}

bool pdl_supported() {
  static const bool on = [] {
    const char* e = pdl_env();
    if (e && std::string(e) == "0") return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return on;
}

}  // namespace

bool pdl_enabled() {
  if (!pdl_supported()) return false;
  const char* e = pdl_env();
  return t_pdl_wanted || (e && std::string(e) == "1");
}

bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::string(e) == value;
}
int64_t env_count(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  return e ? std::max<int64_t>(0, std::atoll(e)) : fallback;
}

PdlScope::PdlScope(bool want) : previous_(t_pdl_wanted) {
  t_pdl_wanted = want;
}
PdlScope::~PdlScope() {
  t_pdl_wanted = previous_;
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error state for later calls
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device found";
  return n;
}

DeviceInfo device_info(int index) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index);
  d.peak_bandwidth_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // DDR
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  CUDA_CHECK(cudaSetDevice(index));
  CUDA_CHECK(cudaMemGetInfo(&d.free_bytes, &d.total_bytes));
  CUDA_CHECK(cudaSetDevice(current));
  return d;
}

LaunchLimits launch_limits(int device) {
  static std::mutex mu;
  static std::map<int, LaunchLimits> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  LaunchLimits l;
  int optin = 0;
  if (cudaDeviceGetAttribute(&l.cc_major, cudaDevAttrComputeCapabilityMajor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&l.multiprocessors, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess) {
    cudaGetLastError();  // an unusable device: no limits (nothing launches), not remembered
    return LaunchLimits{};
  }
  l.smem_optin = size_t(optin);
  return known[device] = l;
}

LaunchLimits current_launch_limits() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no usable device: not a sticky error for later calls
    return LaunchLimits{};
  }
  return launch_limits(device);
}

bool clusters_supported() {
  return current_launch_limits().cc_major >= 9;
}

// The (kernel, device) pairs a per-kernel attribute has been set for: each
// is set once per kernel and device.
class OncePerKernelAndDevice {
 public:
  // Whether this is the first call for `kernel` on the current device
  // (returned in `device`).
  bool first(const void* kernel, int* device) {
    CUDA_CHECK(cudaGetDevice(device));
    std::lock_guard<std::mutex> lock(mu_);
    return done_.insert({kernel, *device}).second;
  }

 private:
  std::mutex mu_;
  std::set<std::pair<const void*, int>> done_;
};

void allow_opt_in_shared_memory(const void* kernel) {
  static OncePerKernelAndDevice once;
  int device = 0;
  if (!once.first(kernel, &device)) return;
  // The opt-in maximum bounds static + dynamic: asking it all for the
  // dynamic part is an invalid value for a kernel with any static shared
  // memory.
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const size_t optin = launch_limits(device).smem_optin;
  CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      int(optin > attributes.sharedSizeBytes ? optin - attributes.sharedSizeBytes : 0)));
}

void prefer_shared_carveout(const void* kernel, size_t dynamic_smem) {
  static const int64_t percent = env_count("TANDEM_CUDA_CARVEOUT", -1);
  if (percent < 0) return;
  static const bool small_only = env_is("TANDEM_CUDA_CARVEOUT_SCOPE", "small");
  static OncePerKernelAndDevice once;
  int device = 0;
  if (!once.first(kernel, &device)) return;
  if (small_only) {
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const size_t bytes = attributes.sharedSizeBytes + dynamic_smem;
    if (bytes == 0 || bytes > (size_t(64) << 10)) return;
  }
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(std::min<int64_t>(percent, 100))));
}

static std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return version_string(v);
}

std::string driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess || v == 0) return "none";
  return version_string(v);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) fail("DeviceBuffer::upload: %zu bytes into a buffer of %zu", bytes, bytes_);
  CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_) fail("DeviceBuffer::download: %zu bytes from a buffer of %zu", bytes, bytes_);
  CUDA_CHECK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace tandem::cuda
