// Reductions across a warp and a thread block, shared by the kernels (.cu
// files only).
#pragma once

#include <cuda_runtime.h>

namespace tandem::cuda {

// Sum over the warp of v; every lane gets it.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Max over the warp of v; every lane gets it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (Threads threads, a multiple of 32) of v; every thread
// gets it. `partial` is shared memory of Threads / 32 floats.
template <int Threads>
__device__ __forceinline__ float block_sum(float v, float* partial) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // partial may still be read from a previous call
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < Threads / 32; ++w) s += partial[w];
  return s;
}

}  // namespace tandem::cuda
