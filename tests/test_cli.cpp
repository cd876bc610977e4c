// The CLI's contract: clear errors and non-zero exit codes, --help on every
// command, and synth -> run on a random checkpoint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace tandem::test;

TEST(Cli, HelpOnEveryCommand) {
  for (const char* cmd : {"", "run ", "logits ", "synth ", "bench "}) {
    auto r = run_tandem(std::string(cmd) + "--help");
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd << r.out;
  }
}

TEST(Cli, MissingCommandOrModelFails) {
  EXPECT_NE(run_tandem("").exit_code, 0);
  auto r = run_tandem("logits /nonexistent/model --ids 1,2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
}

TEST(Cli, BadIdsNameTheFlag) {
  auto r = run_tandem("logits " + fixture_dir("llama-f32") + " --ids 1,x,3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--ids: \"x\" is not a token id"), std::string::npos) << r.err;
  r = run_tandem("run " + fixture_dir("llama-f32") + " --ids 1,99999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("outside the vocabulary"), std::string::npos) << r.err;
}

TEST(Cli, PromptWithoutTokenizerSaysWhatToDo) {
  auto r = run_tandem("run " + fixture_dir("llama-f32") + " --prompt hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--ids"), std::string::npos) << r.err;
}

TEST(Cli, SynthWritesALoadableCheckpoint) {
  TempDir tmp;
  for (const char* arch : {"llama-f32", "gemma3-f32", "qwen2-f32", "gemma4-f32", "mistral3-f32"}) {
    const std::string out = tmp.path() + "/" + arch;
    auto r =
        run_tandem("synth " + fixture_dir(arch) + "/config.json " + out + " --dtype bf16 --seed 3");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_tandem("run " + out + " --ids 1,2,3 -n 4 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].size(), 4u) << arch;
  }
  auto r = run_tandem("synth " + fixture_dir("llama-f32") + "/config.json " + tmp.path() +
                      "/x --dtype int4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;
}

TEST(Cli, SampledRunsAreReproducibleWithASeed) {
  const std::string base = "run " + fixture_dir("qwen3-f32") +
                           " --ids 5,6,7 -n 12 --ignore-eos --json --temperature 1.5";
  auto a = run_tandem(base + " --seed 11"), b = run_tandem(base + " --seed 11");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}
