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
// Whether kernel launches use programmatic dependent launch (launch.h):
// TANDEM_CUDA_PDL=1 and the current device is sm_90 or newer (decided once
// per process). Off by default: the kernels follow its contract, but it has
// not yet run on a GPU.
bool pdl_enabled();
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
