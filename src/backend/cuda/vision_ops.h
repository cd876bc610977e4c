// The vision towers' ops (model/vision_ops.h) on one CUDA device: weights
// and tower constants uploaded on first use (bf16 matrices as stored, f32
// and f16 as f32, quantized ones dequantized to bf16, as the decoder's
// default), activations in device memory from a stream-ordered pool.
// Matmuls are cuBLAS: bf16 weights against activations split into bf16 hi
// + lo parts (two tensor-core GEMMs, 16 significant bits, as the decoder's
// prefill), f32 weights SGEMM. Attention is the decoder's flash-attention
// prefill kernel over the patches as one sequence with every key visible
// where one pass covers the head dim (64, 128, 256), else the scores of a
// block of query rows materialized (one cuBLAS GEMM over q and k as three
// bf16 parts, a softmax kernel, three GEMMs for P · v): vision_ops.cpp's
// flash_takes() says what each measured.
#pragma once

#include <memory>

#include "model/vision_ops.h"

namespace tandem::cuda {

// Throws Error naming a CUDA failure (e.g. the device cannot be used).
std::unique_ptr<VisionOps> cuda_vision_ops(int device);

}  // namespace tandem::cuda
