// The gated MLP's activations, shared by the element-wise kernel and the
// GEMV epilogue so both lanes compute the same values (f32, as the CPU).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"  // GemvGate

namespace tandem::cuda {

__device__ __forceinline__ float silu(float v) {
  return v / (1.f + __expf(-v));
}

__device__ __forceinline__ float gelu_tanh(float v) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * v * (1.f + tanhf(k * (v + 0.044715f * v * v * v)));
}

// act(gate) · up for a gate chosen at run time (SiLU or GeluTanh): the
// gated outputs of the GEMV and skinny GEMM epilogues.
__device__ __forceinline__ float gate_value(GemvGate g, float gate, float up) {
  return (g == GemvGate::SiLU ? silu(gate) : gelu_tanh(gate)) * up;
}

}  // namespace tandem::cuda
