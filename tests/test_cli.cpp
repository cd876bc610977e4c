// The CLI's contract: clear errors and non-zero exit codes, --help on every
// command, and synth -> run on a random checkpoint.
#include <gtest/gtest.h>

#include <cstdio>
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

// bench's memory line adds up: peak RSS = weights + KV cache + other, each
// term non-negative (a model whose mmapped weights are partly never read
// gets the other form, with the unread amount instead of a negative rest).
TEST(Cli, BenchMemoryLineAddsUp) {
  auto r = run_tandem("bench " + fixture_dir("llama-f32") +
                      " --tokens 2 --prompt-tokens 4 --device cpu --peak-gbs 10");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("memory       ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_EQ(line.find("-"), std::string::npos) << line;
  double rss = 0, weights = 0, owned = 0, kv_mb = 0, other_mb = 0;
  if (std::sscanf(line.c_str(),
                  "memory       peak RSS %lf GB = weights %lf GB (%lf GB converted at load, the "
                  "rest mmapped) + KV cache %lf MB + %lf MB other",
                  &rss, &weights, &owned, &kv_mb, &other_mb) == 5) {
    EXPECT_NEAR(rss * 1e3, weights * 1e3 + kv_mb + other_mb, 12.0) << line;
  } else {
    double mapped = 0, unread = 0;
    ASSERT_EQ(std::sscanf(line.c_str(),
                          "memory       peak RSS %lf GB: weights %lf GB (%lf GB converted at load, "
                          "%lf GB mmapped, at least %lf GB of it never read) + KV cache %lf MB",
                          &rss, &weights, &owned, &mapped, &unread, &kv_mb),
              6)
        << line;
    EXPECT_NEAR(weights, owned + mapped, 0.011) << line;
    EXPECT_NEAR(unread * 1e3, weights * 1e3 + kv_mb - rss * 1e3, 12.0) << line;
  }
}

TEST(Cli, SampledRunsAreReproducibleWithASeed) {
  const std::string base = "run " + fixture_dir("qwen3-f32") +
                           " --ids 5,6,7 -n 12 --ignore-eos --json --temperature 1.5";
  auto a = run_tandem(base + " --seed 11"), b = run_tandem(base + " --seed 11");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}
