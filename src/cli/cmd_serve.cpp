// tandem serve: the OpenAI-compatible HTTP server over one model.
//
// Order of events: bind the port first (a port in use fails in a second, not
// after a long load), serve /health as 503 "loading" while the model loads,
// then print the ready line with the URL. SIGTERM or SIGINT: stop accepting
// work, let in-flight requests finish for --shutdown-grace seconds, exit 0; if
// the engine cannot finish (a step stuck in a kernel), the process _exit(0)s
// shortly after the grace period. A second signal exits at once (status 1).
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "catalog/demo_model.h"
#include "catalog/resolve.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/vision_tower.h"
#include "server/model_text.h"
#include "server/server.h"

namespace tandem::cli {

namespace {

struct ServeOptions {
  std::string model;
  std::string quantize;  // --quantize q4|q8
  std::string mmproj;    // --mmproj FILE: the vision tower (llama.cpp mmproj GGUF)
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads = 0;
  std::string device = "auto";
  double gpu_memory_fraction = 0;  // 0: unset
  int max_concurrent = 32;
  std::string kv_memory;
  std::string kv_cache_dtype = "auto";
  std::string gemm_precision = "bf16";
  int64_t max_context = 0;
  double timeout_s = 600;
  double step_timeout_s = 60;
  std::string api_key;
  std::string cors;
  std::string served_model_name;
  double shutdown_grace_s = 30;
  bool log_requests = false;
  bool text_only = false;
  int64_t vision_budget = 1024;
  bool allow_image_urls = false;
  std::string image_url_max = "20M";
  double image_url_timeout_s = 10;
  bool no_thinking = false;
  bool no_prefix_cache = false;
};

// Seconds after the grace period before a drain that cannot finish is cut
// short with _exit(0). Server::drain() itself takes at most grace + ~5 s.
constexpr double kHardExitMarginS = 6.0;

// "512M", "2G", "1.5GiB", "1048576" -> bytes (K/M/G/T are powers of 1024).
size_t parse_byte_size(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();  // "GB", "GIB" -> "G", "GI"
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  if (unit == "K") mult = 1024.0;
  if (unit == "M") mult = 1024.0 * 1024;
  if (unit == "G") mult = 1024.0 * 1024 * 1024;
  if (unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  if (end == text.c_str() || mult == 0 || !std::isfinite(v) || v <= 0)
    fail("%s: '%s' is not a size (examples: 512M, 2G, 1.5G)", flag, text.c_str());
  return size_t(v * mult);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a != std::string::npos) items.push_back(item.substr(a, b - a + 1));
  }
  return items;
}

std::string default_model_name(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Signals, delivered to one thread through sigwait(): the first one wakes
// the main thread; a second one exits at once.
class SignalWatch {
 public:
  SignalWatch() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    // Blocked here, before any other thread exists, so every thread inherits
    // the mask and only the watcher receives them.
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] { run(); });
    thread_.detach();
  }

  // Blocks until the first signal; returns its name.
  const char* wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return signo_ != 0; });
    return signo_ == SIGINT ? "SIGINT" : "SIGTERM";
  }

  void set_loading(bool loading) { loading_.store(loading); }

 private:
  void run() {
    for (int count = 0;; ++count) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      if (loading_.load()) {
        std::fprintf(stderr, "tandem serve: interrupted while loading the model\n");
        _exit(0);
      }
      if (count > 0) {
        std::fprintf(stderr, "tandem serve: second signal: exiting now\n");
        _exit(1);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        signo_ = sig;
      }
      cv_.notify_all();
    }
  }

  sigset_t set_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  int signo_ = 0;
  std::atomic<bool> loading_{true};
};

// The vision tower, unless the checkpoint has none or --text-only leaves it
// unread. A tower that fails to load is a warning: text keeps working, and
// image requests get a 400 that says why.
server::VisionInfo load_vision(const Model& model, bool text_only, const DeviceChoice& device,
                               std::unique_ptr<VisionTower>& tower) {
  server::VisionInfo info;
  info.in_checkpoint = VisionTower::present(model);
  if (!info.in_checkpoint) {
    info.unavailable =
        model.source ? "the GGUF model has no vision tower; start the server with --mmproj FILE "
                       "(a llama.cpp mmproj GGUF) to accept images"
                     : "the model has no vision tower (config.json has no vision_config)";
    return info;
  }
  info.weight_bytes = VisionTower::checkpoint_bytes(model);
  if (text_only) {
    info.unavailable =
        "the server was started with --text-only; restart it without --text-only to accept "
        "images";
    std::fprintf(stderr,
                 "tandem serve: --text-only: the vision tower is not loaded (%.1f MB of vision "
                 "weights left unread)\n",
                 double(info.weight_bytes) / 1e6);
    return info;
  }
  try {
    tower = VisionTower::load(model);
    place_vision_tower(*tower, device);
    info.loaded = true;
    info.device = tower->device_name();
    std::fprintf(stderr, "tandem serve: vision tower loaded%s%s (%.1f MB of weights)\n",
                 model.mmproj.empty() ? "" : " from ", model.mmproj.c_str(),
                 double(info.weight_bytes) / 1e6);
  } catch (const Error& e) {
    info.unavailable = std::string("the vision tower failed to load: ") + e.what();
    std::fprintf(stderr, "tandem serve: warning: %s; serving text only\n",
                 info.unavailable.c_str());
  }
  return info;
}

int run_serve(const ServeOptions& o) {
  if (o.port < 0 || o.port > 65535)
    fail("--port must be in [0, 65535] (0: any free port), got %d", o.port);
  if (o.max_concurrent < 1) fail("--max-concurrent must be at least 1, got %d", o.max_concurrent);
  if (o.max_context < 0) fail("--max-context must not be negative");
  if (!(o.timeout_s > 0)) fail("--timeout must be positive (seconds), got %g", o.timeout_s);
  if (!(o.step_timeout_s > 0))
    fail("--step-timeout must be positive (seconds), got %g", o.step_timeout_s);
  if (!(o.shutdown_grace_s >= 0)) fail("--shutdown-grace must not be negative");
  if (o.vision_budget < 1)
    fail("--vision-budget must be at least 1, got %lld", (long long)o.vision_budget);
  if (!(o.image_url_timeout_s > 0)) fail("--image-url-timeout must be positive (seconds)");
  if (!(o.gpu_memory_fraction >= 0 && o.gpu_memory_fraction <= 1))
    fail("--gpu-memory-fraction must be in (0, 1], got %g", o.gpu_memory_fraction);

  EngineConfig config;
  // Before the port and the model: a device that cannot be used fails at once.
  config.device = resolve_device(o.device);
  if (o.gpu_memory_fraction > 0 && !config.device.cuda)
    std::fprintf(stderr, "tandem serve: --gpu-memory-fraction is ignored on the CPU\n");
  config.gpu_memory_fraction = o.gpu_memory_fraction;
  config.kv_cache_dtype = o.kv_cache_dtype;
  resolve_kv_dtype(o.kv_cache_dtype, config.device);  // a bad value fails before the model loads
  config.gemm_precision = o.gemm_precision;
  resolve_gemm_precision(o.gemm_precision);
  config.threads = o.threads;
  config.max_concurrent = o.max_concurrent;
  config.max_context = o.max_context;
  config.kv_memory = o.kv_memory.empty() ? 0 : parse_byte_size(o.kv_memory, "--kv-memory");
  config.default_timeout_s = o.timeout_s;
  config.step_timeout_s = o.step_timeout_s;
  config.prefix_cache = !o.no_prefix_cache;
  config.vision_budget = o.vision_budget;

  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.served_model_name =
      o.served_model_name.empty() ? default_model_name(o.model) : o.served_model_name;
  so.api_key = o.api_key;
  if (so.api_key.empty())
    if (const char* env = std::getenv("TANDEM_API_KEY")) so.api_key = env;
  so.cors_origins = split_list(o.cors);
  so.max_request_timeout_s = o.timeout_s;
  so.max_concurrent = o.max_concurrent;
  so.log_requests = o.log_requests;
  so.allow_image_urls = o.allow_image_urls;
  so.no_thinking = o.no_thinking;
  so.image_url_limits.max_bytes = parse_byte_size(o.image_url_max, "--image-url-max-size");
  so.image_url_limits.timeout_s = o.image_url_timeout_s;

  SignalWatch signals;
  server::Server srv(so);
  srv.bind();
  srv.start();
  std::fprintf(stderr, "tandem serve: listening on %s (503 until the model is loaded)\n",
               srv.url().c_str());

  // A name is resolved (and downloaded when missing) once the port is held,
  // so a port in use fails at once; /health says "loading" meanwhile.
  const std::string dir = catalog::resolve_model_arg(o.model, /*allow_download=*/true);
  std::unique_ptr<Model> model = load_model_verbose(dir, load_options(o.quantize, config.device));
  model->mmproj = o.mmproj;
  // The tokenizer and chat template, when the folder has them: without a
  // tokenizer, prompts must be token ids and responses carry ids only.
  std::unique_ptr<server::ModelText> text = server::ModelText::load(dir);
  if (!text)
    std::fprintf(stderr,
                 "tandem serve: warning: %s has no tokenizer.json or tekken.json; prompts must be "
                 "token ids\n",
                 o.model.c_str());
  else if (!text->has_chat_template())
    std::fprintf(
        stderr,
        "tandem serve: warning: %s has no chat template; /v1/chat/completions answers 400\n",
        o.model.c_str());
  // Test hook (docs/api.md): every request's output is this text, tokenized.
  if (const char* forced = std::getenv("TANDEM_FORCE_OUTPUT"); forced && text) {
    config.forced_output = text->tokenizer().encode(forced, /*add_special=*/false);
    std::fprintf(stderr,
                 "tandem serve: TANDEM_FORCE_OUTPUT: every request generates %zu forced "
                 "tokens\n",
                 config.forced_output.size());
  }
  std::unique_ptr<VisionTower> tower;
  const server::VisionInfo vision = load_vision(*model, o.text_only, config.device, tower);
  Engine engine(*model, config, text.get(), tower.get());
  srv.attach(&engine, text.get(), vision);
  signals.set_loading(false);
  std::fprintf(stderr,
               "tandem serve: ready: model '%s' on %s (context %lld tokens, up to %d concurrent "
               "requests%s) at %s/v1\n",
               so.served_model_name.c_str(), config.device.name().c_str(),
               (long long)engine.max_context(), o.max_concurrent,
               so.api_key.empty() ? "" : ", API key required", srv.url().c_str());

  const char* sig = signals.wait();
  std::fprintf(stderr, "tandem serve: %s: draining (grace %.0f s)\n", sig, o.shutdown_grace_s);
  const double hard_exit_after = o.shutdown_grace_s + kHardExitMarginS;
  std::thread([hard_exit_after] {
    std::this_thread::sleep_for(std::chrono::duration<double>(hard_exit_after));
    std::fprintf(stderr, "tandem serve: the engine did not stop in time; exiting\n");
    _exit(0);
  }).detach();
  srv.drain(o.shutdown_grace_s);
  std::fprintf(stderr, "tandem serve: stopped\n");
  return 0;
}

}  // namespace

Runner add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI HTTP API");
  cmd->add_option("model", o->model,
                  "Model: a folder, an alias (tandem models) or org/name[@revision], downloaded "
                  "when missing (default: the built-in demo model, gemma3-demo)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads for the model (default: all cores)");
  add_device_option(cmd, o->device);
  add_quantize_option(cmd, o->quantize);
  add_mmproj_option(cmd, o->mmproj);
  cmd->add_option("--max-concurrent", o->max_concurrent,
                  "Requests running or queued at once; more get 503 with Retry-After")
      ->capture_default_str();
  cmd->add_option("--kv-memory", o->kv_memory,
                  "KV cache size, e.g. 512M or 2G (default: enough for --max-concurrent full "
                  "contexts, at most 2G on the CPU or what --gpu-memory-fraction leaves)");
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_gemm_precision_option(cmd, o->gemm_precision);
  cmd->add_option("--gpu-memory-fraction", o->gpu_memory_fraction,
                  "CUDA only, without --kv-memory: the share of the GPU's memory tandem may use "
                  "(default 0.9); the KV cache gets what the weights, other processes and 512 "
                  "MiB of scratch leave of it");
  cmd->add_option("--max-context", o->max_context,
                  "Tokens per sequence, prompt included (default: the model's, at most 32768)");
  cmd->add_option("--timeout", o->timeout_s,
                  "Seconds a request may take; also the most a request's own 'timeout' may ask")
      ->capture_default_str();
  cmd->add_option("--step-timeout", o->step_timeout_s,
                  "Watchdog: a model step taking longer fails its requests and marks /health "
                  "unhealthy")
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (default: the "
                  "TANDEM_API_KEY environment variable; none if unset)");
  cmd->add_option("--cors", o->cors, "Allowed browser origins, comma-separated, or '*'");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "The model's name in the API (default: the model folder's name)");
  cmd->add_option("--shutdown-grace", o->shutdown_grace_s,
                  "Seconds in-flight requests get to finish after SIGTERM/SIGINT")
      ->capture_default_str();
  cmd->add_flag("--log-requests", o->log_requests, "Log one line per HTTP response on stderr");
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Compute every prompt in full (default: reuse the KV rows of earlier prompts' "
                "shared beginnings)");
  cmd->add_flag("--text-only,--no-mllm", o->text_only,
                "Do not load the vision tower (saves its memory); image requests get 400");
  cmd->add_option("--vision-budget", o->vision_budget,
                  "Image soft tokens encoded per engine step (at least one image per step)")
      ->capture_default_str();
  cmd->add_flag("--allow-image-urls", o->allow_image_urls,
                "Fetch http(s) image URLs in requests (default: data: URLs only)");
  cmd->add_option("--image-url-max-size", o->image_url_max, "Largest image a URL may return")
      ->capture_default_str();
  cmd->add_option("--image-url-timeout", o->image_url_timeout_s,
                  "Seconds one image URL fetch may take")
      ->capture_default_str();
  cmd->add_flag("--no-thinking", o->no_thinking,
                "Chat templates get enable_thinking=false unless a request sets it "
                "(chat_template_kwargs.enable_thinking or enable_thinking)");
  return [o] {
    check_mmproj(o->mmproj);
    if (o->model.empty()) {
      o->model = catalog::demo_model_dir();
      if (o->served_model_name.empty()) o->served_model_name = catalog::kDemoModelName;
      std::fprintf(stderr,
                   "tandem serve: no model given: serving the built-in demo model %s (%s). It "
                   "answers simple questions only; give a model to serve a real one (tandem "
                   "models lists names).\n",
                   catalog::kDemoModelName, o->model.c_str());
    }
    if (o->served_model_name.empty()) o->served_model_name = catalog::model_display_name(o->model);
    return run_serve(*o);
  };
}

}  // namespace tandem::cli
