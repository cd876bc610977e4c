// How one request picks its tokens; the contract is engine/sampler.h's
// (the CPU Sampler) and the CUDA sampler's (backend/cuda/kernels.h).
#pragma once

#include <cstdint>

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;

  bool penalized() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

}  // namespace tandem
