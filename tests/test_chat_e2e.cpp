// The whole text path with a real tokenizer and chat template: request ->
// template -> tokenizer -> engine -> incremental detokenizer -> stop strings
// -> HTTP. The model is a tiny random Qwen3 with Qwen3's real 151,936-token
// vocabulary (made with `tandem synth`), so its words are noise; what is
// checked is that every layer agrees with every other (the text is exactly
// the tokenizer's decode of the ids, stream equals non-stream, prompts are
// the template's rendering), not what the model says.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/engine.h"
#include "server/errors.h"
#include "server/model_text.h"
#include "server/server.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using nlohmann::json;

namespace {

std::string tokenizer_cache(const std::string& name) {
  const char* cache = std::getenv("TANDEM_CACHE");
  const char* home = std::getenv("HOME");
  std::string base = cache ? cache : std::string(home ? home : "/root") + "/.cache/tandem";
  return base + "/tokenizers/" + name;
}

// One tiny Qwen3 with the real tokenizer, shared by the suite.
class ChatE2E : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok = tokenizer_cache("qwen3");
    if (!std::filesystem::exists(tok + "/tokenizer.json")) return;
    dir_ = new test::TempDir();
    const std::string cfg = dir_->path() + "/config.json";
    std::ofstream(cfg) << R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 32,
      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
      "intermediate_size": 64, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
      "tie_word_embeddings": true, "eos_token_id": 151645, "rope_theta": 1000000.0})";
    const std::string model = dir_->path() + "/model";
    auto r = test::run_tandem("synth " + cfg + " " + model + " --dtype bf16 --seed 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(tok + "/" + f, model + "/" + f);
    model_ = load_model(model).release();
    text_ = server::ModelText::load(model).release();
    EngineConfig ec;
    ec.threads = 2;
    engine_ = new Engine(*model_, ec, text_);
    server::ServerOptions so;
    so.port = 0;
    so.served_model_name = "tiny-qwen3";
    server_ = new server::Server(so);
    server_->bind();
    server_->start();
    server_->attach(engine_, text_);
  }
  static void TearDownTestSuite() {
    if (server_) server_->stop();
    delete server_;
    delete engine_;
    delete text_;
    delete model_;
    delete dir_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (!server_)
      GTEST_SKIP() << "the Qwen3 tokenizer is not cached; run: bash scripts/fetch_tokenizers.sh";
  }
  int port() const { return server_->port(); }

  static test::TempDir* dir_;
  static Model* model_;
  static server::ModelText* text_;
  static Engine* engine_;
  static server::Server* server_;
};
test::TempDir* ChatE2E::dir_ = nullptr;
Model* ChatE2E::model_ = nullptr;
server::ModelText* ChatE2E::text_ = nullptr;
Engine* ChatE2E::engine_ = nullptr;
server::Server* ChatE2E::server_ = nullptr;

json chat_body(int max_tokens) {
  return {{"model", "tiny-qwen3"},
          {"messages",
           {{{"role", "system"}, {"content", "You are terse."}},
            {{"role", "user"}, {"content", "Hello, who are you?"}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

std::vector<int32_t> ids_of(const json& choice) {
  return choice["token_ids"].get<std::vector<int32_t>>();
}

TEST_F(ChatE2E, ChatTextIsTheTokenizersDecodeAndThePromptIsTheTemplate) {
  auto r = test::post_json(port(), "/v1/chat/completions", chat_body(24));
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  const auto ids = ids_of(choice);
  ASSERT_EQ(ids.size(), 24u);
  EXPECT_EQ(choice["message"]["content"], text_->tokenizer().decode(ids, /*skip_special=*/true));
  EXPECT_EQ(choice["finish_reason"], "length");
  // The prompt: Qwen3's template rendered, tokenized without extra specials.
  auto prompt = text_->chat_prompt(chat_body(1)["messages"], json(), json());
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompt.size());
  const std::string rendered = text_->tokenizer().decode(prompt);
  EXPECT_NE(rendered.find("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello, "
                          "who are you?<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << rendered;
}

TEST_F(ChatE2E, StreamConcatenatesToTheNonStreamedAnswer) {
  auto whole = test::post_json(port(), "/v1/chat/completions", chat_body(20));
  ASSERT_EQ(whole.status, 200) << whole.raw;
  json body = chat_body(20);
  body["stream"] = true;
  auto s = test::post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200);
  ASSERT_TRUE(s.done);
  std::string text;
  for (const auto& e : s.events)
    if (e.contains("choices") && !e["choices"].empty() &&
        e["choices"][0]["delta"].contains("content") &&
        e["choices"][0]["delta"]["content"].is_string())
      text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, whole.body["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(s.ids(), ids_of(whole.body["choices"][0]));
}

TEST_F(ChatE2E, StopStringsCutTheAnswerAndAreNotEmitted) {
  auto whole = test::post_json(port(), "/v1/chat/completions", chat_body(40));
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const std::string content = whole.body["choices"][0]["message"]["content"];
  ASSERT_GT(content.size(), 12u);
  // A stop string from the middle of the answer (three bytes that begin a
  // UTF-8 character), matched wherever it first occurs.
  size_t at = content.size() / 2;
  while (at > 0 && (uint8_t(content[at]) & 0xC0) == 0x80) --at;
  std::string stop = content.substr(at, 3);
  while (!stop.empty() && (uint8_t(stop.back()) & 0xC0) == 0x80) stop.pop_back();
  if (stop.empty()) stop = content.substr(at, 1);
  json body = chat_body(40);
  body["stop"] = stop;
  auto cut = test::post_json(port(), "/v1/chat/completions", body);
  ASSERT_EQ(cut.status, 200) << cut.raw;
  EXPECT_EQ(cut.body["choices"][0]["message"]["content"], content.substr(0, content.find(stop)));
  EXPECT_EQ(cut.body["choices"][0]["finish_reason"], "stop");
}

TEST_F(ChatE2E, CompletionsTokenizeTextPromptsWithTheTokenizersSpecials) {
  json body = {{"prompt", "The capital of France is"},
               {"max_tokens", 8},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto r = test::post_json(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["prompt_tokens"],
            text_->tokenizer().encode("The capital of France is").size());
  EXPECT_EQ(r.body["choices"][0]["text"],
            text_->tokenizer().decode(ids_of(r.body["choices"][0]), true));
}

TEST_F(ChatE2E, LogprobsNameTokensByTheirText) {
  json body = chat_body(6);
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  auto r = test::post_json(port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  const auto ids = ids_of(choice);
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(content[i]["token"], text_->tokenizer().decode({ids[i]})) << i;
    EXPECT_EQ(content[i]["top_logprobs"].size(), 2u);
    EXPECT_LE(content[i]["logprob"].get<double>(), 0.0);
  }
}

TEST_F(ChatE2E, TemplateKwargsReachTheTemplate) {
  json on = chat_body(1), off = chat_body(1);
  off["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto a = test::post_json(port(), "/v1/chat/completions", on);
  auto b = test::post_json(port(), "/v1/chat/completions", off);
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  // Qwen3 with thinking off appends an empty <think></think> block.
  EXPECT_GT(b.body["usage"]["prompt_tokens"].get<int>(),
            a.body["usage"]["prompt_tokens"].get<int>());
}

TEST_F(ChatE2E, TemplateErrorsAre400sWithTheTemplatesMessage) {
  // Gemma 3's template raises for roles that do not alternate.
  const std::string gemma = tokenizer_cache("gemma3");
  if (!std::filesystem::exists(gemma + "/tokenizer.json"))
    GTEST_SKIP() << "the Gemma 3 tokenizer is not cached; run: bash scripts/fetch_tokenizers.sh";
  auto text = server::ModelText::load(gemma);
  ASSERT_TRUE(text && text->has_chat_template());
  json messages = {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}};
  try {
    text->chat_prompt(messages, json(), json());
    FAIL() << "rendered";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos)
        << e.what();
  }
  // A valid conversation renders Gemma's turn markers, BOS first.
  auto ids = text->chat_prompt({{{"role", "user"}, {"content", "Hi"}}}, json(), json());
  EXPECT_EQ(text->tokenizer().decode(ids),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}

TEST_F(ChatE2E, RunWithATextPromptPrintsText) {
  const std::string model = dir_->path() + "/model";
  auto r = test::run_tandem("run " + model + " --prompt 'Hello there' -n 6 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["ids"].size(), 6u);
  EXPECT_EQ(j["text"], text_->tokenizer().decode(j["ids"].get<std::vector<int32_t>>(), true));
}

}  // namespace
