// A model folder's tokenizer and chat template, serving the engine (ids ->
// text, incrementally) and the HTTP layer (request content -> prompt ids).
//
// Chat prompts are rendered with the model's own template and tokenized
// without adding special tokens again (the template writes BOS itself), as
// transformers' apply_chat_template(tokenize=True) does.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/text_streamer.h"
#include "server/prompt_builder.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tandem::server {

class ModelText : public TextStreamer, public PromptBuilder {
 public:
  // The tokenizer of `dir` (tokenizer.json or tekken.json) and its chat
  // template if it has one; nullptr when the folder has no tokenizer.
  // Throws Error for a tokenizer or template file that is broken.
  static std::unique_ptr<ModelText> load(const std::string& dir);

  std::vector<int32_t> chat_prompt(const nlohmann::json& messages, const nlohmann::json& tools,
                                   const nlohmann::json& template_kwargs,
                                   const ChatImages* images = nullptr) override;
  std::vector<int32_t> text_prompt(const std::string& text) override;
  std::string token_text(int32_t id) override;
  // Streams decode with special tokens skipped (they are not answer text).
  std::unique_ptr<TextStream> start() const override;

  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  bool has_chat_template() const { return chat_.has_value(); }

 private:
  explicit ModelText(text::Tokenizer tok) : tokenizer_(std::move(tok)) {}
  text::Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_;
};

}  // namespace tandem::server
