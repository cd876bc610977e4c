// tokenize_bench: encode/decode throughput of tandem's tokenizers on one core.
//
// Usage: tokenize_bench [TOKENIZER_DIR ...]
//   (default: the three cached by scripts/fetch_tokenizers.sh)
//
// Texts:
//  - English: ~2 MB of real prose: the Debian license texts in
//    /usr/share/common-licenses, then /usr/share/doc/*/copyright files in
//    name order (present on every Debian system), cut into 4 KB requests.
//  - CJK: 1 MB of generated Chinese-like text (code points drawn from the
//    first 4,000 CJK ideographs with a fixed seed, punctuation every 8-24
//    chars), also in 4 KB requests.
// Figures: "cold" = first pass with an empty BPE word cache (a fresh
// tokenizer); "warm" = best of 5 later passes (the cache filled, the usual
// state of a server); decode = ids back to text. MB = 10^6 bytes of input
// text. Single-threaded; times are the thread's CPU time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

namespace fs = std::filesystem;
// Thread CPU time, not wall time: the development VM is shared, and a
// single-threaded figure should not count the time other processes ran.
struct clk {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
};

double secs(double a, double b) {
  return b - a;
}

std::vector<std::string> chunks(const std::string& s, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t e = std::min(s.size(), i + n);
    while (e < s.size() && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80) ++e;
    out.push_back(s.substr(i, e - i));
    i = e;
  }
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// ~2 MB of real English: the license texts, then Debian copyright files.
std::string english_text() {
  std::string all;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator("/usr/share/common-licenses"))
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<fs::path> more;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/share/doc", ec)) {
    fs::path c = e.path() / "copyright";
    if (fs::is_regular_file(c, ec)) more.push_back(c);
  }
  std::sort(more.begin(), more.end());
  files.insert(files.end(), more.begin(), more.end());
  for (const auto& p : files) {
    all += slurp(p);
    if (all.size() >= 2000000) break;
  }
  return tandem::text::utf8_lossy(all);
}

std::string cjk_text(size_t bytes) {
  std::mt19937 rng(12345);
  std::string s;
  const char* punct[] = {"\xEF\xBC\x8C", "\xE3\x80\x82", "\xE3\x80\x81", "\xEF\xBC\x9F"};
  int until = 8;
  while (s.size() < bytes) {
    tandem::text::append_utf8(s, 0x4E00 + rng() % 4000);
    if (--until == 0) {
      s += punct[rng() % 4];
      until = 8 + rng() % 17;
    }
  }
  return s;
}

void bench(const std::string& dir, const char* label, const std::string& text) {
  auto reqs = chunks(text, 4096);
  double mb = text.size() / 1e6;
  auto t0 = clk::now();
  auto tok = tandem::text::Tokenizer::load(dir);
  auto t1 = clk::now();
  size_t ntok = 0;
  for (const auto& r : reqs) ntok += tok.encode(r, false).size();
  auto t2 = clk::now();
  double cold = secs(t1, t2), warm = 1e9;
  std::vector<std::vector<int32_t>> ids;
  for (int pass = 0; pass < 5; ++pass) {
    ids.clear();
    auto a = clk::now();
    for (const auto& r : reqs) ids.push_back(tok.encode(r, false));
    warm = std::min(warm, secs(a, clk::now()));
  }
  auto d0 = clk::now();
  size_t out_bytes = 0;
  for (const auto& v : ids) out_bytes += tok.decode(v).size();
  double dec = secs(d0, clk::now());
  std::printf(
      "%-9s %-8s %7.2f MB %8zu tokens  load %5.2f s  encode cold %6.1f MB/s  warm %6.1f MB/s  "
      "decode %6.1f MB/s\n",
      fs::path(dir).filename().c_str(), label, mb, ntok, secs(t0, t1), mb / cold, mb / warm,
      out_bytes / 1e6 / dec);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) dirs.push_back(argv[i]);
  if (dirs.empty()) {
    const char* c = std::getenv("TANDEM_CACHE");
    const char* home = std::getenv("HOME");
    std::string root = c && *c ? std::string(c) : std::string(home ? home : "") + "/.cache/tandem";
    for (const char* n : {"llama3_1", "qwen3", "gemma3"}) dirs.push_back(root + "/tokenizers/" + n);
  }
  std::string en = english_text(), cjk = cjk_text(1000 * 1000);
  for (const auto& d : dirs) {
    try {
      bench(d, "english", en);
      bench(d, "cjk", cjk);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s (run scripts/fetch_tokenizers.sh)\n", d.c_str(), e.what());
      return 1;
    }
  }
  return 0;
}
