#include "server/model_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
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

// Keeps the special tokens in `keep` (sorted), skips the others.
class KeepingStream : public TextStream {
 public:
  KeepingStream(const text::Tokenizer& tok, std::vector<int32_t> keep)
      : tok_(tok), d_(tok.detokenizer(/*skip_special=*/false)), keep_(std::move(keep)) {}
  std::string push(int32_t id) override {
    if (tok_.is_special(id) && !std::binary_search(keep_.begin(), keep_.end(), id)) return {};
    return d_.push(id);
  }
  std::string flush() override { return d_.flush(); }

 private:
  text::Tokenizer tok_;
  text::Detokenizer d_;
  std::vector<int32_t> keep_;
};

using ojson = nlohmann::ordered_json;

// The messages as the templates take them:
//  - OpenAI image_url parts become the {"type": "image"} parts chat templates
//    test for (the image itself travels separately);
//  - an assistant tool call's `arguments` string holding a JSON object
//    becomes that object, and the message's null content "";
//  - a tool message's text parts become one string.
ojson for_template(ojson messages) {
  for (auto& m : messages) {
    if (!m.is_object()) continue;
    if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array()) {
      for (auto& c : *calls) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
        ojson& fn = c["function"];
        if (auto a = fn.find("arguments"); a != fn.end() && a->is_string()) {
          ojson parsed = ojson::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (!parsed.is_discarded() && parsed.is_object()) *a = std::move(parsed);
        }
      }
      if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
    }
    if (!m.contains("content") || !m["content"].is_array()) continue;
    if (m.value("role", "") == "tool") {
      std::string text;
      bool only_text = true;
      for (const auto& part : m["content"]) {
        if (part.is_object() && part.value("type", "") == "text")
          text += part.value("text", "");
        else
          only_text = false;
      }
      if (only_text) m["content"] = text;
      continue;
    }
    for (auto& part : m["content"])
      if (part.is_object() && part.value("type", "") == "image_url")
        part = ojson{{"type", "image"}};
  }
  return messages;
}

// config.json's model_type ("" without one).
std::string model_type(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "config.json");
  if (!f) return "";
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) return "";
  return j["model_type"].get<std::string>();
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

std::unique_ptr<ModelText> ModelText::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string dir = path;
  std::shared_ptr<GgufFile> gguf;
  if (const std::string g = find_gguf_model(path); !g.empty()) {
    // A tokenizer.json beside the .gguf wins over the GGUF metadata.
    dir = fs::path(g).parent_path().string();
    if (dir.empty()) dir = ".";
    gguf = GgufFile::open(g);
    if (!fs::exists(fs::path(dir) / "tokenizer.json")) {
      if (!gguf->find("tokenizer.ggml.model")) return nullptr;
      std::unique_ptr<ModelText> m(new ModelText(gguf_tokenizer(*gguf)));
      const std::string source = gguf_chat_template(*gguf);
      if (!source.empty())
        m->chat_ = ChatTemplate::from_string(source, gguf_template_tokens(*gguf));
      m->format_ = text::detect_chat_format(source, gguf_model_type(*gguf));
      return m;
    }
  }
  if (!fs::exists(fs::path(dir) / "tokenizer.json") && !fs::exists(fs::path(dir) / "tekken.json"))
    return nullptr;
  std::unique_ptr<ModelText> m(new ModelText(text::Tokenizer::load(dir)));
  std::string sources;
  try {
    m->chat_ = ChatTemplate::from_folder(dir);
    for (const std::string& name : m->chat_->names()) sources += m->chat_->source(name);
  } catch (const Error&) {
    // No template: completions still work; chat answers 400 no_chat_template.
    if (gguf && !gguf_chat_template(*gguf).empty()) {
      sources = gguf_chat_template(*gguf);
      m->chat_ = ChatTemplate::from_string(sources, gguf_template_tokens(*gguf));
    }
  }
  m->format_ = text::detect_chat_format(sources, gguf ? gguf_model_type(*gguf) : model_type(dir));
  return m;
}

std::vector<int32_t> ModelText::chat_prompt(const nlohmann::ordered_json& messages,
                                            const nlohmann::ordered_json& tools,
                                            const nlohmann::ordered_json& template_kwargs,
                                            const ChatImages* images) {
  if (!chat_)
    throw ApiError(
        400, "no_chat_template", "messages",
        "this model has no chat template (no chat_template in tokenizer_config.json and no "
        "chat_template.jinja); use /v1/completions with a text prompt");
  std::string prompt;
  try {
    prompt = chat_->render(for_template(messages), tools, /*add_generation_prompt=*/true,
                           template_kwargs);
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

std::shared_ptr<const text::TokenVocab> ModelText::token_vocab() {
  std::call_once(vocab_once_, [&] { vocab_ = text::token_vocab(tokenizer_); });
  return vocab_;
}

std::unique_ptr<TextStream> ModelText::start() const {
  return std::make_unique<DetokenizerStream>(tokenizer_.detokenizer(/*skip_special=*/true));
}

std::unique_ptr<TextStream> ModelText::start_keeping(const std::vector<int32_t>& keep) const {
  std::vector<int32_t> sorted = keep;
  std::sort(sorted.begin(), sorted.end());
  return std::make_unique<KeepingStream>(tokenizer_, std::move(sorted));
}

std::vector<int32_t> ModelText::special_ids(const std::vector<std::string>& markers) const {
  std::vector<int32_t> ids;
  for (const std::string& m : markers) {
    const int32_t id = tokenizer_.token_to_id(m);
    if (id >= 0 && tokenizer_.is_special(id)) ids.push_back(id);
  }
  return ids;
}

}  // namespace tandem::server
