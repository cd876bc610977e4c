// Helpers shared by the CUDA tests: device round trips, random data, the
// parity fixtures and the error measure the decoder tests state bounds in.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/runtime.h"
#include "core/dtype.h"

namespace tandem::cuda_test {

// True when a CUDA device is usable; otherwise `why` says why not.
inline bool have_gpu(std::string* why) {
  return cuda::device_count(why) > 0;
}

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
  cuda::DeviceBuffer b(std::max<size_t>(1, v.size()) * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// The first n values of `b`, after the device finished its work.
template <class T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  cudaDeviceSynchronize();
  b.download(v.data(), n * sizeof(T));
  return v;
}

// n normal values of standard deviation `scale`, reproducible by seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// v rounded to bf16 (core/dtype.h's rounding), bits.
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// An environment variable set for a scope and restored after it (a run may
// set the same switch for all its tests).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), before_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, before_;
  bool had_ = false;
};

// A path in the checkout: under $TANDEM_SOURCE_DIR when set (a build
// carried to another machine), else the source folder the build came from.
inline std::string source_path(const std::string& relative) {
  const char* env = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(env ? env : TANDEM_SOURCE_DIR) + "/" + relative;
}

// A parity fixture of the checkout.
inline std::string fixture(const std::string& name) {
  return source_path("tests/fixtures/parity/" + name);
}

// max |a - b| over the standard deviation of b.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0, sum2 = 0, max_abs = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    sum += b[i];
    sum2 += double(b[i]) * b[i];
    max_abs = std::max(max_abs, std::fabs(double(a[i]) - b[i]));
  }
  const double n = double(b.size());
  return max_abs / std::sqrt(sum2 / n - (sum / n) * (sum / n));
}

}  // namespace tandem::cuda_test
