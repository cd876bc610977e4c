// Prometheus text exposition (format 0.0.4) for GET /metrics.
//
// Server-side series (counted here): HTTP responses by route and status,
// finished generations by finish reason, and latency histograms (time to
// first token, inter-token latency, end-to-end request time). Engine series
// come from Engine::status() at scrape time. Every metric is prefixed
// `tandem_`; the list is in docs/api.md. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace tandem::server {

class Metrics {
 public:
  Metrics();

  // `route` is the route pattern ("/v1/requests/{id}/cancel"), never a raw
  // path, so label values stay few.
  void count_http(const std::string& route, int status);
  void count_finish(const char* reason);  // "stop", "length", "error", "timeout", "cancelled"
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_request(double seconds);

  // `engine` is null while the model loads. `state` is the /health status
  // word ("ok", "loading", "unhealthy", "shutting_down").
  std::string render(const EngineStatus* engine, const std::string& state,
                     const std::string& model) const;

 private:
  struct Histogram {
    std::vector<double> bounds;    // upper bounds, ascending
    std::vector<uint64_t> counts;  // per bucket, not cumulative; last = +Inf
    double sum = 0;
    uint64_t count = 0;
    explicit Histogram(std::vector<double> b);
    void observe(double v);
    void render(std::string& out, const char* name, const char* help) const;
  };

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_;
  std::map<std::string, uint64_t> finished_;
  Histogram ttft_, inter_token_, request_;
};

}  // namespace tandem::server
