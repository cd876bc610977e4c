// The vision towers' ops (model/vision_ops.h) on one CUDA device: weights
// and tower constants uploaded on first use (bf16 matrices as stored, f32
// and f16 as f32, quantized ones dequantized to bf16, as the decoder's
// default), activations in device memory from a stream-ordered pool.
// Matmuls are cuBLAS: bf16 weights against activations split into bf16 hi
// + lo parts (two tensor-core GEMMs, 16 significant bits, as the decoder's
// prefill), f32 weights SGEMM. Attention is the decoder's flash-attention
// prefill kernel over the image's patches as one sequence with every key
// visible (head dims not a multiple of 16, SigLIP's 72, padded with zeros).
#pragma once

#include <memory>

#include "model/vision_ops.h"

namespace tandem::cuda {

// Throws Error naming a CUDA failure (e.g. the device cannot be used).
std::unique_ptr<VisionOps> cuda_vision_ops(int device);

}  // namespace tandem::cuda
