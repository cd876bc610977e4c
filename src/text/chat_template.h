// A model's chat template, rendered byte-exactly as transformers'
// tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
// tokenize=False, **kwargs) renders it.
//
// Loading follows transformers: `chat_template` in tokenizer_config.json (a
// string, or a list of {name, template}), overridden by chat_template.jinja
// (or chat_template.json) in the same folder, plus additional_chat_templates/.
// The special tokens of tokenizer_config.json (bos_token, eos_token, ...; a
// string or an {"content": ...} object) are passed to the template as strings.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja/template.h"

namespace tandem {

class ChatTemplate {
 public:
  // Throws tandem::Error when the folder has no chat template. A template
  // with a syntax error loads; render() then throws its error.
  static ChatTemplate from_folder(const std::string& dir);
  // One template ("default") with the given special tokens.
  static ChatTemplate from_string(const std::string& source,
                                  std::map<std::string, std::string> special_tokens = {});

  // messages: array; tools: null or array; extra_kwargs: null or object (its
  // keys become template variables, overriding special tokens). Throws
  // jinja::TemplateError (a tandem::Error) with the template's message and line.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs,
                     const jinja::RenderOptions& opts = {}) const;

  // transformers' choice: "tool_use" when tools are given and it exists, else
  // "default"; a single template is always used.
  const std::string& select(bool has_tools) const;
  const std::string& source(const std::string& name) const;
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::string source;
    std::shared_ptr<jinja::Template> tpl;  // null when it failed to parse
    std::string parse_error;
  };
  void add(const std::string& name, const std::string& source);

  std::map<std::string, Entry> templates_;
  std::map<std::string, std::string> special_tokens_;
};

}  // namespace tandem
