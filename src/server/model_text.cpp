#include "server/model_text.h"

#include <filesystem>

#include "core/error.h"
#include "server/errors.h"
#include "text/detokenizer.h"

namespace tandem::server {

namespace {

class DetokenizerStream : public TextStream {
 public:
  explicit DetokenizerStream(text::Detokenizer d) : d_(std::move(d)) {}
  std::string push(int32_t id) override { return d_.push(id); }
  std::string flush() override { return d_.flush(); }

 private:
  text::Detokenizer d_;
};

nlohmann::ordered_json ordered(const nlohmann::json& j) {
  return j.is_null() ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(j.dump());
}

// OpenAI image_url parts become the {"type": "image"} parts chat templates
// test for (the image itself travels separately).
nlohmann::ordered_json with_image_parts(nlohmann::ordered_json messages) {
  for (auto& m : messages) {
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    for (auto& part : m["content"])
      if (part.is_object() && part.value("type", "") == "image_url")
        part = nlohmann::ordered_json{{"type", "image"}};
  }
  return messages;
}

}  // namespace

std::string expand_image_markers(const std::string& prompt, const ChatImages& images) {
  std::string out;
  size_t from = 0, k = 0;
  while (true) {
    const size_t at = images.marker.empty() ? std::string::npos : prompt.find(images.marker, from);
    if (at == std::string::npos) break;
    if (k == images.expansions.size()) {
      ++k;
      break;
    }
    out.append(prompt, from, at - from);
    out += images.expansions[k++];
    from = at + images.marker.size();
  }
  if (k != images.expansions.size())
    throw ApiError(400, "invalid_value", "messages",
                   "the prompt holds " + std::to_string(k) +
                       (k > images.expansions.size() ? " or more" : "") + " image markers (" +
                       images.marker + ") for " + std::to_string(images.expansions.size()) +
                       " images: each image needs exactly one marker where it goes (in chat, "
                       "put images only in user messages and no marker text in messages)");
  out.append(prompt, from, std::string::npos);
  return out;
}

std::unique_ptr<ModelText> ModelText::load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(dir) / "tokenizer.json") && !fs::exists(fs::path(dir) / "tekken.json"))
    return nullptr;
  std::unique_ptr<ModelText> m(new ModelText(text::Tokenizer::load(dir)));
  try {
    m->chat_ = ChatTemplate::from_folder(dir);
  } catch (const Error&) {
    // No template: completions still work; chat answers 400 no_chat_template.
  }
  return m;
}

std::vector<int32_t> ModelText::chat_prompt(const nlohmann::json& messages,
                                            const nlohmann::json& tools,
                                            const nlohmann::json& template_kwargs,
                                            const ChatImages* images) {
  if (!chat_)
    throw ApiError(
        400, "no_chat_template", "messages",
        "this model has no chat template (no chat_template in tokenizer_config.json and no "
        "chat_template.jinja); use /v1/completions with a text prompt");
  std::string prompt;
  try {
    prompt = chat_->render(with_image_parts(ordered(messages)), ordered(tools),
                           /*add_generation_prompt=*/true, ordered(template_kwargs));
  } catch (const Error& e) {
    // raise_exception() and template errors say what the template rejects.
    throw ApiError(400, "invalid_value", "messages",
                   std::string("the chat template rejected the request: ") + e.what());
  }
  if (images) prompt = expand_image_markers(prompt, *images);
  return tokenizer_.encode(prompt, /*add_special=*/false);
}

std::vector<int32_t> ModelText::text_prompt(const std::string& text) {
  return tokenizer_.encode(text, true);
}

std::string ModelText::token_text(int32_t id) {
  const int32_t ids[] = {id};
  return tokenizer_.decode(ids, /*skip_special=*/false);
}

std::unique_ptr<TextStream> ModelText::start() const {
  return std::make_unique<DetokenizerStream>(tokenizer_.detokenizer(/*skip_special=*/true));
}

}  // namespace tandem::server
