// A chain of batch-1 bf16 GEMVs run by one persistent kernel: a block or
// more per SM, the GEMVs one after the other with a grid barrier between
// them, each reading the vector the one before wrote. It exists to measure
// what a persistent decode kernel would save over the decoder's chain of one
// kernel per projection (bench_cuda_chain). Measured on the H100 (session
// 30): nothing — a dependent launch with PDL in a graph costs ~1.25 µs, this
// grid barrier 2.5-3 µs, and the GEMVs stream worse as phases of one
// kernel; so the decoder does not use it (docs/performance.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

// One GEMV of the chain: y = W · x, W [rows, cols] bf16 row-major (cols %
// 8 == 0, 16-byte aligned), x [cols] f32, y [rows] f32; gated (GeluTanh or
// SiLU): y [rows / 2] = act(gate) · up, gate rows first (as gemv_bf16).
struct GemvChainPhase {
  const uint16_t* w = nullptr;
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;
  float* y = nullptr;
  GemvGate gate = GemvGate::None;
};

// What the kernel does between phases while the grid barrier waits:
// nothing; prefetch into L2 the weights each warp reads first in the next
// phase; or load them into the registers the next phase starts from.
enum class ChainPrefetch { None, L2, Registers };

class GemvChain {
 public:
  // Checks the phases (a clear error naming the phase at fault) and uploads
  // them with the column split each gets. blocks_per_sm 0: as many as the
  // kernel's registers allow (at most 4).
  explicit GemvChain(std::vector<GemvChainPhase> phases, int blocks_per_sm = 0);
  // Runs every phase in order on `stream` (one cooperative launch).
  void run(cudaStream_t stream, ChainPrefetch prefetch = ChainPrefetch::Registers);
  int blocks() const { return blocks_; }
  // The weight bytes one run streams.
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  int phases_ = 0, blocks_ = 0;
  size_t weight_bytes_ = 0;
  DeviceBuffer table_;    // the phases as the kernel reads them
  DeviceBuffer barrier_;  // the grid barrier's arrival count and generation
};

}  // namespace tandem::cuda
