// Helpers shared by the CUDA benchmark programs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/runtime.h"

namespace tandem::bench {

// Whether a CUDA device is usable; where none is, prints why, as `program`.
inline bool have_device(const char* program) {
  std::string why;
  if (cuda::device_count(&why) > 0) return true;
  std::fprintf(stderr, "%s: no usable CUDA device: %s\n", program, why.c_str());
  return false;
}

// The reachable read bandwidth the benchmarks quote fractions of: GB/s of a
// large device-to-device copy (read + write bytes), after one warm-up copy.
inline double copy_gbs(size_t bytes = size_t(2) << 30) {
  cuda::DeviceBuffer a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  CUDA_CHECK(cudaEventRecord(t0));
  const int reps = 10;
  for (int i = 0; i < reps; ++i)
    CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaEventRecord(t1));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return 2.0 * double(bytes) * reps / (ms * 1e-3) / 1e9;
}

// Seconds per call of `f` (its work on `stream`), averaged over `reps`
// calls after one warm-up call.
inline double seconds_per_call(const std::function<void()>& f, int reps,
                               cudaStream_t stream = nullptr) {
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  f();
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaEventRecord(t0, stream));
  for (int i = 0; i < reps; ++i) f();
  CUDA_CHECK(cudaEventRecord(t1, stream));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return ms * 1e-3 / reps;
}

// Seconds of one replay of the CUDA graph that `record()` captures on
// `stream` (its launches, in order), averaged over `reps` replays after one
// warm-up replay: device time without per-launch host overhead, as the
// decoder's graphs run.
inline double graph_seconds(const std::function<void()>& record, int reps, cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  record();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double s =
      seconds_per_call([&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, reps, stream);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return s;
}

}  // namespace tandem::bench
