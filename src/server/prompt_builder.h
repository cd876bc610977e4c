// The server's view of the tokenizer and the chat template: request content
// in, prompt token ids out. Implemented by server/model_text.h; a server
// without one (a model folder with no tokenizer) answers every string prompt
// and chat request 400 (`no_tokenizer` / `no_chat_template`).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/chat_output.h"
#include "text/token_bytes.h"

namespace tandem::server {

// The images of a chat request, for the template's markers: the template
// writes `marker` once per image part (image_url parts are rendered as the
// templates' {"type": "image"}); the k-th occurrence is replaced by
// `expansions[k]` before tokenizing, as the family's processor does.
struct ChatImages {
  std::string marker;
  std::vector<std::string> expansions;
};

// `prompt` with the k-th images.marker replaced by images.expansions[k].
// Throws ApiError 400 (param "messages") when the counts differ.
std::string expand_image_markers(const std::string& prompt, const ChatImages& images);

// Called concurrently from HTTP threads: implementations must be thread-safe.
class PromptBuilder {
 public:
  virtual ~PromptBuilder() = default;

  // Renders the model's chat template over `messages` (already validated by
  // server/openai_request.h: non-empty, roles known, content a string or an
  // array of text/image_url parts), with `tools` (array or null) and
  // `template_kwargs` (object or null, the request's chat_template_kwargs),
  // adds the generation prompt, and tokenizes. Objects keep the client's
  // key order (templates print tool schemas with tojson, as transformers
  // does). Throws server::ApiError (400, naming the param) for content the
  // template rejects.
  // `images` (null for a text-only request) expands the image markers; a
  // template that writes a different number of markers than there are
  // images is a 400.
  virtual std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages,
                                           const nlohmann::ordered_json& tools,
                                           const nlohmann::ordered_json& template_kwargs,
                                           const ChatImages* images = nullptr) = 0;

  // Tokenizes a plain completion prompt (special tokens as the model's
  // tokenizer adds them, e.g. BOS).
  virtual std::vector<int32_t> text_prompt(const std::string& text) = 0;

  // How one token is shown in logprobs: its text (a lone byte of a UTF-8
  // sequence shows as the replacement character, as in transformers).
  virtual std::string token_text(int32_t id) = 0;

  // How the model writes reasoning and tool calls (text/chat_output.h): the
  // server parses chat output with it. Default: plain text.
  virtual text::ChatFormat chat_format() const { return {}; }
  // The ids of those `markers` that are special tokens of this tokenizer:
  // the engine's text stream must keep them for the parsers to see them
  // (GenerationParams::keep_special).
  virtual std::vector<int32_t> special_ids(const std::vector<std::string>& markers) const {
    (void)markers;
    return {};
  }
  // The id of the token whose text is exactly `text` (an added or special
  // token such as "<tool_call>"), or -1.
  virtual int32_t single_token(const std::string& text) const {
    (void)text;
    return -1;
  }
  // The vocabulary as bytes and a trie, for response_format grammars (built
  // on first use, then shared). Null: structured outputs are unavailable.
  virtual std::shared_ptr<const text::TokenVocab> token_vocab() { return nullptr; }
};

}  // namespace tandem::server
