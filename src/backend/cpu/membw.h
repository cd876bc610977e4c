// Measures this machine's sustained memory read bandwidth, the ceiling of
// batch-1 decode, so benchmarks can print the fraction of it they reach.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace tandem::cpu {

// Best of `reps` passes summing a `bytes`-sized buffer (far larger than the
// caches) on all of the pool's threads. Returns GB/s (1e9 bytes per second).
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t(1) << 30, int reps = 5);

}  // namespace tandem::cpu
