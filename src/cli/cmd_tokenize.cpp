// tandem tokenize / tandem detokenize: line-oriented JSON filters over a
// tokenizer, for scripting and for checking tandem against other libraries.
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace tandem::cli {

namespace {

using json = nlohmann::json;

struct TokOptions {
  std::string path;
  bool no_special = false;
  bool skip_special = false;
};

constexpr const char* kErrorPolicy =
    "A line that is not valid input stops the command: it prints \"error: line N: ...\" on "
    "stderr and exits with status 1 (lines before it were already answered on stdout). "
    "Empty lines are answered too (as an empty string / empty array).";

// Answers stdin line by line: each line is parsed as JSON (an empty line as
// `empty`), handed to `answer` with its line number, and the JSON it returns
// is written as one line. Errors stop the command (see kErrorPolicy).
void for_each_json_line(const char* empty, const std::function<json(const json&, size_t)>& answer) {
  std::string line;
  size_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    json in;
    try {
      in = json::parse(line.empty() ? std::string(empty) : line);
    } catch (const json::exception& e) {
      fail("line %zu: not JSON: %s", n, e.what());
    }
    const std::string out = answer(in, n).dump(-1, ' ', false, json::error_handler_t::replace);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
}

int run_tokenize(const TokOptions& o) {
  text::Tokenizer tok = text::Tokenizer::load(o.path);
  for_each_json_line("\"\"", [&](const json& in, size_t n) {
    if (!in.is_string()) fail("line %zu: expected a JSON string, got %s", n, in.type_name());
    return json(tok.encode(in.get_ref<const std::string&>(), !o.no_special));
  });
  return 0;
}

int run_detokenize(const TokOptions& o) {
  text::Tokenizer tok = text::Tokenizer::load(o.path);
  for_each_json_line("[]", [&](const json& in, size_t n) {
    if (!in.is_array()) fail("line %zu: expected a JSON array of ids, got %s", n, in.type_name());
    std::vector<int32_t> ids;
    ids.reserve(in.size());
    for (const json& v : in) {
      if (!v.is_number_integer())
        fail("line %zu: expected integer ids, got %s", n, v.dump().c_str());
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= tok.vocab_size())
        fail("line %zu: id %lld is outside the vocabulary [0, %d)", n, static_cast<long long>(id),
             tok.vocab_size());
      ids.push_back(static_cast<int32_t>(id));
    }
    return json(tok.decode(ids, o.skip_special));
  });
  return 0;
}

}  // namespace

Runner add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize", "Read one JSON string per line on stdin, write its token ids as a JSON array");
  cmd->add_option("path", o->path,
                  "Model folder, tokenizer.json or tekken.json (tokenizer_config.json beside it "
                  "is read too)")
      ->required();
  cmd->add_flag("--no-special", o->no_special,
                "Do not add the BOS/EOS the tokenizer's configuration adds (transformers' "
                "add_special_tokens=False); special tokens written in the text still count");
  cmd->footer(kErrorPolicy);
  return [o] { return run_tokenize(*o); };
}

Runner add_detokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokOptions>();
  auto* cmd = app.add_subcommand(
      "detokenize",
      "Read one JSON array of ids per line on stdin, write the text as a JSON string");
  cmd->add_option("path", o->path, "Model folder, tokenizer.json or tekken.json")->required();
  cmd->add_flag("--skip-special", o->skip_special, "Leave special tokens out of the text");
  cmd->footer(kErrorPolicy);
  return [o] { return run_detokenize(*o); };
}

}  // namespace tandem::cli
