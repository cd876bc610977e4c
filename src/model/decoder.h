// The one decoder: a pre-norm transformer whose family differences are
// ModelSpec flags. CPU backend. A step runs any number of sequences at once:
// their new tokens are concatenated so every weight is streamed once per step
// (decode tokens and prefill chunks alike), and each sequence attends over
// its own paged KV blocks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/sampling_params.h"
#include "core/thread_pool.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/step_runner.h"

namespace tandem {

// A token the penalties of a sampled row touch: `count` times in the
// output, `seen` when in the prompt or the output.
struct TokenPenalty {
  int32_t id = 0, count = 0, seen = 0;
};

// Sampling by the step runner itself (StepRunner::samples_on_device()), so
// only the token id reaches the host: the sequence's last-token logits are
// penalized and sampled under the Sampler contract (engine/sampler.h).
struct StepSampling {
  SamplingParams params;                    // seed unused: `uniform` is the draw
  double uniform = 0.0;                     // one draw in [0, 1) from the sequence's generator
  std::span<const TokenPenalty> penalties;  // each distinct prompt/output token, when penalized
  int32_t* token = nullptr;                 // out: the id, or -1 when the logits held a NaN
};

// One sequence's part of a step.
struct SeqStep {
  const int32_t* ids = nullptr;  // new tokens, at positions kv->length ..
  int64_t n = 0;
  SequenceKv* kv = nullptr;  // must already hold blocks for length + n (kv_reserve)
  float* logits = nullptr;   // [n, V] when all_logits, [V] for the last token, or null
  bool all_logits = false;
  // Multimodal prefill (both optional, [n] each):
  const float* const* embeds = nullptr;    // a [D] row replacing token i's embedding (image
                                           // features, unscaled), or null for the token's own
  const int64_t* key_end = nullptr;        // token i sees keys below this position: i's own
                                           // position + 1 (causal) or the end of its image run
                                           // (bidirectional within an image; the run must be in
                                           // this step)
  const StepSampling* sampling = nullptr;  // instead of logits: sample the last token's row
};

// The CPU backend's StepRunner.
class Decoder : public StepRunner {
 public:
  static constexpr int64_t kDefaultStepTokens = 256;

  // Steps may carry at most `max_step_tokens` tokens in all. `kv_pool` must
  // hold host storage.
  Decoder(const Model& model, ThreadPool& pool, KvPool& kv_pool,
          int64_t max_step_tokens = kDefaultStepTokens);

  const ModelSpec& spec() const override { return model_.spec; }
  int64_t max_step_tokens() const override { return max_step_tokens_; }
  KvPool& kv_pool() override { return kv_pool_; }
  const char* device_name() const override { return "cpu"; }

  // Runs one step. Checks everything first (ids in [0, V), KV blocks
  // reserved, token total) and throws Error before changing any state; then
  // appends each sequence's tokens to its KV and advances kv->length.
  void step(std::span<const SeqStep> batch) override;

  // Rounds every K and V row to bf16 values (nearest even) as it is written,
  // still held as f32: the numerics of a runner that keeps bf16 rows
  // (cuda::Decoder over a KvPool of BF16 rows), which its tests compare
  // against. Off by default.
  void round_kv_rows_to_bf16(bool on) { round_kv_bf16_ = on; }
  // Rounds the inputs of every matmul over bf16 weights with at least
  // `min_rows` rows to bf16 values (nearest even) first (cpu::MatmulInputs::
  // Bf16). cpu::gemm_min_rows(): --gemm-precision bf16 (make_step_runner),
  // whose prefill GEMMs then run on bf16 dot products; the GPU's GEMV limit
  // + 1: the numerics of cuda::Decoder with bf16 GEMM inputs, whose steps
  // past that limit feed cuBLAS bf16 activations (its tests' oracle). 0 (the
  // default): off, every product exact in f32.
  void round_bf16_matmul_inputs(int64_t min_rows) { round_inputs_rows_ = min_rows; }

 private:
  void per_layer_inputs(std::span<const SeqStep> batch, int64_t tokens);
  void attention_block(int64_t layer, std::span<const SeqStep> batch, int64_t tokens);
  void mlp_block(int64_t layer, int64_t tokens);
  void per_layer_block(int64_t layer, int64_t tokens);
  // cpu::matmul, with the input rounding of round_bf16_matmul_inputs.
  void matmul(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y);
  void linear(const float* x, int64_t n, const WeightMatrix& w, const Vec& bias, float* y);

  const Model& model_;
  ThreadPool& pool_;
  KvPool& kv_pool_;
  int64_t max_step_tokens_;
  bool round_kv_bf16_ = false;
  int64_t round_inputs_rows_ = 0;
  std::vector<RopeTable> rope_;  // [L]: per layer, since head dims differ (Gemma 4)
  // Scratch for max_step_tokens tokens (T); Dh and F are the largest of any layer.
  std::vector<float> h_;           // [T, D] residual stream
  std::vector<float> x_;           // [T, D] normed input of a block
  std::vector<float> q_;           // [T, H·Dh]
  std::vector<float> k_;           // [T, K·Dh]
  std::vector<float> v_;           // [T, K·Dh]
  std::vector<float> attn_;        // [T, H·Dh]
  std::vector<float> out_;         // [T, D]
  std::vector<float> gate_;        // [T, F]
  std::vector<float> up_;          // [T, F]
  std::vector<float> ple_;         // [T, L·P] Gemma 4 per-layer inputs
  std::vector<float> ple_gate_;    // [T, P]
  std::vector<float> logit_rows_;  // [T, V] when several rows want logits
};

// The checks every StepRunner makes before a step changes anything: each
// sequence has tokens, ids in [0, V), key_end inside its own step, KV blocks
// reserved for its new length, and the step within `max_step_tokens`.
// Throws Error naming the fault; returns the step's token count.
int64_t check_step(const ModelSpec& spec, std::span<const SeqStep> batch, int64_t max_step_tokens,
                   bool samples_on_device = false);

// A KV pool sized for one sequence of up to `capacity` positions (block ids
// only, without host storage, when `host_storage` is false: a GPU runner's,
// whose rows are `row_dtype`).
KvPool single_sequence_pool(const ModelSpec& spec, int64_t capacity, int64_t max_step_tokens,
                            bool host_storage = true, DType row_dtype = DType::F32);

// Feeds n tokens of one sequence in steps of at most max_step_tokens,
// reserving KV blocks and trimming sliding blocks as it goes; logits as in
// SeqStep. `embeds` / `key_end` as in SeqStep, for all n tokens (key_end in
// absolute positions); steps never split an image run. Throws Error when the
// pool has no room or a run is longer than a step.
void run_sequence(StepRunner& decoder, const int32_t* ids, int64_t n, SequenceKv& kv, float* logits,
                  bool all_logits, const float* const* embeds = nullptr,
                  const int64_t* key_end = nullptr);

}  // namespace tandem
