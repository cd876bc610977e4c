// A model folder's tokenizer and chat template, serving the engine (ids ->
// text, incrementally) and the HTTP layer (request content -> prompt ids).
//
// Chat prompts are rendered with the model's own template and tokenized
// without adding special tokens again (the template writes BOS itself), as
// transformers' apply_chat_template(tokenize=True) does. Before rendering,
// as vLLM does: an assistant tool call's `arguments` given as a JSON string
// (the OpenAI wire form) becomes the object it holds (Llama's and Gemma 4's
// templates print objects; Qwen3's takes both), that message's null content
// becomes "", and a tool message's text parts become one string.
#pragma once

#include <memory>
#include <mutex>
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
  // A GGUF checkpoint (a .gguf file, or a folder holding one: model/gguf.h)
  // takes the tokenizer.json beside it when there is one (its chat template
  // files too, else the GGUF's), else the GGUF metadata's tokenizer and
  // tokenizer.chat_template (model/gguf_tokenizer.h).
  static std::unique_ptr<ModelText> load(const std::string& dir);

  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& tools,
                                   const nlohmann::ordered_json& template_kwargs,
                                   const ChatImages* images = nullptr) override;
  std::vector<int32_t> text_prompt(const std::string& text) override;
  std::string token_text(int32_t id) override;
  text::ChatFormat chat_format() const override { return format_; }
  std::vector<int32_t> special_ids(const std::vector<std::string>& markers) const override;
  int32_t single_token(const std::string& text) const override {
    return tokenizer_.token_to_id(text);
  }
  // Streams decode with special tokens skipped (they are not answer text).
  std::unique_ptr<TextStream> start() const override;
  // ... except those in `keep_special` (reasoning and tool-call markers).
  std::unique_ptr<TextStream> start_keeping(
      const std::vector<int32_t>& keep_special) const override;

  std::shared_ptr<const text::TokenVocab> token_vocab() override;
  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  bool has_chat_template() const { return chat_.has_value(); }

 private:
  explicit ModelText(text::Tokenizer tok) : tokenizer_(std::move(tok)) {}
  text::Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_;
  text::ChatFormat format_;
  std::once_flag vocab_once_;
  std::shared_ptr<const text::TokenVocab> vocab_;  // from the template and config.json's model_type
};

}  // namespace tandem::server
