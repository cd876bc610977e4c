// The model catalog: validation of catalog/aliases.json, the resolution order
// of a MODEL argument (folder, retired alias, alias, org/name[@rev], unknown),
// `tandem models`, `tandem info` and the user's aliases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "catalog/catalog.h"
#include "catalog/resolve.h"
#include "core/error.h"
#include "test_hub_util.h"

using namespace tandem;
using namespace tandem::test;
using catalog::Catalog;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A valid live entry; tests break one field at a time.
json live_entry() {
  return json::parse(R"({
    "repo": "org/model", "revision": "main", "family": "llama", "modalities": ["text"],
    "format": "safetensors", "quantization": "bf16", "size_bytes": 1000,
    "context_length": 4096, "sampling": {"temperature": 0.7, "top_k": 40},
    "reasoning_parser": null, "tool_call_parser": "llama3_json"})");
}

std::string doc(const json& aliases) {
  return json{{"version", 1}, {"aliases", aliases}}.dump();
}

// The error message Catalog::parse throws, or "" when it parses.
std::string parse_error(const std::string& text) {
  try {
    Catalog::parse(text, "test.json");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(Catalog, BuiltinHasEveryRequiredAlias) {
  const Catalog& c = Catalog::builtin();
  for (const char* name : {"gemma-3-1b", "gemma-3-4b", "gemma-4-e2b", "ministral-3-3b",
                           "qwen3-1.7b", "qwen3-4b", "llama-3.2-1b", "llama-3.2-3b"}) {
    const catalog::Entry* bf16 = c.find(name);
    ASSERT_NE(bf16, nullptr) << name;
    EXPECT_FALSE(bf16->is_retired()) << name;
    EXPECT_EQ(bf16->quantization, "bf16") << name;
    EXPECT_TRUE(catalog::unsupported_reason(*bf16).empty()) << name;
    const catalog::Entry* q4 = c.find(std::string(name) + "-4bit");
    ASSERT_NE(q4, nullptr) << name;
    EXPECT_EQ(q4->format, "mlx") << name;
    EXPECT_EQ(q4->repo.rfind("mlx-community/", 0), 0u) << q4->repo;
    EXPECT_EQ(q4->family, bf16->family) << name;
    EXPECT_TRUE(catalog::unsupported_reason(*q4).empty()) << name;
  }
  EXPECT_EQ(c.find("gemma-4-e2b-4bit")->repo, "mlx-community/gemma-4-e2b-it-4bit");
  EXPECT_EQ(c.find("ministral-3-3b-4bit")->repo, "mlx-community/Ministral-3-3B-Instruct-2512-4bit");
  EXPECT_TRUE(c.find("gemma-4-e2b")->has_vision());
  EXPECT_EQ(c.find("qwen3-4b")->reasoning_parser, "qwen3");
  for (const auto& e : c.entries())
    if (!e.is_retired()) {
      EXPECT_GT(e.size_bytes, 100'000'000u) << e.name;
      EXPECT_GT(e.context_length, 0) << e.name;
    }
}

TEST(Catalog, ValidEntriesParse) {
  json aliases = {{"m", live_entry()},
                  {"old", {{"retired", "broken checkpoint"}, {"replacement", "m"}}}};
  const Catalog c = Catalog::parse(doc(aliases), "test.json");
  ASSERT_EQ(c.entries().size(), 2u);
  EXPECT_EQ(c.find("m")->sampling.top_k, 40);
  EXPECT_FALSE(c.find("m")->sampling.top_p.has_value());
  EXPECT_EQ(c.find("m")->tool_call_parser, "llama3_json");
  EXPECT_TRUE(c.find("old")->is_retired());
  EXPECT_EQ(c.find("nope"), nullptr);
}

TEST(Catalog, UnknownKeysAreErrors) {
  json e = live_entry();
  e["sise_bytes"] = 3;
  EXPECT_NE(parse_error(doc({{"m", e}}))
                .find("test.json: alias \"m\": unknown key \"sise_bytes\" (known keys:"),
            std::string::npos)
      << parse_error(doc({{"m", e}}));
  e = live_entry();
  e["sampling"]["temprature"] = 1;
  EXPECT_NE(parse_error(doc({{"m", e}})).find("field \"sampling\": unknown key \"temprature\""),
            std::string::npos)
      << parse_error(doc({{"m", e}}));
  EXPECT_NE(parse_error(R"({"version": 1, "aliases": {"m": )" + live_entry().dump() +
                        R"(}, "extra": true})")
                .find("test.json: unknown key \"extra\""),
            std::string::npos);
}

TEST(Catalog, MissingFieldsAreErrors) {
  for (const char* field :
       {"repo", "revision", "family", "modalities", "format", "quantization", "size_bytes",
        "context_length", "sampling", "reasoning_parser", "tool_call_parser"}) {
    json e = live_entry();
    e.erase(field);
    EXPECT_EQ(parse_error(doc({{"m", e}})),
              std::string("test.json: alias \"m\": missing required field \"") + field + "\"")
        << field;
  }
  EXPECT_NE(parse_error(R"({"version": 1})").find("missing required field \"aliases\""),
            std::string::npos);
}

TEST(Catalog, BadTypesAndValuesAreErrors) {
  struct Case {
    const char* field;
    json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"size_bytes", "1 GB", "field \"size_bytes\" must be a positive integer, got a string"},
      {"size_bytes", -5, "field \"size_bytes\" must be a positive integer, got an integer"},
      {"context_length", 1.5, "field \"context_length\" must be a positive integer, got a number"},
      {"modalities", "text", "field \"modalities\" must be a non-empty array of strings"},
      {"modalities", json::array({"text", "audio"}), "each must be \"text\" or \"vision\""},
      {"modalities", json::array({"vision"}), "must include \"text\""},
      {"format", "gguf", "field \"format\" must be \"safetensors\" or \"mlx\", got \"gguf\""},
      {"quantization", "q4_k_m", "field \"quantization\" must be one of"},
      {"repo", "just-a-name", "must be a Hugging Face repo id \"org/name\""},
      {"reasoning_parser", 3, "field \"reasoning_parser\" must be a non-empty string or null"},
      {"gated", "yes", "field \"gated\" must be true or false, got a string"},
      {"sampling", 0.7, "field \"sampling\": must be an object, got a number"},
  };
  for (const Case& c : cases) {
    json e = live_entry();
    e[c.field] = c.value;
    const std::string err = parse_error(doc({{"m", e}}));
    EXPECT_NE(err.find(c.message), std::string::npos) << c.field << ": " << err;
    EXPECT_NE(err.find("alias \"m\""), std::string::npos) << err;
  }
  json e = live_entry();
  e["sampling"]["top_p"] = 1.5;
  EXPECT_NE(parse_error(doc({{"m", e}})).find("field \"top_p\" must be in [0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(parse_error(doc({{"Bad Name", live_entry()}})).find("alias name \"Bad Name\""),
            std::string::npos);
  EXPECT_NE(parse_error(doc({{"old", {{"retired", "x"}, {"replacement", "gone"}}}}))
                .find("replacement \"gone\" is not a live alias"),
            std::string::npos);
  EXPECT_NE(parse_error("{not json").find("test.json: not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(R"({"version": 2, "aliases": {}})").find("\"version\" must be 1"),
            std::string::npos);
}

TEST(Catalog, CloseNames) {
  const std::vector<std::string> names = {"gemma-3-1b", "gemma-4-e2b", "qwen3-4b", "llama-3.2-1b"};
  EXPECT_EQ(catalog::close_names("gemma-4e2b", names).at(0), "gemma-4-e2b");
  EXPECT_EQ(catalog::close_names("gemma4", names).at(0), "gemma-4-e2b");
  EXPECT_EQ(catalog::close_names("qwen3-4B", names).at(0), "qwen3-4b");
  EXPECT_TRUE(catalog::close_names("zzzzzzzz", names).empty());
}

class Resolve : public HubTestBase {};

TEST_F(Resolve, OrderIsFolderAliasRepo) {
  // An existing folder wins even when it is named like an alias or a repo.
  const std::string cwd = fs::current_path();
  fs::create_directories(tmp_.path() + "/work/gemma-3-1b");
  fs::create_directories(tmp_.path() + "/work/org/name");
  fs::current_path(tmp_.path() + "/work");
  const auto a = catalog::resolve_name("gemma-3-1b");
  const auto b = catalog::resolve_name("org/name");
  const auto c = catalog::resolve_name("qwen3-4b");
  fs::current_path(cwd);
  EXPECT_EQ(a.source, catalog::Source::LocalPath);
  EXPECT_EQ(a.local_path, "gemma-3-1b");
  EXPECT_EQ(b.source, catalog::Source::LocalPath);
  EXPECT_EQ(c.source, catalog::Source::Alias);
  EXPECT_EQ(c.ref.repo, "Qwen/Qwen3-4B");
  EXPECT_EQ(c.ref.revision, "main");

  const auto d = catalog::resolve_name("some-org/some.model_v2@refs/pr/3");
  EXPECT_EQ(d.source, catalog::Source::Repo);
  EXPECT_EQ(d.ref.repo, "some-org/some.model_v2");
  EXPECT_EQ(d.ref.revision, "refs/pr/3");
  EXPECT_THROW(catalog::resolve_name("./missing-folder"), Error);
  EXPECT_THROW(catalog::resolve_name("a/b/c"), Error);
  EXPECT_THROW(catalog::resolve_name("org/name@"), Error);
}

TEST_F(Resolve, RetiredAliasStopsBeforeAnyNetworkUse) {
  for (const std::string cmd :
       {"serve gemma-3n-e2b --port 0", "run gemma-3n-e2b --prompt hi", "pull gemma-3n-e2b",
        "chat gemma-3n-e2b", "logits gemma-3n-e4b --ids 1"}) {
    const auto r = run_tandem(cmd);
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_NE(r.err.find("is retired: Gemma 3n"), std::string::npos) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("Use \"gemma-4-e2b\" instead"), std::string::npos) << r.err;
  }
  EXPECT_EQ(hub_.request_count(), 0u);
  const auto info = run_tandem("info gemma-3n-e2b");
  EXPECT_EQ(info.exit_code, 0);
  EXPECT_NE(info.out.find("retired"), std::string::npos) << info.out;
}

TEST_F(Resolve, UnloadableAliasStopsBeforeDownload) {
  json q3 = live_entry(), bf16 = live_entry();
  q3["format"] = "mlx";
  q3["quantization"] = "3bit";
  use_catalog(json{{"m-3bit", q3}, {"m", bf16}}.dump());
  const auto r = run_tandem("serve m-3bit --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("\"m-3bit\" cannot be loaded: its weights are MLX 3bit quantized"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("use \"m\" (bf16) instead"), std::string::npos) << r.err;
  EXPECT_EQ(hub_.request_count(), 0u);
  const auto pull = run_tandem("pull m-3bit");  // pull warns, then talks to the hub
  EXPECT_NE(pull.err.find("cannot be served yet"), std::string::npos) << pull.err;
  EXPECT_GT(hub_.request_count(), 0u);
}

TEST_F(Resolve, UnknownNamesListCloseAliases) {
  const auto r = run_tandem("serve gemma-4e2b --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown model \"gemma-4e2b\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Did you mean: gemma-4-e2b"), std::string::npos) << r.err;
  EXPECT_EQ(hub_.request_count(), 0u);
}

TEST_F(Resolve, AliasPullsItsRepo) {
  const std::string commit(40, 'a');
  hub_.add_repo("google/gemma-3-1b-it", commit,
                {{"config.json", "{}", false}, {"model.safetensors", random_bytes(5000, 9), true}});
  // Gated: without a token, refused before any network use.
  auto r = run_tandem("pull gemma-3-1b");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.err.find("is gated: accept its license at https://huggingface.co/google/gemma-3-1b-it"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(hub_.request_count(), 0u);
  env_.set("HF_TOKEN", "hf_x");
  r = run_tandem("pull gemma-3-1b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(hub_.requests().at(0).path, "/api/models/google/gemma-3-1b-it/revision/main");
  EXPECT_EQ(r.out, repo_dir("google/gemma-3-1b-it") + "/snapshots/" + commit + "\n");
}

TEST_F(Resolve, ModelsJsonListsTheCatalogFromAnyDirectory) {
  const std::string cwd = fs::current_path();
  fs::current_path(tmp_.path());
  const auto r = run_tandem("models --json");
  fs::current_path(cwd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  std::set<std::string> names;
  for (const json& m : j["models"]) names.insert(m["name"].get<std::string>());
  for (const auto& e : Catalog::builtin().entries()) EXPECT_TRUE(names.count(e.name)) << e.name;
  for (const json& m : j["models"])
    if (m["retired"].is_null()) {
      EXPECT_FALSE(m["cached"].get<bool>());
      EXPECT_TRUE(m.contains("repo"));
    }
  const auto table = run_tandem("models");
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("ALIAS"), std::string::npos);
  EXPECT_NE(table.out.find("gemma-4-e2b"), std::string::npos);
}

TEST_F(Resolve, SnapshotsFromOtherToolsAreFound) {
  const std::string commit(40, 'b');
  const std::string snap = make_cached_snapshot(
      "Qwen/Qwen3-4B", commit,
      {{"config.json", "{}", false}, {"model.safetensors", random_bytes(100, 1), true}});
  auto r = run_tandem("models --cached --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["models"].size(), 1u) << r.out;
  EXPECT_EQ(j["models"][0]["name"], "qwen3-4b");
  EXPECT_EQ(j["models"][0]["cached_path"], snap);
  r = run_tandem("info qwen3-4b");
  EXPECT_NE(r.out.find("cached:         " + snap), std::string::npos) << r.out;
  r = run_tandem("info qwen3-4b --json");
  EXPECT_EQ(json::parse(r.out)["cached_path"], snap);
  env_.set("HF_HUB_OFFLINE", "1");
  r = run_tandem("pull qwen3-4b");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, snap + "\n");
  r = run_tandem("rm -y qwen3-4b");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(repo_dir("Qwen/Qwen3-4B")));
  EXPECT_EQ(hub_.request_count(), 0u);
}

TEST_F(Resolve, UserAliases) {
  const std::string file = tmp_.path() + "/config/tandem/aliases.json";
  auto r = run_tandem("alias list");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("no user aliases"), std::string::npos) << r.out;

  r = run_tandem("alias set mine test-org/tiny@v2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem("alias set small qwen3-1.7b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(std::ifstream(file)),
            json::parse(R"({"aliases": {"mine": "test-org/tiny@v2", "small": "qwen3-1.7b"}})"));
  r = run_tandem("alias list --json");
  EXPECT_EQ(json::parse(r.out)["mine"], "test-org/tiny@v2");

  // Resolution follows the user's alias.
  const auto res = catalog::resolve_name("mine");
  EXPECT_EQ(res.source, catalog::Source::UserAlias);
  EXPECT_EQ(res.ref.repo, "test-org/tiny");
  EXPECT_EQ(res.ref.revision, "v2");
  EXPECT_EQ(catalog::resolve_name("small").ref.repo, "Qwen/Qwen3-1.7B");

  // Never shadowing built-in or retired names; bad names and targets refused.
  r = run_tandem("alias set gemma-3-1b test-org/tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is a built-in alias; user aliases cannot shadow it"), std::string::npos)
      << r.err;
  r = run_tandem("alias set gemma-3n-e2b test-org/tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("retired built-in"), std::string::npos) << r.err;
  EXPECT_EQ(run_tandem("alias set Mine test-org/tiny").exit_code, 1);
  EXPECT_EQ(run_tandem("alias set other not-a-target").exit_code, 1);
  EXPECT_EQ(run_tandem("alias set other gemma-3n-e2b").exit_code, 1);

  r = run_tandem("models");
  EXPECT_NE(r.out.find("mine"), std::string::npos) << r.out;
  r = run_tandem("alias rm mine");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_tandem("alias rm mine");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(json::parse(std::ifstream(file)),
            json::parse(R"({"aliases": {"small": "qwen3-1.7b"}})"));

  // A broken config file is an error naming it, never ignored.
  std::ofstream(file) << R"({"aliases": {"x": 3}})";
  r = run_tandem("alias list");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_EQ(hub_.request_count(), 0u);
}

TEST_F(Resolve, InfoShowsTheProfile) {
  const auto r = run_tandem("info gemma-4-e2b");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"google/gemma-4-E2B-it @ main", "text, vision", "safetensors bf16",
                        "context length: 131072", "top_k 64", "cached:         no"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const json j = json::parse(run_tandem("info llama-3.2-1b --json").out);
  EXPECT_EQ(j["repo"], "meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_EQ(j["gated"], true);
  EXPECT_EQ(j["cached"], false);
}

TEST_F(Resolve, CustomCatalogIsValidatedOnLoad) {
  use_catalog(R"({"x": {"repo": "a/b", "colour": "red"}})");
  const auto r = run_tandem("models");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("alias \"x\": unknown key \"colour\""), std::string::npos) << r.err;
}

TEST(Doctor, Reports) {
  const auto r = run_tandem("doctor");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"CPU", "kernels", "Memory", "GPU", "build", "cache", "free disk"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Chat, ScriptedConversationWithAnInProcessModel) {
  TempDir tmp;
  const std::string image = vision_fixture_dir("gemma3") + "/input_0.png";
  const auto r = run_tandem_with_input(
      "chat " + vision_model_dir("gemma3") + " --max-tokens 3 --temperature 0 --threads 1",
      "/help\n/system Answer briefly.\nHello there\n/image " + image +
          "\nWhat is in the picture?\n/image /nonexistent.png\n/clear\n/bogus\nAgain\n/exit\n"
          "never read\n");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  for (const char* s :
       {"/system TEXT", "(system prompt set)", "attached to your next message",
        "error: cannot read /nonexistent.png", "(conversation cleared)", "unknown command /bogus"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(r.out.find("error: HTTP"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("cannot reach"), std::string::npos) << r.out;
}

TEST(Chat, AModelOrAUrlNotBothAndTheDemoWhenNeither) {
  auto r = run_tandem("chat some-model --url http://127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not both"), std::string::npos) << r.err;
  // Neither: the built-in demo model answers the question on stdin.
  TempDir dir;
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  const std::string cmd = "printf 'What is the capital of Japan?\\n' | TANDEM_CACHE=" + dir.path() +
                          "/cache " + tandem_binary() + " chat >" + out + " 2>" + err;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << file_bytes(err);
  EXPECT_NE(file_bytes(err).find("built-in demo model"), std::string::npos) << file_bytes(err);
  EXPECT_EQ(file_bytes(out), "Tokyo\n");
  r = run_tandem("chat --url http://127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot reach http://127.0.0.1:1"), std::string::npos) << r.err;
}

}  // namespace
