// The decoder's forward pass on one CUDA device, one sequence at a time.
//
// UNFINISHED (issue 6): this is the correctness path the batched engine step
// will grow from. It mirrors model/decoder.cpp op for op with the kernels of
// backend/cuda/kernels.h (f32 activations, weights as stored: bf16 or f32,
// f16 widened to f32), a contiguous KV cache per layer, and prefill in
// chunks through the decode GEMV (no cuBLASLt GEMM yet). Not yet: batches,
// paged KV shared with the engine, CUDA graphs, per-layer embeddings and KV
// sharing (Gemma 4), the query temperature (Ministral 3), image embeddings
// — the constructor refuses those models naming the feature.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/runtime.h"
#include "model/model.h"

namespace tandem::cuda {

class SequenceDecoder {
 public:
  // Uploads `model`'s weights to the current device and sizes the KV cache
  // for `max_context` positions. Throws Error naming an unsupported feature
  // or a CUDA failure.
  SequenceDecoder(const Model& model, int64_t max_context);
  ~SequenceDecoder();
  SequenceDecoder(const SequenceDecoder&) = delete;
  SequenceDecoder& operator=(const SequenceDecoder&) = delete;

  // Runs `n` tokens at positions length() .. length()+n-1 and writes the
  // logits of the last one ([V]) or of all ([n, V]) to host memory.
  void feed(const int32_t* ids, int64_t n, float* logits, bool all_logits);
  int64_t length() const { return length_; }
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t length_ = 0;
  size_t weight_bytes_ = 0;
};

}  // namespace tandem::cuda
