// Helpers shared by the tests: paths, running the tandem binary, temp dirs.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tandem {
struct Model;
}

namespace tandem::test {

// Repository root and the built `tandem` binary (compile-time paths).
std::string source_dir();
std::string tandem_binary();
std::string fixture_dir(const std::string& name);  // tests/fixtures/parity/<name>

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `tandem <args>` (args are shell-quoted by the caller), stdin empty.
CommandResult run_tandem(const std::string& args);
// The same with `input` on its stdin.
CommandResult run_tandem_with_input(const std::string& args, const std::string& input);

// gtest parameter names for fixture names ("llama-f32" -> "llama_f32").
std::string fixture_param_name(const std::string& fixture);

// A runnable multimodal model folder for `family` (gemma3, gemma4, mistral3):
// the tiny parity checkpoint plus the small tokenizer and chat template of
// tests/fixtures/vision/<family>/tokenizer (and, for Gemma 4, the processor
// settings the references used). Made once per test process.
std::string vision_model_dir(const std::string& family);
// tests/fixtures/vision/<family>
std::string vision_fixture_dir(const std::string& family);

// A file's bytes ("" when it cannot be read), and standard base64 (padded).
std::string file_bytes(const std::string& path);
std::string base64(const std::string& bytes);

// The CPU ISA paths this processor can run (cpu::set_isa_for_testing's
// names: scalar, avx2, avx512), the run-time choice left as it was.
std::vector<std::string> supported_isas();

// n floats drawn uniformly from [-1, 1) with rng.
std::vector<float> random_floats(size_t n, std::mt19937& rng);

// Standard deviation of the values, the largest |a[i] - b[i]|, and the
// message of the tandem::Error that fn throws ("" when it throws none).
double stddev(const std::vector<float>& v);
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
std::string error_of(const std::function<void()>& fn);

// Bytes the PackedAffine matrices of `m` hold beyond the same codes in MLX's
// row layout (their rows padded to a multiple of 16): what packing adds to
// Model::owned_bytes when it keeps no other copy.
uint64_t packed_affine_padding(const Model& m);

// A copy of `bytes` bytes of src that ends where an inaccessible page
// begins, so a read past its end faults (kernels' bounds tests).
class GuardedCopy {
 public:
  GuardedCopy(const void* src, size_t bytes);
  ~GuardedCopy();
  GuardedCopy(const GuardedCopy&) = delete;
  GuardedCopy& operator=(const GuardedCopy&) = delete;
  void* data() const { return data_; }

 private:
  void* map_ = nullptr;
  size_t span_ = 0;
  void* data_ = nullptr;
};

// A fresh temporary directory, removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::test
