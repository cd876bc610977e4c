// `tandem template PATH`: JSON lines in, one {"prompt"} or {"error"} line out.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "test_util.h"
#include "text/chat_template.h"

namespace tandem {
namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> run_cli(const std::string& path, const std::string& input,
                                    int* exit_code) {
  test::TempDir tmp;
  const std::string in = tmp.path() + "/in.jsonl", out = tmp.path() + "/out.jsonl";
  std::ofstream(in) << input;
  const std::string cmd = test::tandem_binary() + " template '" + path + "' <" + in + " >" + out +
                          " 2>" + tmp.path() + "/err";
  const int status = std::system(cmd.c_str());
  *exit_code = WEXITSTATUS(status);
  std::vector<nlohmann::json> lines;
  std::istringstream ss(slurp(out));
  for (std::string line; std::getline(ss, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(ChatTemplateCli, RendersEachLineAndReportsErrorsPerLine) {
  const std::string dir = test::source_dir() + "/tests/fixtures/templates/llama3_2";
  const std::string input =
      R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true, "kwargs": {"date_string": "01 Jan 2025"}})"
      "\n"
      "not json\n"
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}, {"function": {"name": "g", "arguments": {}}}]}], "tools": []})"
      "\n";
  int rc = -1;
  auto lines = run_cli(dir, input, &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(lines.size(), 3u);
  ASSERT_TRUE(lines[0].contains("prompt")) << lines[0].dump();
  EXPECT_EQ(lines[0]["prompt"],
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|><|start_header_id|>user<|"
            "end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  ASSERT_TRUE(lines[1].contains("error"));
  ASSERT_TRUE(lines[2].contains("error"));
  EXPECT_NE(lines[2]["error"].get<std::string>().find("only supports single tool-calls"),
            std::string::npos)
      << lines[2].dump();
}

TEST(ChatTemplateCli, AcceptsATemplateFile) {
  test::TempDir tmp;
  const std::string file = tmp.path() + "/t.jinja";
  std::ofstream(file)
      << "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}";
  int rc = -1;
  auto lines = run_cli(file,
                       R"({"messages": [{"role": "user", "content": "x"}]})"
                       "\n",
                       &rc);
  EXPECT_EQ(rc, 0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["prompt"], "[user]x");
}

TEST(ChatTemplateLoad, FolderFormsAndSelection) {
  test::TempDir tmp;
  std::ofstream(tmp.path() + "/tokenizer_config.json") << R"({
    "bos_token": {"content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "chat_template": [
      {"name": "default", "template": "D{{ bos_token }}{{ eos_token }}"},
      {"name": "tool_use", "template": "T{{ tools | length }}"}
    ]})";
  ChatTemplate t = ChatTemplate::from_folder(tmp.path());
  using json = nlohmann::ordered_json;
  json msgs = json::array();
  EXPECT_EQ(t.render(msgs, json(), false, json()), "D<s></s>");
  EXPECT_EQ(t.render(msgs, json::array({json::object()}), false, json()), "T1");
  // Keyword arguments override special tokens, like transformers' kwargs.
  EXPECT_EQ(t.render(msgs, json(), false, json{{"bos_token", "B"}}), "DB</s>");
  EXPECT_THROW(t.render(msgs, json(), false, json{{"messages", 1}}), tandem::Error);

  // chat_template.jinja overrides tokenizer_config.json's default.
  std::ofstream(tmp.path() + "/chat_template.jinja") << "J{{ add_generation_prompt }}";
  ChatTemplate j = ChatTemplate::from_folder(tmp.path());
  EXPECT_EQ(j.render(msgs, json(), true, json()), "JTrue");

  // A template with a syntax error loads; rendering reports it.
  test::TempDir bad;
  std::ofstream(bad.path() + "/chat_template.jinja") << "{% if %}";
  ChatTemplate b = ChatTemplate::from_folder(bad.path());
  EXPECT_THROW(b.render(msgs, json(), true, json()), tandem::Error);

  test::TempDir empty;
  EXPECT_THROW(ChatTemplate::from_folder(empty.path()), tandem::Error);
}

}  // namespace
}  // namespace tandem
