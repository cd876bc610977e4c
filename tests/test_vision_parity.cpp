// Image prompts against transformers: the tiny Gemma 3, Gemma 4 and Mistral 3
// checkpoints' logits for a text-only prompt, one image and two images
// (tests/fixtures/vision/<family>/reference.json, from
// tools/fixtures/make_vision_fixtures.py), through `tandem logits --image`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

using nlohmann::json;
using namespace tandem::test;

namespace {

// `model_dir`: the checkpoint folder when it is not fixture_dir(checkpoint).
void check_family(const std::string& family, const std::string& checkpoint,
                  const std::string& model_dir = "") {
  std::ifstream f(source_dir() + "/tests/fixtures/vision/" + family + "/reference.json");
  json ref = json::parse(f);
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const json& c : ref["cases"]) {
    std::string args =
        "logits " + (model_dir.empty() ? fixture_dir(checkpoint) : model_dir) + " --all --ids ";
    for (size_t i = 0; i < c["ids"].size(); ++i)
      args += (i ? "," : "") + std::to_string(c["ids"][i].get<int>());
    for (const json& k : c["images"])
      args += " --image " + source_dir() + "/tests/fixtures/vision/" + family + "/input_" +
              std::to_string(k.get<int>()) + ".png";
    auto r = run_tandem(args);
    ASSERT_EQ(r.exit_code, 0) << c["name"] << ": " << r.err;
    const json got = json::parse(r.out)["logits"], want = c["logits"];
    ASSERT_EQ(got.size(), want.size());
    double sum = 0, sum2 = 0, n = 0, max_abs = 0;
    for (size_t row = 0; row < want.size(); ++row)
      for (size_t v = 0; v < want[row].size(); ++v) {
        const double a = got[row][v], b = want[row][v];
        max_abs = std::max(max_abs, std::fabs(a - b));
        sum += b, sum2 += b * b, n += 1;
      }
    const double std_ref = std::sqrt(sum2 / n - (sum / n) * (sum / n));
    EXPECT_LE(max_abs, 1e-3 * std_ref) << c["name"];
    std::printf("[vision parity] %-8s %-10s max|delta| = %.2e x std(ref)\n", family.c_str(),
                c["name"].get<std::string>().c_str(), max_abs / std_ref);
  }
}

TEST(VisionParity, Gemma3ImageLogitsMatchTransformers) {
  check_family("gemma3", "gemma3-f32");
}

TEST(VisionParity, Mistral3ImageLogitsMatchTransformers) {
  check_family("mistral3", "mistral3-f32");
}

TEST(VisionParity, Gemma4ImageLogitsMatchTransformers) {
  // The reference used max_soft_tokens 70 (the processor's default is 280),
  // given as the checkpoint folder's preprocessor_config.json.
  TempDir dir;
  for (const char* file : {"config.json", "model.safetensors"})
    std::filesystem::create_symlink(fixture_dir("gemma4-f32") + "/" + file,
                                    dir.path() + "/" + file);
  std::ofstream(dir.path() + "/preprocessor_config.json")
      << R"({"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70})";
  check_family("gemma4", "gemma4-f32", dir.path());
}

TEST(VisionParity, RunWithAnImageContinuesFromTheImagePrompt) {
  // The greedy first token after a one-image prompt is the argmax of the
  // reference's last-position logits.
  std::ifstream f(source_dir() + "/tests/fixtures/vision/gemma3/reference.json");
  const json c = json::parse(f)["cases"][1];
  ASSERT_EQ(c["name"], "one_image");
  std::string ids;
  for (size_t i = 0; i < c["ids"].size(); ++i)
    ids += (i ? "," : "") + std::to_string(c["ids"][i].get<int>());
  auto r =
      run_tandem("run " + fixture_dir("gemma3-f32") + " --json --ignore-eos -n 1 --ids " + ids +
                 " --image " + source_dir() + "/tests/fixtures/vision/gemma3/input_0.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json& last = c["logits"].back();
  size_t best = 0;
  for (size_t v = 1; v < last.size(); ++v)
    if (last[v].get<double>() > last[best].get<double>()) best = v;
  EXPECT_EQ(json::parse(r.out)["ids"][0].get<size_t>(), best);
}

TEST(VisionParity, PlaceholderCountsMustMatchTheImages) {
  // Two placeholder runs (id 319) but one image.
  auto r = run_tandem("logits " + fixture_dir("gemma3-f32") + " --ids 2,319,5,319,6 --image " +
                      source_dir() + "/tests/fixtures/vision/gemma3/input_0.png");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("2 image placeholders (id 319) but its 1 images need 1"), std::string::npos)
      << r.err;
  // Images on a model without a vision tower.
  r = run_tandem("logits " + fixture_dir("llama-f32") + " --ids 2,3 --image " + source_dir() +
                 "/tests/fixtures/vision/gemma3/input_0.png");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config.json has no vision_config"), std::string::npos) << r.err;
}

}  // namespace

namespace {

// The greedy token after the fixture's one-image chat (prompts.json).
int32_t reference_next_token(const std::string& family) {
  std::ifstream f(vision_fixture_dir(family) + "/prompts.json");
  const json c = json::parse(f)["cases"][1];
  const std::vector<double> last = c["logits_last"].get<std::vector<double>>();
  return int32_t(std::max_element(last.begin(), last.end()) - last.begin());
}

class RunChatImage : public testing::TestWithParam<const char*> {};

TEST_P(RunChatImage, ContinuesAsTransformersAfterTheProcessorsPrompt) {
  // `tandem run --chat --image` builds the prompt as the server does; its
  // first greedy token is transformers' argmax after the processor's prompt.
  const std::string family = GetParam();
  auto r = run_tandem("run " + vision_model_dir(family) +
                      " --chat --json -n 1 --ignore-eos --prompt 'What is in the picture?'" +
                      " --image " + vision_fixture_dir(family) + "/input_0.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["ids"][0].get<int32_t>(), reference_next_token(family));
}

INSTANTIATE_TEST_SUITE_P(Families, RunChatImage, testing::Values("gemma3", "gemma4"));

TEST(RunChatImage, APlainPromptNeedsOneMarkerPerImage) {
  const std::string image = " --image " + vision_fixture_dir("gemma3") + "/input_0.png";
  auto r = run_tandem("run " + vision_model_dir("gemma3") + " -n 1 --prompt 'No marker'" + image);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("holds 0 image markers (<start_of_image>) for 1 images"), std::string::npos)
      << r.err;
  r = run_tandem("run " + vision_model_dir("gemma3") +
                 " -n 1 --json --prompt 'Look: <start_of_image>'" + image);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
