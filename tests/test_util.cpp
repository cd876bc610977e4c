#include "test_util.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "model/model.h"

namespace tandem::test {

std::string source_dir() {
  return TANDEM_SOURCE_DIR;
}
std::string tandem_binary() {
  return TANDEM_BINARY;
}
std::string fixture_dir(const std::string& name) {
  return source_dir() + "/tests/fixtures/parity/" + name;
}

std::string fixture_param_name(const std::string& fixture) {
  std::string s = fixture;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

CommandResult run_tandem(const std::string& args) {
  return run_tandem_with_input(args, "");
}

CommandResult run_tandem_with_input(const std::string& args, const std::string& input) {
  TempDir tmp;
  const std::string in = tmp.path() + "/in", out = tmp.path() + "/out", err = tmp.path() + "/err";
  std::ofstream(in, std::ios::binary) << input;
  const std::string cmd = tandem_binary() + " " + args + " >" + out + " 2>" + err + " <" + in;
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string base64(const std::string& bytes) {
  static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= uint8_t(bytes[i + 2]);
    out += A[v >> 18 & 63];
    out += A[v >> 12 & 63];
    out += i + 1 < bytes.size() ? A[v >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? A[v & 63] : '=';
  }
  return out;
}

std::string vision_fixture_dir(const std::string& family) {
  return source_dir() + "/tests/fixtures/vision/" + family;
}

std::string vision_model_dir(const std::string& family) {
  namespace fs = std::filesystem;
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<TempDir>> dirs;
  std::lock_guard<std::mutex> lock(mu);
  auto& dir = dirs[family];
  if (dir) return dir->path();
  dir = std::make_unique<TempDir>();
  for (const char* file : {"config.json", "model.safetensors"})
    fs::create_symlink(fixture_dir(family + "-f32") + "/" + file, dir->path() + "/" + file);
  for (const auto& entry : fs::directory_iterator(vision_fixture_dir(family) + "/tokenizer"))
    fs::create_symlink(entry.path(), dir->path() + "/" + entry.path().filename().string());
  if (family == "gemma4")  // the references used max_soft_tokens 70 (default 280)
    std::ofstream(dir->path() + "/preprocessor_config.json")
        << R"({"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70})";
  return dir->path();
}

TempDir::TempDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
  if (!mkdtemp(templ.data())) std::abort();
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  for (const char* isa : {"scalar", "avx2", "avx512"})
    if (cpu::set_isa_for_testing(isa)) out.push_back(isa);
  cpu::set_isa_for_testing("");
  return out;
}

uint64_t packed_affine_padding(const Model& m) {
  std::vector<const WeightMatrix*> all{&m.weights.ple_model_proj};
  for (const LayerWeights& l : m.weights.layers)
    for (const WeightMatrix* w :
         {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj})
      all.push_back(w);
  uint64_t bytes = 0;
  for (const WeightMatrix* w : all)
    if (w->format == WeightFormat::PackedAffine) {
      WeightMatrix mlx = *w;
      mlx.format = WeightFormat::Affine;
      bytes += w->nbytes() - mlx.nbytes();
    }
  return bytes;
}

GuardedCopy::GuardedCopy(const void* src, size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  span_ = (bytes + page - 1) / page * page + page;
  map_ = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw std::runtime_error("GuardedCopy: mmap failed");
  }
  auto* base = static_cast<char*>(map_);
  mprotect(base + span_ - page, page, PROT_NONE);
  data_ = base + span_ - page - bytes;
  std::memcpy(data_, src, bytes);
}

GuardedCopy::~GuardedCopy() {
  if (map_) munmap(map_, span_);
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

double stddev(const std::vector<float>& v) {
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= double(v.size());
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tandem::test
