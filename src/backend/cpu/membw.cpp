#include "backend/cpu/membw.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/cpu/kernels.h"

namespace tandem::cpu {

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  const int64_t n = int64_t(bytes / sizeof(float));
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, size_t(n) * sizeof(float))), &std::free);
  // First touch from the pool so pages land where the readers run.
  pool.parallel_for(
      n, 1 << 16, [&](int64_t b, int64_t e) { std::memset(buf.get() + b, 0, size_t(e - b) * 4); });
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      // dot(x, x) streams x once: both operands hit the same cache lines.
      sink = sink + dot(buf.get() + b, buf.get() + b, e - b);
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(bytes) / s / 1e9);
  }
  return best;
}

}  // namespace tandem::cpu
