// Small helpers shared by the benchmark programs: timing, page-aligned
// buffers, the memory-read-bandwidth probe, and flag parsing.
#pragma once

#include <immintrin.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A zero-initialized, 2 MiB-aligned buffer with every page touched (so first
// -touch page faults never land inside a timed region). With huge = true the
// kernel is asked for transparent huge pages; by default it is not, matching
// weights that are mmapped from a checkpoint file.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes, bool huge = false) : bytes_(bytes) {
    constexpr size_t kAlign = size_t(2) << 20;
    data_ = static_cast<char*>(std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign));
    if (!data_) {
      std::fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
      std::exit(1);
    }
    if (huge) madvise(data_, bytes, MADV_HUGEPAGE);
    std::memset(data_, 0, bytes);
  }
  ~Buffer() { std::free(data_); }
  Buffer(Buffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T = char>
  T* data() const {
    return reinterpret_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Sums n floats (n a multiple of 64) with 512-bit loads and 4 independent
// accumulators: the read stream of a GEMV without its arithmetic.
__attribute__((target("avx512f"))) inline float sum_avx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

#pragma GCC diagnostic pop

// The same with 256-bit loads, for processors without AVX-512.
__attribute__((target("avx2"))) inline float sum_avx2(const float* p, size_t n) {
  __m256 a[8];
  for (auto& v : a) v = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 64)
    for (int j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_load_ps(p + i + 8 * j));
  for (int j = 1; j < 8; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  float lanes[8];
  _mm256_storeu_ps(lanes, a[0]);
  float s = 0;
  for (float f : lanes) s += f;
  return s;
}

// Best-of-`runs` read bandwidth in GB/s (1e9 bytes/s) of summing buf on the
// pool's threads, each thread reading one contiguous band.
inline double read_bandwidth(tandem::ThreadPool& pool, const Buffer& buf, int runs = 5) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const size_t floats = buf.size() / sizeof(float) / 64 * 64;
  const int64_t blocks = int64_t(floats / 4096);  // 16 KiB scheduling units
  double best = 0;
  std::atomic<float> sink{0};
  for (int run = 0; run < runs; ++run) {
    const double t0 = now_s();
    pool.parallel_for(blocks, 1, [&](int64_t b, int64_t e) {
      const float* p = buf.data<float>() + b * 4096;
      const size_t n = size_t(e - b) * 4096;
      const float s = avx512 ? sum_avx512(p, n) : sum_avx2(p, n);
      sink.store(s, std::memory_order_relaxed);  // keeps the sum from being optimized away
    });
    const double dt = now_s() - t0;
    best = std::max(best, double(blocks) * 4096 * sizeof(float) / dt / 1e9);
  }
  return best;
}

// Fraction of CPU time the whole machine spent idle during the next `window_s`
// seconds (from /proc/stat; -1 when that cannot be read).
inline double idle_fraction(double window_s) {
  auto sample = [](uint64_t* idle, uint64_t* total) {
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[10] = {};
    const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                                &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]);
    std::fclose(f);
    if (got < 8) return false;
    *idle = v[3] + v[4];
    *total = 0;
    for (int i = 0; i < 8; ++i) *total += v[i];
    return true;
  };
  uint64_t i0, t0, i1, t1;
  if (!sample(&i0, &t0)) return -1;
  const double until = now_s() + window_s;
  while (now_s() < until) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  if (!sample(&i1, &t1) || t1 == t0) return -1;
  return double(i1 - i0) / double(t1 - t0);
}

// Waits up to max_s seconds for a 0.3 s window in which the machine was at
// least 90% idle: this 2-core machine is shared, and a compiler running on the
// other core halves a 2-thread figure. Returns whether such a window came.
inline bool wait_for_idle(double max_s) {
  if (max_s <= 0) return true;
  const double until = now_s() + max_s;
  do {
    const double idle = idle_fraction(0.3);
    if (idle < 0 || idle >= 0.9) return true;
  } while (now_s() < until);
  return false;
}

// Minimal "--name value" / "--flag" parsing.
struct Args {
  std::vector<std::string> argv;
  Args(int argc, char** argv_) : argv(argv_ + 1, argv_ + argc) {}
  bool has(const std::string& name) const {
    return std::find(argv.begin(), argv.end(), name) != argv.end();
  }
  double get(const std::string& name, double def) const {
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == name) return std::atof(argv[i + 1].c_str());
    return def;
  }
  std::string get(const std::string& name, const std::string& def) const {
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == name) return argv[i + 1];
    return def;
  }
};

}  // namespace bench
