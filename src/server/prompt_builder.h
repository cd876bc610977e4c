// The server's view of the tokenizer and the chat template: request content
// in, prompt token ids out.
//
// UNFINISHED until the tokenizer branch lands: nothing implements this yet.
// The server is started with a null PromptBuilder, so every string prompt and
// every chat request is answered 400 (code `no_tokenizer` /
// `no_chat_template`) — see the two places marked "TOKENIZER:" in
// server/generate.cpp. The text layer will implement this interface (and
// engine/text_streamer.h for detokenization) and cmd_serve.cpp will pass it
// to the server; nothing else in the HTTP layer has to change.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::server {

// Called concurrently from HTTP threads: implementations must be thread-safe.
class PromptBuilder {
 public:
  virtual ~PromptBuilder() = default;

  // Renders the model's chat template over `messages` (already validated by
  // server/openai_request.h: non-empty, roles known, content a string or an
  // array of text/image_url parts), with `tools` (array or null) and
  // `template_kwargs` (object or null, the request's chat_template_kwargs),
  // adds the generation prompt, and tokenizes. Throws server::ApiError (400,
  // naming the param) for content the template rejects.
  virtual std::vector<int32_t> chat_prompt(const nlohmann::json& messages,
                                           const nlohmann::json& tools,
                                           const nlohmann::json& template_kwargs) = 0;

  // Tokenizes a plain completion prompt (special tokens as the model's
  // tokenizer adds them, e.g. BOS).
  virtual std::vector<int32_t> text_prompt(const std::string& text) = 0;
};

}  // namespace tandem::server
