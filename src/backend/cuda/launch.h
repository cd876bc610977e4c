// Kernel launches with programmatic dependent launch (PDL, sm_90+), so a
// decode step's ~150 small kernels overlap their launch and ramp-up with the
// tail of the kernel before (inside CUDA graphs too).
//
// Contract of every kernel started by launch(): it calls pdl_wait() before
// it reads memory an earlier kernel writes, and before it writes memory an
// earlier kernel may still read (pdl_wait returns once the previous kernel
// has finished and its writes are visible); it may read what no kernel
// writes before that: weights, and a step's inputs (copied in before the
// step's first kernel, which starts only once the copy is done, and every
// later kernel after it). pdl_launch_dependents() lets the next kernel
// be scheduled (its blocks then wait in pdl_wait). Because every kernel
// lets its dependents launch at its start, blocks of kernels several steps
// apart can run side by side on an SM. A grid lives from its early launch,
// so data an earlier kernel of the chain writes is never read through the
// non-coherent path (ld.global.nc: __ldg, or what nvcc emits for a
// `const T* __restrict__` parameter the kernel only reads), whose contract
// is that the data does not change while the grid lives: the packed GEMV's
// activation scratch, rewritten for every GEMV, read stale that way on the
// H200 (bench/results/cuda-pdl-coherence-2026-12-04.md). Activations are
// read with plain loads (coherent after pdl_wait, cached in L1) through
// pointers without __restrict__; weights, tables and a step's copied-in
// inputs may use __ldg and __restrict__. Without PDL (outside a
// PdlScope that asks for it, TANDEM_CUDA_PDL=0, devices before sm_90: see
// runtime.h) both are no-ops and launches are ordinary.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Included only by .cu files (the launch syntax below needs nvcc).
// A cluster of more than one block launches thread-block clusters of that
// shape (sm_90+; each grid dimension a multiple of the cluster's; the
// caller checks the device), for kernels that share shared memory across a
// cluster.
template <class... Params, class... Args>
void launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, dim3 cluster, Args&&... args) {
  prefer_shared_carveout(reinterpret_cast<const void*>(kernel), smem);
  const bool pdl = pdl_enabled();
  const bool clustered = cluster.x * cluster.y * cluster.z > 1;
  if (!pdl && !clustered) {  // the ordinary launch
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2] = {};
  unsigned count = 0;
  if (pdl) {
    attr[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (clustered) {
    attr[count].id = cudaLaunchAttributeClusterDimension;
    attr[count].val.clusterDim.x = cluster.x;
    attr[count].val.clusterDim.y = cluster.y;
    attr[count++].val.clusterDim.z = cluster.z;
  }
  cfg.attrs = attr;
  cfg.numAttrs = count;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  launch_clustered(kernel, grid, block, smem, stream, dim3(1), std::forward<Args>(args)...);
}

}  // namespace tandem::cuda
