// The CUDA sequence decoder against the CPU decoder (the oracle) on the
// parity fixtures it supports: every position's logits within 1e-4 × their
// std (both compute in f32; only summation order differs), and the greedy
// continuation equal to transformers' (reference.json "greedy").
// Gemma 4 and Ministral 3 fixtures must be refused with a clear error until
// their features are on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/runtime.h"
#include "backend/cuda/sequence_decoder.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/decoder.h"
#include "model/kv_pool.h"

using namespace tandem;

namespace {

// The checkout's fixtures: $TANDEM_SOURCE_DIR when set (a build carried to
// another machine), else the source folder the build came from.
std::string fixture(const std::string& name) {
  const char* env = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(env ? env : TANDEM_SOURCE_DIR) + "/tests/fixtures/parity/" + name;
}

class CudaDecoder : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

TEST_P(CudaDecoder, LogitsMatchTheCpuDecoderAndGreedyMatchesTransformers) {
  const std::string dir = fixture(GetParam());
  auto model = load_model(dir);
  std::ifstream f(dir + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<int32_t> prompt = ref["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["greedy"].get<std::vector<int32_t>>();
  const int64_t n = int64_t(prompt.size()), V = model->spec.vocab;

  ThreadPool pool(2);
  KvPool kv_pool = single_sequence_pool(model->spec, n + 32, Decoder::kDefaultStepTokens);
  Decoder cpu(*model, pool, kv_pool);
  SequenceKv kv;
  std::vector<float> want(size_t(n * V));
  run_sequence(cpu, prompt.data(), n, kv, want.data(), true);

  cuda::SequenceDecoder gpu(*model, n + 32);
  std::vector<float> got(size_t(n * V));
  gpu.feed(prompt.data(), n, got.data(), true);
  double sum = 0, sum2 = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    sum += want[i];
    sum2 += double(want[i]) * want[i];
    max_abs = std::max(max_abs, std::fabs(double(got[i]) - want[i]));
  }
  const double std_ref =
      std::sqrt(sum2 / double(want.size()) - std::pow(sum / double(want.size()), 2));
  EXPECT_LE(max_abs, 1e-4 * std_ref) << GetParam();
  std::printf("[cuda decoder] %-18s max|gpu - cpu| = %.2e x std\n", GetParam(), max_abs / std_ref);

  // Greedy decode one token at a time from the last prompt logits.
  std::vector<float> last(got.end() - V, got.end());
  std::vector<int32_t> out;
  for (size_t i = 0; i < greedy.size(); ++i) {
    const int32_t id = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(id);
    if (i + 1 < greedy.size()) gpu.feed(&id, 1, last.data(), false);
  }
  EXPECT_EQ(out, greedy) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecoder,
                         testing::Values("llama-f32", "llama-bf16", "qwen2-f32", "qwen2-bf16",
                                         "qwen3-f32", "qwen3-bf16", "qwen3-f16", "gemma3_text-f32",
                                         "gemma3_text-bf16", "gemma3-bf16"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(CudaDecoderRefuses, FeaturesNotOnCudaYetAreNamed) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  auto gemma4 = load_model(fixture("gemma4_text-f32"));
  try {
    cuda::SequenceDecoder d(*gemma4, 64);
    FAIL() << "Gemma 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not on CUDA yet"), std::string::npos) << e.what();
  }
}

}  // namespace
