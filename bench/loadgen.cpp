// Load generator for a running OpenAI-compatible server (tandem serve or any
// other): closed-loop clients at each concurrency level, streaming
// /v1/completions requests with token-id prompts, measuring what a user sees.
//
//   loadgen --url http://127.0.0.1:8000 [--concurrency 1,8,32] [--requests N]
//           [--prompt-tokens 64] [--max-tokens 64] [--api-key KEY] [--model NAME]
//           [--max-id 300] [--seed S]
//
// Per level it prints: requests done and failed, output throughput (generated
// tokens / wall time of the level), requests/s, time to first token (request
// sent -> first chunk with a token) and inter-token latency (gap between
// consecutive tokens of one request; a chunk of k tokens counts k gaps of
// gap/k) as p50/p95/p99, and the mean end-to-end latency. `--requests` is per
// level (default: max(4, 2 x concurrency)). Prompts are random ids below
// --max-id (greedy, ignore_eos, so every request generates --max-tokens).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Options {
  std::string url = "http://127.0.0.1:8000";
  std::vector<int> concurrency = {1, 8, 32};
  int requests = 0;  // per level; 0 = max(4, 2 x concurrency)
  int prompt_tokens = 64;
  int max_tokens = 64;
  int max_id = 300;
  uint64_t seed = 1;
  std::string api_key;
  std::string model;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "error: %s\nusage: loadgen --url URL [--concurrency 1,8,32] [--requests N] "
               "[--prompt-tokens N] [--max-tokens N] [--api-key KEY] [--model NAME] [--max-id N] "
               "[--seed S]\n",
               msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    auto integer = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (*end || n < 0) usage((a + ": '" + v + "' is not a non-negative integer").c_str());
      return int(n);
    };
    if (a == "--url") {
      o.url = value();
    } else if (a == "--concurrency") {
      o.concurrency.clear();
      std::stringstream ss(value());
      std::string item;
      while (std::getline(ss, item, ','))
        o.concurrency.push_back(std::max(1, std::atoi(item.c_str())));
      if (o.concurrency.empty()) usage("--concurrency: no levels");
    } else if (a == "--requests") {
      o.requests = integer();
    } else if (a == "--prompt-tokens") {
      o.prompt_tokens = std::max(1, integer());
    } else if (a == "--max-tokens") {
      o.max_tokens = std::max(1, integer());
    } else if (a == "--max-id") {
      o.max_id = std::max(4, integer());
    } else if (a == "--seed") {
      o.seed = uint64_t(integer());
    } else if (a == "--api-key") {
      o.api_key = value();
    } else if (a == "--model") {
      o.model = value();
    } else if (a == "--help" || a == "-h") {
      usage("help");
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

// One streamed request: token arrival times, or an error.
struct Sample {
  bool ok = false;
  std::string error;
  double sent = 0;
  std::vector<double> token_times;  // one per generated token
};

Sample run_request(httplib::Client& cli, const Options& o, const std::vector<int>& prompt) {
  Sample s;
  json body = {{"prompt", prompt},
               {"max_tokens", o.max_tokens},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true}};
  if (!o.model.empty()) body["model"] = o.model;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  std::string buf;
  bool done = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double t = now_s();
    buf.append(data, n);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        s.error = j["error"].value("message", "stream error");
        continue;
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const size_t k = j["choices"][0].value("token_ids", json::array()).size();
      for (size_t i = 0; i < k; ++i) s.token_times.push_back(t);
    }
    return true;
  };
  s.sent = now_s();
  auto r = cli.send(req);
  if (!r) {
    s.error = "connection: " + httplib::to_string(r.error());
  } else if (r->status != 200) {
    s.error = "HTTP " + std::to_string(r->status) + ": " + r->body.substr(0, 200);
  } else if (!done) {
    s.error = "stream ended without [DONE]";
  }
  s.ok = s.error.empty() && !s.token_times.empty();
  return s;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(rank), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

void run_level(const Options& o, int concurrency) {
  const int total = o.requests > 0 ? o.requests : std::max(4, 2 * concurrency);
  std::atomic<int> next{0};
  std::mutex mu;
  std::vector<Sample> samples;
  std::vector<std::string> errors;
  const double t0 = now_s();
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w)
    workers.emplace_back([&, w] {
      httplib::Client cli(o.url);
      cli.set_read_timeout(3600, 0);
      cli.set_connection_timeout(10, 0);
      std::mt19937_64 rng(o.seed * 1000003 + uint64_t(w));
      for (;;) {
        const int i = next.fetch_add(1);
        if (i >= total) break;
        std::vector<int> prompt(size_t(o.prompt_tokens));
        for (int& id : prompt) id = 3 + int(rng() % uint64_t(o.max_id - 3));
        Sample s = run_request(cli, o, prompt);
        std::lock_guard<std::mutex> lock(mu);
        if (!s.ok) errors.push_back(s.error);
        samples.push_back(std::move(s));
      }
    });
  for (auto& t : workers) t.join();
  const double wall = now_s() - t0;

  std::vector<double> ttft, itl, e2e;
  size_t tokens = 0, ok = 0;
  for (const Sample& s : samples) {
    if (!s.ok) continue;
    ok++;
    tokens += s.token_times.size();
    ttft.push_back(s.token_times.front() - s.sent);
    e2e.push_back(s.token_times.back() - s.sent);
    for (size_t i = 1; i < s.token_times.size(); ++i) {
      // Tokens that arrived in one chunk share its gap.
      size_t j = i;
      while (j + 1 < s.token_times.size() && s.token_times[j + 1] == s.token_times[i]) ++j;
      const double gap = (s.token_times[i] - s.token_times[i - 1]) / double(j - i + 1);
      for (size_t k = i; k <= j; ++k) itl.push_back(gap);
      i = j;
    }
  }
  double mean_e2e = 0;
  for (double v : e2e) mean_e2e += v / double(e2e.size());
  std::printf("| %d | %zu | %zu | %.2f | %.3f | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f | %.2f |\n",
              concurrency, ok, samples.size() - ok, double(tokens) / wall, double(ok) / wall,
              percentile(ttft, 50) * 1e3, percentile(ttft, 95) * 1e3, percentile(ttft, 99) * 1e3,
              percentile(itl, 50) * 1e3, percentile(itl, 95) * 1e3, percentile(itl, 99) * 1e3,
              mean_e2e);
  std::fflush(stdout);
  for (size_t i = 0; i < errors.size() && i < 3; ++i)
    std::fprintf(stderr, "  error: %s\n", errors[i].c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  {
    httplib::Client cli(o.url);
    cli.set_read_timeout(3600, 0);
    auto health = cli.Get("/health");
    if (!health || health->status != 200) {
      std::fprintf(stderr, "error: %s/health is not 200 (%s); is the server up and loaded?\n",
                   o.url.c_str(),
                   health ? std::to_string(health->status).c_str()
                          : httplib::to_string(health.error()).c_str());
      return 1;
    }
    // Warm-up: one short request, not measured.
    Options warm = o;
    warm.max_tokens = 2;
    Sample s = run_request(cli, warm, std::vector<int>(size_t(o.prompt_tokens), 5));
    if (!s.ok) {
      std::fprintf(stderr, "error: warm-up request failed: %s\n", s.error.c_str());
      return 1;
    }
  }
  std::printf(
      "loadgen: %s, prompt %d tokens, %d generated tokens per request (greedy, ignore_eos)\n\n",
      o.url.c_str(), o.prompt_tokens, o.max_tokens);
  std::printf(
      "| concurrency | ok | failed | output tok/s | req/s | TTFT p50/p95/p99 ms | ITL p50/p95/p99 "
      "ms "
      "| mean e2e s |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int c : o.concurrency) run_level(o, c);
  return 0;
}
