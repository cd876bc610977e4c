// The engine loop: admission, scheduling under a token budget, one batched
// decoder step, sampling, and terminal states — plus the watchdog.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>

#include "backend/cpu/kernels.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/fault.h"
#include "engine/stop_matcher.h"
#include "model/decoder.h"
#include "model/image_prompt.h"
#include "model/kv_pool.h"
#include "model/step_runner.h"

namespace tandem {

namespace {

double now_s() {
  return monotonic_seconds();
}

constexpr size_t kDefaultKvBytes = size_t(2) << 30;
constexpr double kDefaultGpuMemoryFraction = 0.9;
constexpr int64_t kDefaultContextCap = 32768;

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Error: return "error";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
  }
  return "";
}

const char* request_phase_name(RequestPhase p) {
  switch (p) {
    case RequestPhase::Queued: return "queued";
    case RequestPhase::Encoding: return "encoding";
    case RequestPhase::Prefill: return "prefill";
    case RequestPhase::Decode: return "decode";
    case RequestPhase::Done: return "done";
  }
  return "";
}

std::optional<GenerationEvent> RequestHandle::next(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                    [&] { return !events_.empty(); }))
    return std::nullopt;
  GenerationEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void RequestHandle::push(GenerationEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_.load()) return;
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

bool RequestHandle::finish(GenerationEvent e, const std::function<void()>& before_visible) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_.exchange(true)) return false;
    if (before_visible) before_visible();
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
  return true;
}

// One request inside the engine; owned by the engine thread.
struct Sequence {
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> tokens;  // prompt followed by the generated ids
  int32_t prompt_len = 0;
  GenerationParams params;
  Sampler sampler;
  SequenceKv kv;
  // Prompt positions taken from the prefix cache when it was first
  // scheduled (-1: not yet scheduled).
  int64_t cached_tokens = -1;
  double start = 0, deadline = 0;
  uint64_t index = 0;  // 1-based arrival number (fault injection)
  std::unique_ptr<TextStream> text;
  std::unique_ptr<StopMatcher> stop;
  std::unique_ptr<TokenConstraint> constraint;  // params.constraint's, for this sequence
  std::vector<float> logits;                    // [V], valid after a step that fed its last token
  // Sampling on the device instead (StepRunner::samples_on_device): the
  // request and, after the step, the sampled id (-1: NaN logits).
  bool device_sampled = false;
  StepSampling device_sampling;
  std::vector<TokenPenalty> penalties;
  int32_t device_token = -1;

  // Vision lane only: the images, how many are encoded, their soft tokens
  // (in order) and, once all are encoded, where they go in the prompt.
  std::vector<PreparedImage> images;
  size_t images_encoded = 0;  // images whose soft tokens are ready (or not needed)
  std::vector<float> features;
  ImagePlacement placement;
  // The prefix cache over a prompt with images: each block's image salt and
  // each image's placeholder end (image_prompt.h), and the leading images the
  // cache covered when the sequence was first seen (not encoded, their
  // pixels kept in case the cache loses them).
  std::vector<uint64_t> block_salts;
  std::vector<int64_t> image_ends;
  size_t images_cached = 0;
  bool cache_checked = false;

  Sequence(const GenerationParams& p) : params(p), sampler(p.sampling) {}
  bool vision_lane() const { return !images.empty(); }
  bool encoding() const { return images_encoded < images.size(); }
  int32_t generated() const { return int32_t(tokens.size()) - prompt_len; }
  int64_t pending() const { return int64_t(tokens.size()) - kv.length; }
  RequestPhase phase() const {
    if (encoding()) return images_encoded > 0 ? RequestPhase::Encoding : RequestPhase::Queued;
    if (kv.length == 0 && generated() == 0) return RequestPhase::Queued;
    return kv.length < prompt_len ? RequestPhase::Prefill : RequestPhase::Decode;
  }
};

struct Engine::Impl {
  const Model& model;
  EngineConfig config;
  const TextStreamer* streamer;
  const VisionTower* vision;
  FaultPlan faults;
  ThreadPool pool;
  std::unique_ptr<KvPool> kv_pool;
  std::unique_ptr<StepRunner> decoder;
  int64_t max_context = 0;
  double started = now_s();

  // Shared with submitters and the watchdog.
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> incoming;
  int active_count = 0;  // requests not yet finished (incoming + active), for admission
  bool accepting = true;
  bool stopping = false;
  double stop_deadline = 0;
  uint64_t arrivals = 0;
  uint64_t next_id = 0;
  EngineStatus snapshot;  // refreshed by the engine thread each step

  // Watchdog view of the step in flight.
  std::mutex step_mu;
  bool in_step = false;
  bool step_abandoned = false;
  double step_start = 0;
  std::vector<std::shared_ptr<RequestHandle>> step_handles;

  // Engine thread only.
  std::vector<std::unique_ptr<Sequence>> active;
  uint64_t steps = 0;
  std::deque<std::pair<double, int64_t>> gen_window, prompt_window;
  uint64_t images_started = 0;  // images given to the encoder (fault injection)

  std::thread engine_thread, watchdog_thread;
  std::atomic<bool> threads_stop{false};

  Impl(const Model& m, const EngineConfig& c, const TextStreamer* s, const VisionTower* v)
      : model(m),
        config(c),
        streamer(s),
        vision(v),
        faults(FaultPlan::from_env()),
        pool(c.threads) {
    const ModelSpec& spec = m.spec;
    for (int32_t id : config.forced_output)
      if (id < 0 || id >= spec.vocab)
        fail("forced output: token id %d is outside the vocabulary [0, %lld)", id,
             (long long)spec.vocab);
    config.max_concurrent = std::max(1, config.max_concurrent);
    config.step_token_budget = std::max<int64_t>(config.step_token_budget, config.max_concurrent);
    int64_t ctx = config.max_context > 0 ? config.max_context
                                         : std::min(spec.max_position, kDefaultContextCap);
    const bool has_sliding = spec.has_kind(AttentionKind::Sliding);
    const bool has_full = spec.has_kind(AttentionKind::Full);
    const int64_t sliding_blocks =
        has_sliding ? config.max_concurrent *
                          KvPool::sliding_blocks_per_sequence(spec, config.step_token_budget)
                    : 0;
    const DType kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, config.device);
    const size_t sliding_bytes =
        size_t(sliding_blocks) * KvPool::block_bytes(spec, AttentionKind::Sliding, kv_dtype);
    size_t budget = config.kv_memory;
    const int64_t ctx_blocks = (ctx + KvPool::kBlockSize - 1) / KvPool::kBlockSize;
    const size_t full_block = KvPool::block_bytes(spec, AttentionKind::Full, kv_dtype);
    // What every running request at full context needs: more is never used.
    const size_t wanted = sliding_bytes + size_t(config.max_concurrent * ctx_blocks) * full_block;
    // On a GPU the cache takes what the memory fraction leaves (default
    // kDefaultGpuMemoryFraction), up to `wanted`; on the CPU, `wanted` up to
    // kDefaultKvBytes. --kv-memory overrides both.
    const bool from_fraction = budget == 0 && config.device.cuda;
    if (from_fraction) {
      const double fraction =
          config.gpu_memory_fraction > 0 ? config.gpu_memory_fraction : kDefaultGpuMemoryFraction;
      budget = std::min(wanted, kv_bytes_from_fraction(config.device, m, fraction));
    }
    if (budget == 0) budget = std::min(kDefaultKvBytes, wanted);
    int64_t full_blocks = 0;
    if (has_full) {
      // What the budget came from, for the messages below.
      const char* what =
          from_fraction ? "the KV cache left by --gpu-memory-fraction" : "--kv-memory";
      if (budget <= sliding_bytes)
        fail(
            "%s %.1f MB is too small: the sliding-window layers alone need %.1f MB for %d "
            "sequences",
            what, budget / 1e6, sliding_bytes / 1e6, config.max_concurrent);
      full_blocks = int64_t((budget - sliding_bytes) / full_block);
      if (full_blocks < 1)
        fail("%s %.1f MB holds no KV block (one is %.1f MB)", what, budget / 1e6, full_block / 1e6);
      ctx = std::min(ctx, full_blocks * KvPool::kBlockSize);  // one sequence must always fit
    }
    max_context = ctx;
    kv_pool = std::make_unique<KvPool>(spec, full_blocks, sliding_blocks,
                                       kv_host_storage(config.device), kv_dtype);
    // A bidirectional image run must sit in one step, so a step may exceed
    // the budget by one image.
    const int64_t image_run =
        vision && vision->bidirectional() ? vision->max_tokens_per_image() : 0;
    const bool bf16_gemm = resolve_gemm_precision(config.gemm_precision);
    decoder = make_step_runner(config.device, m, pool, *kv_pool,
                               config.step_token_budget + image_run, bf16_gemm);
    decoder->prepare(config.max_concurrent);
    snapshot.gemm_precision = bf16_gemm ? "bf16" : "f32";
    snapshot.device = config.device.name();
    config.vision_budget = std::max<int64_t>(1, config.vision_budget);
    snapshot.kv_cache_dtype = kv_dtype == DType::BF16 ? "bf16" : "f32";
    snapshot.kv_blocks_total =
        kv_pool->total(AttentionKind::Full) + kv_pool->total(AttentionKind::Sliding);
    engine_thread = std::thread([this] { loop(); });
    watchdog_thread = std::thread([this] { watchdog(); });
  }

  // ---- requests reaching terminal states ----

  void finish(Sequence& seq, FinishReason reason, const std::string& error = {}) {
    GenerationEvent e;
    if (reason == FinishReason::Stop || reason == FinishReason::Length) {
      // Text still held back by the detokenizer or the stop matcher.
      std::string tail = seq.text ? seq.text->flush() : std::string();
      if (seq.stop) tail = seq.stop->push(tail) + seq.stop->flush();
      e.text = std::move(tail);
    }
    e.finish = reason;
    e.error = error;
    e.prompt_tokens = seq.prompt_len;
    e.completion_tokens = seq.generated();
    e.cached_tokens = int32_t(std::max<int64_t>(0, seq.cached_tokens));
    kv_release(*kv_pool, seq.kv);
    const int64_t used = blocks_used();
    // Lock order everywhere: handle, then `mu`.
    seq.handle->finish(std::move(e), [&] {
      std::lock_guard<std::mutex> lock(mu);
      count_finish(reason, error);
      snapshot.kv_blocks_used = used;
    });
  }

  // Called with `mu` held.
  void count_finish(FinishReason reason, const std::string& error) {
    // A client that sees its request end may resubmit at once: its slot is
    // free from this moment, not from the next loop iteration.
    active_count = std::max(0, active_count - 1);
    snapshot.total_requests_processed++;
    if (reason == FinishReason::Error || reason == FinishReason::Timeout)
      snapshot.total_requests_failed++;
    if (reason == FinishReason::Cancelled) snapshot.total_requests_cancelled++;
    if (reason == FinishReason::Error) snapshot.last_error = error;
  }

  int64_t blocks_used() const {
    return kv_pool->total(AttentionKind::Full) - kv_pool->free_count(AttentionKind::Full) +
           kv_pool->total(AttentionKind::Sliding) - kv_pool->free_count(AttentionKind::Sliding);
  }

  // Removes finished sequences from `active`.
  void reap() {
    std::erase_if(active, [](const std::unique_ptr<Sequence>& s) { return s->handle->finished(); });
  }

  // ---- the loop ----

  void loop() {
    while (!threads_stop.load()) {
      take_incoming();
      const double now = now_s();
      for (auto& seq : active) {
        if (seq->handle->cancelled())
          finish(*seq, FinishReason::Cancelled);
        else if (now > seq->deadline)
          finish(*seq, FinishReason::Timeout, "the request exceeded its timeout");
      }
      bool grace_over;
      {
        std::lock_guard<std::mutex> lock(mu);
        grace_over = stopping && now > stop_deadline;
      }
      if (grace_over)
        for (auto& seq : active) finish(*seq, FinishReason::Error, "the server is shutting down");
      reap();
      publish();
      if (active.empty()) {
        std::unique_lock<std::mutex> lock(mu);
        if (stopping && incoming.empty()) break;
        wake.wait_for(lock, std::chrono::milliseconds(50),
                      [&] { return !incoming.empty() || threads_stop.load(); });
        continue;
      }
      const bool encoded = run_vision_lane();
      if (encoded) {
        reap();
        publish();
      }
      auto batch = schedule();
      if (batch.empty()) {
        if (encoded) continue;  // more images to encode, or their requests' prefill next
        if (!preempt_newest()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      run_step(batch);
      reap();
    }
    // Whatever is left when the loop stops still gets its terminal event.
    take_incoming();
    for (auto& seq : active) finish(*seq, FinishReason::Error, "the server is shutting down");
    active.clear();
    publish();
  }

  void take_incoming() {
    std::lock_guard<std::mutex> lock(mu);
    while (!incoming.empty()) {
      active.push_back(std::move(incoming.front()));
      incoming.pop_front();
    }
  }

  // Decode tokens first (one per sequence), then prefill chunks, oldest
  // first, within the token budget and the KV blocks available. Returns each
  // chosen sequence with the number of tokens it feeds (blocks reserved).
  std::vector<std::pair<Sequence*, int64_t>> schedule() {
    std::vector<std::pair<Sequence*, int64_t>> batch;
    int64_t budget = config.step_token_budget;
    for (int pass = 0; pass < 2; ++pass)
      for (auto& seq : active) {
        const int64_t pending = seq->pending();
        if (seq->handle->finished() || seq->encoding() || pending <= 0 ||
            (pass == 0) != (pending == 1))
          continue;
        if (faults.cache_drop && seq->index == faults.cache_drop && seq->kv.length == 0) {
          faults.cache_drop = 0;
          kv_pool->drop_cached();
        }
        // Oldest first, so an older sequence can evict cached blocks before
        // a newer one takes them.
        const bool took_prefix = take_cached_prefix(*seq);
        if (seq->images_cached > 0 && seq->kv.length < seq->image_ends[seq->images_cached - 1]) {
          // The cache lost blocks of images the sequence skipped: encode them.
          kv_release(*kv_pool, seq->kv);
          seq->images_cached = seq->images_encoded = 0;
          continue;
        }
        if (follows_an_older_prompt(*seq)) {
          if (took_prefix) kv_release(*kv_pool, seq->kv);  // waiting: holds nothing
          continue;
        }
        // May exceed the budget by at most one image run (the decoder is
        // sized for it).
        const int64_t n = chunk_size(*seq, std::min(seq->pending(), budget));
        if (n <= 0) {  // no budget left this step: waiting, it holds nothing
          if (took_prefix) kv_release(*kv_pool, seq->kv);
          continue;
        }
        if (faults.kv_exhaust && seq->index == faults.kv_exhaust && seq->kv.length == 0) {
          faults.kv_exhaust = 0;  // fails once: the request must wait, then proceed
          continue;
        }
        if (!kv_reserve(*kv_pool, model.spec, seq->kv, seq->kv.length + n)) {
          // A waiting sequence holds no blocks (it takes its prefix again).
          if (took_prefix) kv_release(*kv_pool, seq->kv);
          continue;
        }
        budget -= n;
        batch.emplace_back(seq.get(), n);
        if (seq->cached_tokens < 0) {  // its first chunk: what the cache saved
          seq->cached_tokens = std::min<int64_t>(seq->kv.length, seq->prompt_len);
          std::lock_guard<std::mutex> lock(mu);
          snapshot.total_cached_prompt_tokens += uint64_t(seq->cached_tokens);
        }
      }
    return batch;
  }

  // A sequence's tokens for the prefix cache: with images, their salts.
  PrefixTokens prefix_tokens(const Sequence& seq) const {
    PrefixTokens q{seq.tokens};
    if (seq.vision_lane()) q.salts = &seq.block_salts;
    return q;
  }

  // Before a sequence's first chunk (and again after a preemption): its
  // prompt's longest cached prefix, when the prefix cache is on. Returns
  // whether it took blocks.
  bool take_cached_prefix(Sequence& seq) {
    if (!config.prefix_cache || seq.kv.length != 0) return false;
    return kv_take_prefix(*kv_pool, model.spec, seq.kv, prefix_tokens(seq)) > 0;
  }

  // Whether a sequence about to start its prompt should wait a step for an
  // older one now computing the same tokens (the n choices of one request,
  // agents sharing a system prompt that arrive together): the older one's
  // next block is not yet published, and this one would take it once it is
  // instead of computing it too. Text prompts only.
  bool follows_an_older_prompt(const Sequence& seq) const {
    constexpr int64_t B = KvPool::kBlockSize;
    const int64_t next_block_end = seq.kv.length + B;
    if (!config.prefix_cache || seq.cached_tokens >= 0 || seq.vision_lane() ||
        int64_t(seq.tokens.size()) <= next_block_end)
      return false;
    for (const auto& older : active) {
      if (older.get() == &seq) return false;  // only sequences before it
      const Sequence& o = *older;
      if (o.handle->finished() || o.vision_lane() || o.cached_tokens < 0 ||
          o.kv.length >= next_block_end || int64_t(o.tokens.size()) <= next_block_end)
        continue;
      if (std::equal(seq.tokens.begin(), seq.tokens.begin() + next_block_end, o.tokens.begin()))
        return true;
    }
    return false;
  }

  // Vision lane, once per sequence before its first image is encoded: the
  // leading images whose soft tokens lie inside the prompt's cached prefix
  // need no encoding (the KV rows they produced are cached). Only looks:
  // schedule() takes the blocks, oldest sequence first.
  void skip_cached_images(Sequence& seq) {
    seq.cache_checked = true;
    if (!config.prefix_cache || seq.images_encoded != 0 || seq.kv.length != 0) return;
    const int64_t cached = kv_cached_prefix(*kv_pool, model.spec, prefix_tokens(seq));
    size_t k = 0;
    while (k < seq.images.size() && seq.image_ends[k] <= cached) ++k;
    if (k == 0) return;
    seq.images_cached = seq.images_encoded = k;
    if (!seq.encoding()) place_images_of(seq);
  }

  // Where the images' soft tokens go, once every needed image is encoded.
  // Returns false when the request failed instead.
  bool place_images_of(Sequence& seq) {
    try {
      const int64_t D = vision->text_hidden();
      std::vector<int64_t> tokens;
      int64_t total = 0;
      for (const PreparedImage& img : seq.images) {
        tokens.push_back(img.tokens);
        total += img.tokens;
      }
      if (seq.features.empty()) seq.features.resize(size_t(total * D));
      seq.placement = place_images(*vision, seq.tokens, tokens, seq.features.data());
      seq.placement.embeds.resize(size_t(seq.prompt_len));
      seq.placement.key_end.resize(size_t(seq.prompt_len));
      // Encoded: the pixels are done with (unless the cache may lose the
      // blocks of images it let the sequence skip).
      if (seq.images_cached == 0)
        for (auto& img : seq.images) img.pixels = {};
      return true;
    } catch (const std::exception& e) {
      finish(seq, FinishReason::Error, std::string("cannot place the images: ") + e.what());
      return false;
    }
  }

  // A prefill chunk of `n` tokens, shortened (or, at a run's start,
  // lengthened) so that it does not cut a bidirectional image run: every
  // token of such a run must see the whole run in its step.
  int64_t chunk_size(const Sequence& seq, int64_t n) const {
    if (n <= 0 || !seq.vision_lane() || !vision->bidirectional()) return n;
    return chunk_outside_runs(seq.placement.runs, seq.kv.length, n);
  }

  // Nothing could be scheduled: free the KV of the newest sequence holding
  // some, so older ones can grow; it recomputes its context later.
  bool preempt_newest() {
    for (auto it = active.rbegin(); it != active.rend(); ++it)
      if ((*it)->kv.length > 0 || !(*it)->kv.full.empty() || !(*it)->kv.sliding.empty()) {
        kv_release(*kv_pool, (*it)->kv);
        return true;
      }
    return false;
  }

  void run_step(const std::vector<std::pair<Sequence*, int64_t>>& plan) {
    const ModelSpec& spec = model.spec;
    std::vector<Sequence*> batch;
    std::vector<SeqStep> steps_in;
    int64_t prompt_tokens = 0;
    for (auto [seq, n] : plan) {
      const bool last = seq->kv.length + n == int64_t(seq->tokens.size());
      seq->device_sampled = last && samples_on_device(*seq);
      if (!seq->device_sampled) seq->logits.resize(size_t(spec.vocab));
      SeqStep step{seq->tokens.data() + seq->kv.length, n, &seq->kv,
                   last && !seq->device_sampled ? seq->logits.data() : nullptr, false};
      if (seq->device_sampled) step.sampling = &prepare_device_sampling(*seq);
      if (seq->vision_lane() && seq->kv.length < seq->prompt_len) {
        // Tokens past the prompt (recomputed after preemption) are text.
        ImagePlacement& p = seq->placement;
        while (int64_t(p.embeds.size()) < int64_t(seq->tokens.size())) {
          p.key_end.push_back(int64_t(p.embeds.size()) + 1);
          p.embeds.push_back(nullptr);
        }
        step.embeds = p.embeds.data() + seq->kv.length;
        step.key_end = p.key_end.data() + seq->kv.length;
      }
      steps_in.push_back(step);
      if (seq->kv.length < seq->prompt_len)
        prompt_tokens += std::min<int64_t>(n, seq->prompt_len - seq->kv.length);
      batch.push_back(seq);
    }
    begin_watch(batch);
    const uint64_t step_no = ++steps;
    std::string error;
    try {
      if (faults.step_throw == step_no) throw std::runtime_error("injected fault: step-throw");
      if (faults.step_stall == step_no) stall();
      decoder->step(steps_in);
      if (faults.nan_logits == step_no)
        for (Sequence* seq : batch) std::fill(seq->logits.begin(), seq->logits.end(), NAN);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (end_watch()) {  // the watchdog already failed these requests
      for (Sequence* seq : batch)
        finish(*seq, FinishReason::Error, "the engine stalled (watchdog)");
      return;
    }
    if (!error.empty()) {
      // Never retried: the batch is poisoned. The client sees a sanitized
      // message; the log keeps the detail.
      std::fprintf(stderr, "error: step %llu failed: %s; failing its %zu requests\n",
                   (unsigned long long)step_no, error.c_str(), batch.size());
      for (Sequence* seq : batch)
        finish(*seq, FinishReason::Error, "internal error while running the model");
      return;
    }
    // Counters move before any event of this step is visible, so a client
    // that has seen its request end reads totals that include it.
    {
      std::lock_guard<std::mutex> lock(mu);
      snapshot.total_prompt_tokens += uint64_t(prompt_tokens);
    }
    int64_t generated = 0;
    for (Sequence* seq : batch) {
      // Before the trim, so sliding blocks are published while held.
      if (config.prefix_cache) kv_publish(*kv_pool, spec, seq->kv, prefix_tokens(*seq));
      kv_trim_sliding(*kv_pool, spec, seq->kv);
      if (seq->pending() == 0) generated += sample_next(*seq);
    }
    const double now = now_s();
    gen_window.emplace_back(now, generated);
    prompt_window.emplace_back(now, prompt_tokens);
  }

  // The watchdog's view of the work in flight (a decoder step or an encoder
  // batch): begin_watch() before, end_watch() after, which returns true when
  // the watchdog abandoned it meanwhile.
  void begin_watch(const std::vector<Sequence*>& batch) {
    std::lock_guard<std::mutex> lock(step_mu);
    in_step = true;
    step_abandoned = false;
    step_start = now_s();
    step_handles.clear();
    for (Sequence* seq : batch) step_handles.push_back(seq->handle);
  }
  bool end_watch() {
    std::lock_guard<std::mutex> lock(step_mu);
    in_step = false;
    step_handles.clear();
    return step_abandoned;
  }

  // ---- the vision lane ----

  // Encodes waiting images, oldest request first, up to vision_budget soft
  // tokens (at least one image). An encoder exception fails that image's
  // request only. Returns whether any image was taken.
  bool run_vision_lane() {
    std::vector<std::pair<Sequence*, size_t>> work;  // (request, image index)
    std::vector<Sequence*> owners;
    int64_t budget = config.vision_budget;
    for (auto& seq : active)
      if (seq->vision_lane() && !seq->cache_checked && !seq->handle->finished())
        skip_cached_images(*seq);
    for (auto& seq : active) {
      if (seq->handle->finished() || !seq->encoding()) continue;
      bool took = false;
      for (size_t k = seq->images_encoded; k < seq->images.size(); ++k) {
        const int64_t t = seq->images[k].tokens;
        if (!work.empty() && t > budget) break;
        work.emplace_back(seq.get(), k);
        budget -= t;
        took = true;
      }
      if (took) owners.push_back(seq.get());
      if (budget <= 0) break;
    }
    if (work.empty()) return false;
    const int64_t D = vision->text_hidden();
    std::vector<Sequence*> failed;
    std::string detail;
    uint64_t encoded = 0;
    const auto encode_start = std::chrono::steady_clock::now();
    begin_watch(owners);
    for (auto [seq, k] : work) {
      if (std::find(failed.begin(), failed.end(), seq) != failed.end()) continue;
      try {
        if (faults.vision_throw && ++images_started == faults.vision_throw)
          throw std::runtime_error("injected fault: vision-throw");
        if (seq->features.empty()) {
          int64_t total = 0;
          for (const PreparedImage& img : seq->images) total += img.tokens;
          seq->features.resize(size_t(total * D));
        }
        int64_t offset = 0;
        for (size_t j = 0; j < k; ++j) offset += seq->images[j].tokens;
        vision->encode(pool, seq->images[k], seq->features.data() + offset * D);
        seq->images_encoded = k + 1;
        ++encoded;
      } catch (const std::exception& e) {
        failed.push_back(seq);
        std::fprintf(stderr, "error: the vision encoder failed on image %zu of %s: %s\n", k + 1,
                     seq->handle->id().c_str(), e.what());
      }
    }
    const bool abandoned = end_watch();
    {
      std::lock_guard<std::mutex> lock(mu);
      snapshot.vision_encoder_calls++;
      snapshot.images_processed += encoded;
      snapshot.vision_encode_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_start).count();
    }
    for (Sequence* seq : owners) {
      if (abandoned) {
        finish(*seq, FinishReason::Error, "the engine stalled (watchdog)");
      } else if (std::find(failed.begin(), failed.end(), seq) != failed.end()) {
        finish(*seq, FinishReason::Error, "internal error in the vision encoder");
      } else if (!seq->encoding()) {
        place_images_of(*seq);
      }
    }
    return true;
  }

  void stall() {
    // Blocks until the watchdog fires (or shutdown), as a hung kernel would.
    while (!threads_stop.load()) {
      {
        std::lock_guard<std::mutex> lock(step_mu);
        if (step_abandoned) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Whether the runner samples this sequence's next token itself: it can,
  // and nothing needs the host's logits (an output constraint, logprobs,
  // a logit bias, the forced-output test hook, an injected NaN fault).
  bool samples_on_device(const Sequence& seq) const {
    return decoder->samples_on_device() && !seq.constraint && seq.params.top_logprobs < 0 &&
           seq.params.logit_bias.empty() && config.forced_output.empty() && faults.nan_logits == 0;
  }

  // The device sampling request of a sequence about to get its next token:
  // its parameters, one draw from its generator (none when greedy, as the
  // CPU Sampler) and, when penalized, its distinct tokens.
  const StepSampling& prepare_device_sampling(Sequence& seq) {
    StepSampling& d = seq.device_sampling;
    const SamplingParams& p = seq.params.sampling;
    d.params = p;
    d.uniform = p.temperature > 0.0f ? seq.sampler.uniform() : 0.0;
    seq.penalties.clear();
    if (p.penalized()) {
      std::unordered_map<int32_t, size_t> at;
      for (size_t i = 0; i < seq.tokens.size(); ++i) {
        const int32_t id = seq.tokens[i];
        auto [it, fresh] = at.try_emplace(id, seq.penalties.size());
        if (fresh) seq.penalties.push_back(TokenPenalty{id, 0, 1});
        if (int64_t(i) >= seq.prompt_len) seq.penalties[it->second].count++;
      }
    }
    d.penalties = seq.penalties;
    seq.device_token = -1;
    d.token = &seq.device_token;
    return d;
  }

  // Samples the next token of a sequence whose logits are fresh (or whose
  // token the runner sampled); returns 1 if a token was added.
  int64_t sample_next(Sequence& seq) {
    const ModelSpec& spec = model.spec;
    GenerationEvent e;
    if (seq.device_sampled) {
      seq.device_sampled = false;
      if (seq.device_token < 0) {
        finish(seq, FinishReason::Error, "the model produced NaN logits");
        return 0;
      }
      return emit_token(seq, seq.device_token, nullptr, {}, std::move(e));
    }
    float* logits = seq.logits.data();
    for (int64_t i = 0; i < spec.vocab; ++i)
      if (std::isnan(logits[i])) {
        finish(seq, FinishReason::Error, "the model produced NaN logits");
        return 0;
      }
    std::vector<float> logprobs;
    if (seq.params.top_logprobs >= 0) log_softmax(logits, spec.vocab, logprobs);
    for (auto [id, bias] : seq.params.logit_bias) logits[id] += bias;
    std::span<const int32_t> prompt(seq.tokens.data(), size_t(seq.prompt_len));
    std::span<const int32_t> output(seq.tokens.data() + seq.prompt_len, size_t(seq.generated()));
    const std::vector<int32_t>& forced = config.forced_output;
    const size_t n_out = size_t(seq.generated());
    if (!forced.empty() && n_out == forced.size()) {  // test hook: the forced output is over
      finish(seq, FinishReason::Stop);
      return 0;
    }
    TokenConstraint* constraint = forced.empty() ? seq.constraint.get() : nullptr;
    if (constraint && !apply_constraint(seq, *constraint, logits)) return 0;
    int32_t id = n_out < forced.size() ? forced[n_out]
                                       : seq.sampler.sample(logits, spec.vocab, prompt, output);
    const bool eos = std::find(spec.eos_ids.begin(), spec.eos_ids.end(), id) != spec.eos_ids.end();
    if (constraint && !eos && !constraint->accept(id)) {
      // Only a sampler that picked a -inf token (rounding) gets here: take
      // the best allowed token instead.
      id = argmax(logits, spec.vocab);
      if (!constraint->accept(id)) {
        finish(seq, FinishReason::Error, "internal error: the output constraint rejected a token");
        return 0;
      }
    }
    return emit_token(seq, id, constraint, logprobs, std::move(e));
  }

  // Adds the chosen token (or ends the sequence at EOS) and streams it.
  int64_t emit_token(Sequence& seq, int32_t id, const TokenConstraint* constraint,
                     const std::vector<float>& logprobs, GenerationEvent e) {
    const ModelSpec& spec = model.spec;
    const bool eos = std::find(spec.eos_ids.begin(), spec.eos_ids.end(), id) != spec.eos_ids.end();
    if (eos && (constraint || !seq.params.ignore_eos)) {
      finish(seq, FinishReason::Stop);
      return 0;
    }
    seq.tokens.push_back(id);
    e.ids.push_back(id);
    if (!logprobs.empty()) {
      e.logprobs.push_back({id, logprobs[size_t(id)]});
      std::vector<TokenLogprob> top;
      const int32_t k = std::min<int32_t>(seq.params.top_logprobs, int32_t(spec.vocab));
      std::vector<int32_t> order(size_t(spec.vocab));
      for (int32_t i = 0; i < int32_t(spec.vocab); ++i) order[size_t(i)] = i;
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return logprobs[size_t(a)] > logprobs[size_t(b)];
      });
      for (int32_t i = 0; i < k; ++i)
        top.push_back({order[size_t(i)], logprobs[size_t(order[size_t(i)])]});
      e.top.push_back(std::move(top));
    }
    if (seq.text) {
      e.text = seq.text->push(id);
      if (seq.stop) e.text = seq.stop->push(e.text);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      snapshot.total_completion_tokens++;
    }
    seq.handle->push(std::move(e));
    if (seq.stop && seq.stop->stopped())
      finish(seq, FinishReason::Stop);
    else if (seq.generated() >= seq.params.max_tokens || int64_t(seq.tokens.size()) >= max_context)
      finish(seq, FinishReason::Length);
    return 1;
  }

  // Masks the logits to the tokens the constraint allows. Returns false when
  // the sequence ended instead: complete (nothing may follow: "stop") or
  // stuck (nothing allowed: an error, never unconstrained output).
  bool apply_constraint(Sequence& seq, TokenConstraint& c, float* logits) {
    const ModelSpec& spec = model.spec;
    const TokenConstraint::Allowed a = c.allowed();
    if (!a.any_token) {
      if (a.can_end)
        finish(seq, FinishReason::Stop);
      else
        finish(seq, FinishReason::Error,
               "the output constraint allows no token here (the response_format schema or the "
               "forced tool call cannot be completed with this model's vocabulary)");
      return false;
    }
    std::vector<std::pair<int32_t, float>> eos;
    if (a.can_end)
      for (int32_t id : spec.eos_ids)
        if (id >= 0 && id < spec.vocab) eos.emplace_back(id, logits[id]);
    const std::vector<uint64_t>& bits = *a.bits;
    const int64_t covered = std::min<int64_t>(spec.vocab, int64_t(bits.size()) * 64);
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (int64_t w = 0; w * 64 < covered; ++w) {
      const uint64_t word = bits[size_t(w)];
      if (word == ~uint64_t(0)) continue;
      const int64_t end = std::min<int64_t>(covered, (w + 1) * 64);
      for (int64_t i = w * 64; i < end; ++i)
        if (!((word >> (i & 63)) & 1)) logits[i] = kNegInf;
    }
    for (int64_t i = covered; i < spec.vocab; ++i) logits[i] = kNegInf;
    for (auto [id, v] : eos) logits[id] = v;
    return true;
  }

  // ---- watchdog ----

  void watchdog() {
    while (!threads_stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::vector<std::shared_ptr<RequestHandle>> victims;
      {
        std::lock_guard<std::mutex> lock(step_mu);
        if (!in_step || step_abandoned || now_s() - step_start < config.step_timeout_s) continue;
        step_abandoned = true;
        victims = step_handles;
      }
      const std::string msg = strprintf(
          "the model step made no progress for %.0f s; the request was failed by the watchdog",
          config.step_timeout_s);
      std::fprintf(stderr, "error: watchdog: %s (%zu requests)\n", msg.c_str(), victims.size());
      {
        std::lock_guard<std::mutex> lock(mu);
        snapshot.watchdog_fired = true;
        snapshot.last_error = msg;
      }
      for (auto& h : victims) {
        GenerationEvent e;
        e.finish = FinishReason::Error;
        e.error = msg;
        h->finish(std::move(e), [&] {
          std::lock_guard<std::mutex> lock(mu);
          count_finish(FinishReason::Error, msg);
        });
      }
    }
  }

  // ---- status ----

  void publish() {
    const double now = now_s();
    auto rate = [&](std::deque<std::pair<double, int64_t>>& w) {
      while (!w.empty() && now - w.front().first > 10.0) w.pop_front();
      if (w.empty()) return 0.0;
      int64_t sum = 0;
      for (auto& [t, n] : w) sum += n;
      return double(sum) / std::max(1.0, now - w.front().first);
    };
    std::vector<EngineStatus::Request> reqs;
    int running = 0, waiting = 0;
    int images_waiting = 0;
    for (auto& seq : active) {
      RequestPhase p = seq->phase();
      (p == RequestPhase::Queued ? waiting : running)++;
      images_waiting += int(seq->images.size() - seq->images_encoded);
      reqs.push_back({seq->handle->id(), seq->vision_lane() ? "vision" : "text", p, seq->prompt_len,
                      seq->generated(), now - seq->start});
    }
    const int64_t used = blocks_used();
    std::lock_guard<std::mutex> lock(mu);
    snapshot.steps_executed = steps;
    snapshot.num_running = running;
    snapshot.num_waiting = waiting + int(incoming.size());
    snapshot.generation_tps = rate(gen_window);
    snapshot.prompt_tps = rate(prompt_window);
    snapshot.kv_blocks_used = used;
    snapshot.kv_blocks_cached =
        kv_pool->cached_count(AttentionKind::Full) + kv_pool->cached_count(AttentionKind::Sliding);
    snapshot.images_waiting = images_waiting;
    snapshot.requests = std::move(reqs);
    active_count = int(incoming.size()) +
                   int(std::count_if(active.begin(), active.end(),
                                     [](const auto& q) { return !q->handle->finished(); }));
  }
};

Engine::Engine(const Model& model, const EngineConfig& config, const TextStreamer* streamer,
               const VisionTower* vision)
    : impl_(std::make_unique<Impl>(model, config, streamer, vision)) {}

Engine::~Engine() {
  shutdown(0.0);
}

const ModelSpec& Engine::spec() const {
  return impl_->model.spec;
}
int64_t Engine::max_context() const {
  return impl_->max_context;
}
bool Engine::has_streamer() const {
  return impl_->streamer != nullptr;
}
const VisionTower* Engine::vision() const {
  return impl_->vision;
}

void Engine::check(const std::vector<int32_t>& prompt, const GenerationParams& params,
                   const std::vector<PreparedImage>& images) const {
  const Impl& m = *impl_;
  const ModelSpec& spec = m.model.spec;
  if (prompt.empty()) throw AdmissionError(400, "prompt", "the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= spec.vocab)
      throw AdmissionError(400, "prompt",
                           strprintf("token id %d is outside the vocabulary [0, %lld)", prompt[i],
                                     (long long)spec.vocab));
  if (int64_t(prompt.size()) >= m.max_context)
    throw AdmissionError(
        400, "messages",
        strprintf("the prompt is %zu tokens but the context is %lld tokens; shorten the prompt",
                  prompt.size(), (long long)m.max_context));
  for (auto [id, bias] : params.logit_bias)
    if (id < 0 || id >= spec.vocab)
      throw AdmissionError(400, "logit_bias",
                           strprintf("logit_bias names token id %d, outside the vocabulary [0, "
                                     "%lld)",
                                     id, (long long)spec.vocab));
  if (!params.stop.empty() && !m.streamer)
    throw AdmissionError(400, "stop",
                         "stop strings need a tokenizer, and this model was loaded without one");
  if (params.max_tokens < 1)
    throw AdmissionError(400, "max_tokens", "max_tokens must be at least 1");
  if (!images.empty()) {
    if (!m.vision)
      throw AdmissionError(400, "messages", "this server was started without a vision tower");
    int64_t want = 0, slots = 0;
    for (const PreparedImage& img : images) want += img.tokens;
    for (int32_t id : prompt) slots += id == m.vision->ids().placeholder;
    if (slots != want)
      throw AdmissionError(400, "messages",
                           strprintf("the prompt has %lld image placeholders but its %zu images "
                                     "need %lld",
                                     (long long)slots, images.size(), (long long)want));
  }
}

std::shared_ptr<RequestHandle> Engine::submit(std::vector<int32_t> prompt,
                                              const GenerationParams& params,
                                              std::vector<PreparedImage> images) {
  Impl& m = *impl_;
  check(prompt, params, images);
  auto seq = std::make_unique<Sequence>(params);
  const double now = now_s();
  seq->start = now;
  seq->deadline = now + (params.timeout_s > 0 ? params.timeout_s : m.config.default_timeout_s);
  seq->prompt_len = int32_t(prompt.size());
  if (m.config.prefix_cache && !images.empty()) {
    const int32_t placeholder = m.vision->ids().placeholder;
    seq->block_salts = image_block_salts(prompt, images, placeholder, KvPool::kBlockSize);
    seq->image_ends = image_token_ends(prompt, images, placeholder);
  }
  seq->tokens = std::move(prompt);
  seq->images = std::move(images);
  if (m.streamer)
    seq->text = params.keep_special.empty() ? m.streamer->start()
                                            : m.streamer->start_keeping(params.keep_special);
  if (!params.stop.empty()) seq->stop = std::make_unique<StopMatcher>(params.stop);
  if (params.constraint) seq->constraint = params.constraint->start();
  std::shared_ptr<RequestHandle> handle;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.accepting) throw AdmissionError(503, "", "the server is shutting down");
    {
      std::lock_guard<std::mutex> step_lock(m.step_mu);
      if (m.in_step && m.step_abandoned)
        throw AdmissionError(503, "", "the engine is stalled (watchdog fired); try again later");
    }
    if (m.active_count >= m.config.max_concurrent)
      throw AdmissionError(
          503, "",
          strprintf("the server is at capacity (%d concurrent requests); retry later",
                    m.config.max_concurrent));
    seq->index = ++m.arrivals;
    handle =
        std::make_shared<RequestHandle>(strprintf("req-%llu", (unsigned long long)++m.next_id));
    seq->handle = handle;
    (seq->vision_lane() ? m.snapshot.vision_lane_requests : m.snapshot.text_lane_requests)++;
    m.incoming.push_back(std::move(seq));
    m.active_count++;
  }
  m.wake.notify_all();
  return handle;
}

void Engine::shutdown(double grace_s) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.engine_thread.joinable()) return;
    m.accepting = false;
    if (!m.stopping) {
      m.stopping = true;
      m.stop_deadline = now_s() + grace_s;
    }
  }
  m.wake.notify_all();
  // The loop exits once idle. After the grace period (plus a margin for the
  // loop to fail what is left) the threads are told to stop. A step stuck in
  // a kernel for good would block the join; the server's signal handler
  // exits the process after the grace period in that case.
  const double give_up = now_s() + grace_s + 1.0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.active_count == 0 && m.incoming.empty()) break;
    }
    if (now_s() > give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  m.threads_stop.store(true);
  m.wake.notify_all();
  m.engine_thread.join();
  m.watchdog_thread.join();
}

EngineStatus Engine::status() const {
  Impl& m = *impl_;
  EngineStatus s;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    s = m.snapshot;
  }
  {
    std::lock_guard<std::mutex> lock(m.step_mu);
    s.healthy = !(m.in_step && m.step_abandoned);
  }
  s.uptime_s = now_s() - m.started;
  if (m.config.device.cuda) {
    try {
      const GpuInfo mem = gpu_info(m.config.device);
      s.has_gpu_memory = true;
      s.gpu_memory_total_bytes = mem.total_bytes;
      s.gpu_memory_free_bytes = mem.free_bytes;
    } catch (const std::exception&) {
      // A failing query leaves the figures out; the step reports the error.
    }
  }
  return s;
}

}  // namespace tandem
