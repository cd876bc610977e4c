// The decoder's forward step on one CUDA device: the CPU Decoder's contract
// (model/decoder.h), batched over sequences with paged KV.
//
// Weights are uploaded once: bf16 and f32 as stored, f16 widened to f32,
// affine 4/8-bit matrices (MLX, and GGUF Q8_0/Q4_0/Q4_K as loaded)
// kept packed (4-bit by default, 8-bit with TANDEM_CUDA_PACKED_QUANT=1:
// keeps_packed, device_matrix.h) with f32 scales and biases for the
// fused-dequant GEMV and, for 4-bit steps of 5-32 tokens, the int8
// tensor-core GEMM; other steps dequantize bf16 tiles; the rest, and parts
// of a fused projection that mix formats, are dequantized to bf16. The KV rows live in
// device memory under the block ids of the engine's KvPool (created without
// host storage), one extra scratch block per kind for padding. Activations
// are f32; decode-sized steps run the GEMV kernels (f32 accumulation over
// the stored weights, as the CPU's reference path), larger ones cuBLAS over
// activations rounded to bf16 (GemmInputs::Bf16, the default) or split into
// bf16 hi/lo halves (GemmInputs::HiLo; affine matrices dequantized to bf16
// tiles first). Steps where every sequence decodes one text token are
// replayed from CUDA graphs, one per batch-size bucket; other steps run
// eagerly. Logits of the wanted rows are copied to host memory, or sampled
// on the device (SeqStep::sampling) so only token ids are.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/step_runner.h"

namespace tandem::cuda {

// What the tensor-core GEMMs of steps past the GEMV limit (prefill chunks,
// batched decode) multiply bf16 weights with, and the prefill attention
// kernel its K/V tiles: the f32 activations (q·scale, the softmax weights)
// rounded to bf16 (one product, as vLLM and llama.cpp do; measured on the
// H200: prefill 1.5-1.7x, 32 sequences 1.1-1.2x faster), or split into
// bf16 hi + lo halves (two or three products: f32-level accuracy, as the
// CPU reference). f32 weights always take SGEMM. --gemm-precision bf16|f32.
enum class GemmInputs { Bf16, HiLo };

class Decoder : public StepRunner {
 public:
  // Uploads `model` to CUDA device `device` and allocates KV storage for
  // every block of `kv_pool`. Throws Error naming a CUDA failure or a
  // feature the GPU path lacks.
  Decoder(const Model& model, KvPool& kv_pool, int64_t max_step_tokens, int device,
          GemmInputs gemm_inputs = GemmInputs::Bf16);
  ~Decoder() override;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelSpec& spec() const override;
  int64_t max_step_tokens() const override;
  KvPool& kv_pool() override;
  const char* device_name() const override;
  void step(std::span<const SeqStep> batch) override;
  // Penalties, greedy and temperature/top-k/top-p/min-p sampling run on the
  // device (backend/cuda/kernels.h sample_rows): only ids cross to the host.
  bool samples_on_device() const override;
  // Tunes the cuBLAS GEMMs of the decode graphs of every bucket up to
  // max_sequences rows (GemmTuner) at once, with one log line, so serving
  // never waits for it; buckets met later are tuned at their first capture.
  // A failure is logged and left to that later tuning.
  void prepare(int64_t max_sequences) override;

  // Runs `batch` as step() does (its effects included) with a timing event
  // after every op: the device time of each kind of op summed over layers,
  // in the order they first ran. A decode step is captured into a one-off
  // graph with event nodes (so its times are a replay's, plus the events'
  // own small cost); other steps run eagerly after a device-side wait that
  // lets the host queue the whole step first.
  struct OpTime {
    std::string op;
    double ms = 0;
    size_t bytes = 0;  // weight bytes streamed
    int calls = 0;
  };
  std::vector<OpTime> profile_step(std::span<const SeqStep> batch);

  // Benchmarks only: later steps skip the ops whose profile name
  // (profile_step) contains one of `ops` ("attention", "qkv post", "down
  // proj", ...), so the replayed step's time without them gives each op's
  // marginal cost where kernels overlap (PDL), which the event-separated
  // profile cannot. The skipped ops' outputs are stale: logits are garbage.
  void leave_out(std::vector<std::string> ops);

  // Device bytes held for weights; of them, the bytes a decode step streams
  // (every matrix but the embedding tables, which are only gathered from —
  // unless the head is the tied embedding); and the KV cache's bytes.
  size_t weight_bytes() const;
  size_t streamed_bytes() const;
  size_t kv_bytes() const;
  // Turns CUDA graphs for decode steps off (on by default; TANDEM_CUDA_GRAPHS=0
  // does the same), for tests that compare both paths.
  void set_graphs(bool on);

  // Steps of at most this many tokens run the GEMV kernels; larger ones
  // cuBLAS (2 unless TANDEM_GEMV_MAX_TOKENS says otherwise: measured on the
  // H200, cuBLAS over hi/lo-split activations beats the GEMV from 4 rows).
  static int64_t gemv_max_tokens();
  // The same for matrices kept as packed 4/8-bit codes (8 unless
  // TANDEM_AFFINE_GEMV_MAX_TOKENS says otherwise; 4-bit matrices stop at 4
  // while the int8 GEMM is on): larger 8-bit steps dequantize bf16 tiles of
  // rows for cuBLAS, which rewrites every weight at twice the bf16 size each
  // step, so the GEMV stays ahead for longer.
  static int64_t affine_gemv_max_tokens();

  // The rows a decode step of n sequences runs as (the bucket whose CUDA
  // graph it replays, padding rows decoding into scratch blocks): powers of
  // two, and from 16 also 1.5 times them, capped at max_step_tokens.
  static int64_t graph_bucket(int64_t n, int64_t max_step_tokens);

  // Device bytes the weights of `model` will take (what the constructor
  // uploads), for sizing the KV cache before constructing.
  static size_t weight_bytes_for(const Model& model);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda
