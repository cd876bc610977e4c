// The decoder's forward step on one CUDA device: the CPU Decoder's contract
// (model/decoder.h), batched over sequences with paged KV.
//
// Weights are uploaded once (bf16 and f32 as stored, f16 widened to f32,
// quantized weights dequantized to bf16: correct, not yet memory-saving).
// The KV rows live in device memory under the block ids of the engine's
// KvPool (created without host storage), one extra scratch block per kind
// for padding. Activations are f32; decode-sized steps run the GEMV kernels
// (f32 accumulation over bf16 weights, as the CPU), larger ones cuBLAS with
// bf16 activations. Steps where every sequence decodes one text token are
// replayed from CUDA graphs, one per batch-size bucket; other steps run
// eagerly. Logits of the wanted rows are copied to host memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "model/decoder.h"
#include "model/step_runner.h"

namespace tandem::cuda {

class Decoder : public StepRunner {
 public:
  // Uploads `model` to CUDA device `device` and allocates KV storage for
  // every block of `kv_pool`. Throws Error naming a CUDA failure or a
  // feature the GPU path lacks.
  Decoder(const Model& model, KvPool& kv_pool, int64_t max_step_tokens, int device);
  ~Decoder() override;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelSpec& spec() const override;
  int64_t max_step_tokens() const override;
  KvPool& kv_pool() override;
  const char* device_name() const override;
  void step(std::span<const SeqStep> batch) override;

  // Device bytes held for weights; of them, the bytes a decode step streams
  // (every matrix but the embedding tables, which are only gathered from —
  // unless the head is the tied embedding); and the KV cache's bytes.
  size_t weight_bytes() const;
  size_t streamed_bytes() const;
  size_t kv_bytes() const;
  // Turns CUDA graphs for decode steps off (on by default; TANDEM_CUDA_GRAPHS=0
  // does the same), for tests that compare both paths.
  void set_graphs(bool on);

  // Device bytes the weights of `model` will take (what the constructor
  // uploads), for sizing the KV cache before constructing.
  static size_t weight_bytes_for(const Model& model);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda
