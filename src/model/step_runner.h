// What the engine and the CLI run a model through: one forward step over a
// batch of sequences with paged KV (model/decoder.h defines SeqStep and the
// contract). Implemented by the CPU Decoder and by cuda::Decoder; the
// backend is picked once, from --device (engine/device.h).
#pragma once

#include <cstdint>
#include <span>

#include "model/kv_pool.h"
#include "model/model.h"

namespace tandem {

struct SeqStep;

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ModelSpec& spec() const = 0;
  // Tokens one step may carry in all.
  virtual int64_t max_step_tokens() const = 0;
  // The block ids (and, on the CPU, the storage) of the KV cache.
  virtual KvPool& kv_pool() = 0;
  // Runs one step; see Decoder::step for the contract (checks first, throws
  // Error before changing any state; logits land in host memory).
  virtual void step(std::span<const SeqStep> batch) = 0;
  // "cpu" or "cuda:N", for logs and /v1/status.
  virtual const char* device_name() const = 0;
  // Whether steps may ask for sampling (SeqStep::sampling) instead of logits.
  virtual bool samples_on_device() const { return false; }
  // Before the first request: readies what decode steps of up to
  // `max_sequences` sequences need, so no request waits for it (the CUDA
  // decoder tunes its decode GEMMs). Never throws; nothing for the CPU.
  virtual void prepare(int64_t /*max_sequences*/) {}
};

}  // namespace tandem
