// The serving engine: continuous batching over one model, every request
// reaching a terminal state.
//
// Threads: submit() and RequestHandle methods are called from HTTP threads;
// one engine thread runs steps; one watchdog thread watches them.
//
// Lifecycle of a request: queued -> prefill -> decode -> one terminal event
// (finished | failed | cancelled | timed_out). Invariants (each has a test):
//  - an exception escaping a step fails every request in that step with a
//    sanitized error, frees their KV blocks and never retries that batch;
//  - a step running longer than step_timeout fails its requests and marks the
//    engine unhealthy (watchdog);
//  - deadlines and cancellation end a request within one step;
//  - KV exhaustion makes new work wait; it never aborts another request.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/constraint.h"
#include "engine/device.h"
#include "engine/sampler.h"
#include "engine/text_streamer.h"
#include "model/model.h"
#include "model/vision_tower.h"

namespace tandem {

struct GenerationParams {
  SamplingParams sampling;
  int32_t max_tokens = 256;  // generated tokens at most
  bool ignore_eos = false;
  std::vector<std::string> stop;  // stop strings (need a streamer)
  int32_t top_logprobs = -1;      // -1: no logprobs; 0..20: chosen token (+ top n)
  double timeout_s = 0;           // 0: the engine's default
  // Special tokens whose text the stream keeps (TextStreamer::start_keeping):
  // the markers the server's reasoning and tool-call parsers read.
  std::vector<int32_t> keep_special;
  // Constrained decoding (structured outputs): each step, tokens the
  // sequence's constraint disallows get -inf before sampling (temperature,
  // penalties and top-k/p apply to the rest); end-of-sequence is allowed
  // only where the constraint may end, and forced (finish "stop") where
  // nothing else may follow; a step where nothing is allowed fails the
  // request. Logprobs are the model's, before the mask. Not applied while
  // EngineConfig::forced_output is set. Null: unconstrained.
  std::shared_ptr<const ConstraintFactory> constraint;
  // OpenAI's logit_bias: (token id, bias) pairs added to the model's logits
  // before the constraint mask, penalties and sampling (greedy included);
  // ±100 in practice bans or forces a token. Logprobs are the model's,
  // before the bias. Ids are checked against the vocabulary at submit. A
  // biased sequence is sampled on the host (the device sampler takes no
  // bias).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

enum class FinishReason { None, Stop, Length, Error, Cancelled, Timeout };
const char* finish_reason_name(
    FinishReason r);  // "stop", "length", "error", "cancelled", "timeout"

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

// One event of a request's stream. Exactly one event has finish != None,
// and it is the last.
struct GenerationEvent {
  std::vector<int32_t> ids;                    // tokens generated since the last event
  std::string text;                            // their text (empty without a streamer)
  std::vector<TokenLogprob> logprobs;          // per id: the chosen token
  std::vector<std::vector<TokenLogprob>> top;  // per id: the top alternatives
  FinishReason finish = FinishReason::None;
  std::string error;              // finish == Error/Timeout: what to tell the client
  int32_t prompt_tokens = 0;      // filled on the final event
  int32_t completion_tokens = 0;  // filled on the final event
  int32_t cached_tokens = 0;      // final event: prompt tokens taken from the prefix cache
};

// Encoding: a vision-lane request whose images are waiting for (or in) the
// vision encoder.
enum class RequestPhase { Queued, Encoding, Prefill, Decode, Done };
const char* request_phase_name(RequestPhase p);

// The client side of one request. Thread-safe.
class RequestHandle {
 public:
  explicit RequestHandle(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // Blocks until an event is available or `timeout_s` passes (nullopt).
  std::optional<GenerationEvent> next(double timeout_s);
  // Asks the engine to stop this request; it ends within one step with
  // FinishReason::Cancelled.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool finished() const { return finished_.load(); }

  // Engine side: push() adds a non-final event unless the request already
  // finished; finish() adds the final event, once (later calls are ignored
  // and return false). `before_visible` runs only for the call that wins,
  // before the event can be seen, so counters are current when a client
  // sees the end.
  void push(GenerationEvent e);
  bool finish(GenerationEvent e, const std::function<void()>& before_visible = {});

 private:
  std::string id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

// Rejected at submit time, before any work: the HTTP layer maps `status`
// (400 for a prompt that can never fit, 503 when the server is full) to its
// response.
struct AdmissionError : std::runtime_error {
  AdmissionError(int status, std::string param, const std::string& msg)
      : std::runtime_error(msg), status(status), param(std::move(param)) {}
  int status;
  std::string param;
};

struct EngineConfig {
  DeviceChoice device;      // where the model runs (resolve_device); default: the CPU
  int threads = 0;          // CPU threads for kernels (0 = all cores)
  int max_concurrent = 32;  // running + waiting requests; more -> 503
  int64_t max_context = 0;  // positions per sequence (0 = model max, capped at 32768)
  size_t kv_memory = 0;     // KV cache bytes (0 = enough for max_concurrent x 4096 tokens, capped)
  // CUDA only, when kv_memory is 0: the KV cache takes what is left of this
  // fraction of the device's memory (kv_bytes_from_fraction), up to what
  // max_concurrent full contexts need. 0: the default, 0.9.
  double gpu_memory_fraction = 0;
  // The KV rows' type, as --kv-cache-dtype (resolve_kv_dtype): "auto" is
  // bf16 on CUDA, f32 on the CPU.
  std::string kv_cache_dtype = "auto";
  // --gemm-precision (resolve_gemm_precision): bf16 or f32 activations into
  // the GPU's tensor-core GEMMs.
  std::string gemm_precision = "bf16";
  int64_t step_token_budget = 256;  // tokens per step (decode tokens + prefill chunks)
  double default_timeout_s = 600;   // per-request deadline unless the request sets one
  double step_timeout_s = 60;       // watchdog: a step longer than this fails its requests
  // Vision lane: soft tokens of images encoded per engine step (at least one
  // image per step whatever its size), so image requests interleave with the
  // decode steps of running requests instead of stalling them.
  int64_t vision_budget = 1024;
  // Test hook (tests, and `tandem serve` under TANDEM_FORCE_OUTPUT): every
  // request generates these ids first instead of sampling (logprobs are
  // still the model's), then ends as at end-of-sequence. Empty: off.
  std::vector<int32_t> forced_output;
  // The prefix cache (`--no-prefix-cache` turns it off): full KV blocks stay
  // published after their sequence ends, until their memory is needed, and a
  // new sequence whose prompt starts with the same tokens (and images)
  // reuses them instead of computing them again, skipping the encoder for
  // images they cover (KvPool's contract). Outputs can
  // differ from a cold run in the last bits: the reused rows were computed
  // in other chunks or steps.
  bool prefix_cache = true;
};

struct EngineStatus {
  std::string device = "cpu";  // DeviceChoice::name()
  // CUDA only (has_gpu_memory): the device's memory when status() was read.
  bool has_gpu_memory = false;
  size_t gpu_memory_total_bytes = 0;
  size_t gpu_memory_free_bytes = 0;
  bool healthy = true;
  bool watchdog_fired = false;
  std::string last_error;
  double uptime_s = 0;
  uint64_t steps_executed = 0;
  int num_running = 0;
  int num_waiting = 0;
  uint64_t total_requests_processed = 0;
  uint64_t total_requests_failed = 0;
  uint64_t total_requests_cancelled = 0;
  uint64_t total_prompt_tokens = 0;
  uint64_t total_completion_tokens = 0;
  double generation_tps = 0;  // over the last few seconds
  double prompt_tps = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_cached = 0;             // free blocks whose rows the prefix cache keeps
  uint64_t total_cached_prompt_tokens = 0;  // prompt positions taken from the prefix cache
  std::string kv_cache_dtype = "f32";       // the KV rows' type: "f32" or "bf16"
  // Activations into the GPU's tensor-core GEMMs: "bf16" or "f32" (the CPU
  // computes in f32).
  std::string gemm_precision = "f32";
  // The lanes: requests accepted on each, and the vision encoder's work.
  uint64_t text_lane_requests = 0;
  uint64_t vision_lane_requests = 0;
  uint64_t vision_encoder_calls = 0;  // encoder batches (one per step that encodes images)
  uint64_t images_processed = 0;      // images encoded successfully
  double vision_encode_seconds = 0;   // wall time of the encoder batches
  int images_waiting = 0;             // images not yet encoded
  struct Request {
    std::string id;
    const char* lane;  // "text" or "vision"
    RequestPhase phase;
    int32_t prompt_tokens;
    int32_t completion_tokens;
    double elapsed_s;
  };
  std::vector<Request> requests;
};

class Engine {
 public:
  // Starts the engine and watchdog threads. `streamer` (optional) turns ids
  // into text; without it events carry ids only and stop strings are refused.
  // `vision` (optional) is the model's vision tower: without it requests with
  // images are refused.
  Engine(const Model& model, const EngineConfig& config, const TextStreamer* streamer = nullptr,
         const VisionTower* vision = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws AdmissionError (before any work) for an empty or
  // too-long prompt (400), ids outside the vocabulary (400), stop strings
  // without a streamer (400), a full server or one shutting down or stalled
  // (503).
  //
  // Lanes: a request without images goes to the text lane and runs the
  // backbone alone. With `images` (prepared by the engine's tower, in prompt
  // order, their placeholders already expanded in `prompt`) it goes to the
  // vision lane: its images are encoded (vision_budget per step, batched
  // with other requests' images), then it prefills and decodes with the
  // rest. Images without a tower, or placeholder counts that differ from the
  // images' soft tokens, are refused (400).
  std::shared_ptr<RequestHandle> submit(std::vector<int32_t> prompt, const GenerationParams& params,
                                        std::vector<PreparedImage> images = {});
  // submit()'s 400 checks alone (AdmissionError), for a caller that must
  // know every request of a group is admissible before submitting any.
  void check(const std::vector<int32_t>& prompt, const GenerationParams& params,
             const std::vector<PreparedImage>& images = {}) const;

  // Stops accepting, lets running requests finish for up to `grace_s`, fails
  // the rest, and stops the threads. Idempotent.
  void shutdown(double grace_s);

  EngineStatus status() const;
  const ModelSpec& spec() const;
  int64_t max_context() const;
  bool has_streamer() const;
  const VisionTower* vision() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
