#include "server/metrics.h"

#include <cstdarg>
#include <cstdio>

namespace tandem::server {

namespace {

void line(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void line(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  out += buf;
  out += '\n';
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  line(out, "# HELP %s %s", name, help);
  line(out, "# TYPE %s %s", name, type);
}

void gauge(std::string& out, const char* name, const char* help, double v) {
  header(out, name, "gauge", help);
  line(out, "%s %.17g", name, v);
}

void counter(std::string& out, const char* name, const char* help, double v) {
  header(out, name, "counter", help);
  line(out, "%s %.17g", name, v);
}

// Label values are route patterns, reasons and model names; escape anyway.
std::string escape_label(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '\\' || c == '"') r += '\\';
    if (c == '\n') {
      r += "\\n";
      continue;
    }
    r += c;
  }
  return r;
}

}  // namespace

Metrics::Histogram::Histogram(std::vector<double> b)
    : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}

void Metrics::Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  counts[i]++;
  sum += v;
  count++;
}

void Metrics::Histogram::render(std::string& out, const char* name, const char* help) const {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    line(out, "%s_bucket{le=\"%g\"} %llu", name, bounds[i], (unsigned long long)cumulative);
  }
  cumulative += counts.back();
  line(out, "%s_bucket{le=\"+Inf\"} %llu", name, (unsigned long long)cumulative);
  line(out, "%s_sum %.17g", name, sum);
  line(out, "%s_count %llu", name, (unsigned long long)count);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      request_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}) {}

void Metrics::count_http(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  http_[{route, status}]++;
}

void Metrics::count_finish(const char* reason) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_[reason]++;
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(s);
}

void Metrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  inter_token_.observe(s);
}

void Metrics::observe_request(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  request_.observe(s);
}

std::string Metrics::render(const EngineStatus* e, const std::string& state,
                            const std::string& model) const {
  std::string out;
  header(out, "tandem_info", "gauge", "Static information about the server (always 1).");
  line(out, "tandem_info{model=\"%s\",version=\"0.1.0\"} 1", escape_label(model).c_str());
  gauge(out, "tandem_ready",
        "1 when /health answers 200 (model loaded, engine healthy, not draining).",
        state == "ok" ? 1 : 0);
  if (e) {
    gauge(out, "tandem_uptime_seconds", "Seconds since the engine started.", e->uptime_s);
    gauge(out, "tandem_healthy", "1 unless a step is stuck past --step-timeout.", e->healthy);
    gauge(out, "tandem_watchdog_fired", "1 once the step watchdog has fired.", e->watchdog_fired);
    counter(out, "tandem_engine_steps_total", "Engine steps executed.", double(e->steps_executed));
    gauge(out, "tandem_requests_running", "Requests in prefill or decode.", e->num_running);
    gauge(out, "tandem_requests_waiting", "Requests queued for the engine.", e->num_waiting);
    counter(out, "tandem_requests_processed_total", "Requests that reached a terminal state.",
            double(e->total_requests_processed));
    counter(out, "tandem_requests_failed_total", "Requests that ended in an error or a timeout.",
            double(e->total_requests_failed));
    counter(out, "tandem_requests_cancelled_total",
            "Requests cancelled (client gone or cancel call).",
            double(e->total_requests_cancelled));
    counter(out, "tandem_prompt_tokens_total", "Prompt tokens prefilled.",
            double(e->total_prompt_tokens));
    counter(out, "tandem_generation_tokens_total", "Tokens generated.",
            double(e->total_completion_tokens));
    gauge(out, "tandem_generation_tokens_per_second", "Generated tokens per second, recent window.",
          e->generation_tps);
    gauge(out, "tandem_prompt_tokens_per_second", "Prefilled tokens per second, recent window.",
          e->prompt_tps);
    gauge(out, "tandem_kv_blocks_used", "KV cache blocks in use.", double(e->kv_blocks_used));
    gauge(out, "tandem_kv_blocks_total", "KV cache blocks in all.", double(e->kv_blocks_total));
    gauge(out, "tandem_kv_blocks_cached", "Free KV cache blocks the prefix cache keeps.",
          double(e->kv_blocks_cached));
    counter(out, "tandem_prompt_tokens_cached_total",
            "Prompt tokens taken from the prefix cache instead of prefilled.",
            double(e->total_cached_prompt_tokens));
    counter(out, "tandem_text_lane_requests_total",
            "Requests accepted on the text lane (no image).", double(e->text_lane_requests));
    counter(out, "tandem_vision_lane_requests_total",
            "Requests accepted on the vision lane (with images).", double(e->vision_lane_requests));
    counter(out, "tandem_vision_encoder_calls_total",
            "Vision encoder batches run (one per engine step that encodes images).",
            double(e->vision_encoder_calls));
    counter(out, "tandem_images_processed_total", "Images encoded by the vision tower.",
            double(e->images_processed));
    counter(out, "tandem_vision_encode_seconds_total",
            "Wall time the engine spent encoding images (other requests wait meanwhile).",
            e->vision_encode_seconds);
    gauge(out, "tandem_images_waiting", "Images accepted but not yet encoded.",
          double(e->images_waiting));
    if (e->has_gpu_memory) {
      gauge(out, "tandem_gpu_memory_total_bytes", "Memory of the CUDA device the model runs on.",
            double(e->gpu_memory_total_bytes));
      gauge(out, "tandem_gpu_memory_used_bytes",
            "Memory in use on the CUDA device the model runs on (by any process).",
            double(e->gpu_memory_total_bytes - e->gpu_memory_free_bytes));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  header(out, "tandem_http_responses_total", "counter", "HTTP responses by route and status.");
  for (const auto& [key, n] : http_)
    line(out, "tandem_http_responses_total{route=\"%s\",status=\"%d\"} %llu",
         escape_label(key.first).c_str(), key.second, (unsigned long long)n);
  header(out, "tandem_generations_finished_total", "counter",
         "Generation requests answered, by finish reason.");
  for (const auto& [reason, n] : finished_)
    line(out, "tandem_generations_finished_total{reason=\"%s\"} %llu", escape_label(reason).c_str(),
         (unsigned long long)n);
  ttft_.render(out, "tandem_time_to_first_token_seconds",
               "Seconds from request arrival to its first generated token.");
  inter_token_.render(out, "tandem_inter_token_latency_seconds",
                      "Seconds between consecutive generated tokens of a request.");
  request_.render(out, "tandem_request_duration_seconds",
                  "Seconds from request arrival to its last event.");
  return out;
}

}  // namespace tandem::server
