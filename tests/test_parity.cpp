// Logit parity against transformers: every fixture under tests/fixtures/parity
// (made by tools/fixtures/make_parity_fixtures.py) through the real CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/kernels.h"
#include "test_util.h"

using nlohmann::json;
using namespace tandem::test;

namespace {

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

std::string join_ids(const json& ids) {
  std::string s;
  for (const auto& id : ids) s += (s.empty() ? "" : ",") + std::to_string(id.get<int>());
  return s;
}

struct Diff {
  double max_abs = 0.0;
  double ref_std = 0.0;
};

Diff compare(const json& got, const json& ref) {
  double sum = 0, sum2 = 0, n = 0;
  Diff d;
  for (size_t r = 0; r < ref.size(); ++r)
    for (size_t c = 0; c < ref[r].size(); ++c) {
      double a = got[r][c].get<double>(), b = ref[r][c].get<double>();
      d.max_abs = std::max(d.max_abs, std::fabs(a - b));
      if (std::isnan(a)) d.max_abs = INFINITY;
      sum += b;
      sum2 += b * b;
      n += 1;
    }
  d.ref_std = std::sqrt(sum2 / n - (sum / n) * (sum / n));
  return d;
}

class Parity : public testing::TestWithParam<std::string> {};

// Sets an environment variable for the tandem processes a test starts.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

// The exact lane (--gemm-precision f32): every product in f32. BF16 layers
// run packed for the CPU's outer-product kernels where the processor has
// them (cpu::packed_weights_preferred), as a user's would.
TEST_P(Parity, AllPositionLogitsMatchTransformers) {
  const std::string dir = fixture_dir(GetParam());
  json ref = read_json(dir + "/reference.json");
  auto r =
      run_tandem("logits " + dir + " --all --gemm-precision f32 --ids " + join_ids(ref["ids"]));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const bool bf16 = ref["dtype"].get<std::string>() == "bf16";
  if (bf16 && tandem::cpu::packed_weights_preferred()) {
    EXPECT_NE(r.err.find("packed for the CPU kernels"), std::string::npos) << r.err;
  }
  json got = json::parse(r.out)["logits"];
  ASSERT_EQ(got.size(), ref["logits"].size());
  ASSERT_EQ(got[0].size(), ref["logits"][0].size());
  Diff d = compare(got, ref["logits"]);
  // The reference is float64 over the checkpoint's exact weights; tandem
  // computes in f32, so the only difference is f32 rounding.
  EXPECT_LE(d.max_abs, 1e-3 * d.ref_std)
      << "max |delta| " << d.max_abs << ", std(ref) " << d.ref_std;
  std::printf("[parity] %-18s max|delta| = %.2e = %.2e x std(ref)\n", GetParam().c_str(), d.max_abs,
              d.max_abs / d.ref_std);
  if (ref.contains("logits_native")) {
    // transformers running natively in bf16/f16 rounds every activation; its
    // distance from the exact (float64) logits is that path's own noise
    // (measured up to 1.9 x std(ref) on the tiny random Gemma 4, whose layer
    // scalars amplify rounding). tandem computes in f32, so it must sit where
    // the exact answer sits: no farther from the native logits than the exact
    // ones are.
    Diff n = compare(got, ref["logits_native"]);
    Diff exact = compare(ref["logits"], ref["logits_native"]);
    std::printf(
        "[parity] %-18s vs transformers native %s: max|delta| = %.3f = %.3f x std(ref) (exact vs "
        "native: %.3f)\n",
        GetParam().c_str(), ref["dtype"].get<std::string>().c_str(), n.max_abs,
        n.max_abs / n.ref_std, exact.max_abs);
    EXPECT_LE(n.max_abs, exact.max_abs + 1e-3 * d.ref_std);
  }
}

// The default lane (--gemm-precision bf16): the matmuls of the all-position
// prefill step over bf16 weights round their inputs to bf16 (f32 and f16
// weights are untouched: exact as above). Rounding only those inputs must
// move the logits less than transformers' own bf16 run moves them, which
// rounds every activation: measured 2.3-5.6e-2 x std(ref) against 5-30e-2
// for that run on the 1B-class fixtures, 0.35-0.63 against 0.8-1.9 on the
// tiny random Gemma 4s, whose layer scalars amplify rounding.
TEST_P(Parity, AllPositionLogitsWithBf16MatmulInputsStayWithinBf16Noise) {
  const std::string dir = fixture_dir(GetParam());
  json ref = read_json(dir + "/reference.json");
  auto r = run_tandem("logits " + dir + " --all --ids " + join_ids(ref["ids"]));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json got = json::parse(r.out)["logits"];
  ASSERT_EQ(got.size(), ref["logits"].size());
  Diff d = compare(got, ref["logits"]);
  double bound = 1e-3 * d.ref_std;  // f32 / f16 weights: nothing is rounded
  if (ref.contains("logits_native")) bound = compare(ref["logits"], ref["logits_native"]).max_abs;
  EXPECT_LE(d.max_abs, bound) << "max |delta| " << d.max_abs << ", std(ref) " << d.ref_std;
  std::printf("[parity] %-18s bf16 matmul inputs: max|delta| = %.2e x std(ref) (bound %.2e)\n",
              GetParam().c_str(), d.max_abs / d.ref_std, bound / d.ref_std);
}

// The exact lane with every weight as stored (TANDEM_CPU_REPACK=0: the
// dot-product kernels over row-major weights), the path of processors
// without AVX-512 BF16.
TEST_P(Parity, AllPositionLogitsMatchTransformersWithWeightsAsStored) {
  const std::string dir = fixture_dir(GetParam());
  json ref = read_json(dir + "/reference.json");
  ScopedEnv no_repack("TANDEM_CPU_REPACK", "0");
  auto r =
      run_tandem("logits " + dir + " --all --gemm-precision f32 --ids " + join_ids(ref["ids"]));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("packed for the CPU kernels"), std::string::npos) << r.err;
  Diff d = compare(json::parse(r.out)["logits"], ref["logits"]);
  EXPECT_LE(d.max_abs, 1e-3 * d.ref_std)
      << "max |delta| " << d.max_abs << ", std(ref) " << d.ref_std;
}

// Greedy decoding on the exact lane.
TEST_P(Parity, GreedyContinuationMatchesTransformers) {
  const std::string dir = fixture_dir(GetParam());
  json ref = read_json(dir + "/reference.json");
  const int n = int(ref["greedy"].size());
  auto r = run_tandem("run " + dir + " --json --ignore-eos -n " + std::to_string(n) +
                      " --gemm-precision f32 --ids " + join_ids(ref["prompt"]));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ids"], ref["greedy"]);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, Parity,
    testing::Values("llama-f32", "llama-bf16", "qwen2-f32", "qwen2-bf16", "qwen3-f32", "qwen3-bf16",
                    "qwen3-f16", "gemma3_text-f32", "gemma3_text-bf16", "gemma3-f32", "gemma3-bf16",
                    "gemma4_text-f32", "gemma4_text-bf16", "gemma4-f32", "gemma4-bf16",
                    "ministral3-f32", "ministral3-bf16", "mistral3-f32", "mistral3-bf16"),
    [](const auto& info) { return tandem::test::fixture_param_name(info.param); });

}  // namespace
