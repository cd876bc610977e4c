#include "cli/common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/clock.h"
#include "core/error.h"

namespace tandem::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos)
      fail("%s: empty entry in \"%s\" (expected comma-separated token ids)", flag, text.c_str());
    item = item.substr(a, b - a + 1);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX)
      fail("%s: \"%s\" is not a token id (expected a non-negative integer)", flag, item.c_str());
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) fail("%s: no token ids given", flag);
  return ids;
}

double now_seconds() {
  return monotonic_seconds();
}

std::unique_ptr<Model> load_model_verbose(const std::string& dir) {
  const double t0 = now_seconds();
  auto model = load_model(dir);
  const Checkpoint& ckpt = model->checkpoint;
  const auto names = ckpt.names();
  uint64_t total = 0;
  for (const auto& n : names) total += ckpt.get(n).nbytes();
  const bool tty = isatty(STDERR_FILENO);
  uint64_t done = 0;
  int last_pct = -1;
  volatile uint8_t sink = 0;
  for (const auto& n : names) {
    TensorView t = ckpt.get(n);
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (size_t off = 0; off < t.nbytes(); off += 4096) sink = sink + p[off];
    done += t.nbytes();
    int pct = total ? int(done * 100 / total) : 100;
    if (tty && pct != last_pct) {
      std::fprintf(stderr, "\rloading %s: %3d%% of %.2f GB", dir.c_str(), pct, double(total) / 1e9);
      last_pct = pct;
    }
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  const ModelSpec& s = model->spec;
  std::fprintf(stderr, "loaded %s: %s, %lld layers, hidden %lld, vocab %lld, %.2f GB in %.1f s\n",
               dir.c_str(), s.arch.c_str(), (long long)s.layers, (long long)s.hidden,
               (long long)s.vocab, double(total) / 1e9, now_seconds() - t0);
  return model;
}

uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

}  // namespace tandem::cli
