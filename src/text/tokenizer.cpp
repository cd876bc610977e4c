// Tokenizer: loading dispatch, the encode pipeline, lookups. See tokenizer.h.
#include "text/tokenizer.h"

#include <filesystem>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/error.h"
#include "text/detokenizer.h"
#include "text/tokenizer_core.h"
#include "text/unicode.h"

namespace tandem::text {

namespace fs = std::filesystem;

void TokenizerCore::index_tokens() {
  int32_t n = 0;
  for (const auto& [tok, id] : model->vocab()) n = std::max(n, id + 1);
  for (const auto& t : added.tokens()) n = std::max(n, t.id + 1);
  tokens.assign(n, std::string());
  special.assign(n, 0);
  added_flag.assign(n, 0);
  for (const auto& [tok, id] : model->vocab())
    if (id >= 0) tokens[id] = tok;
  for (const auto& t : added.tokens()) {
    if (t.id < 0) continue;
    tokens[t.id] = t.content;
    added_flag[t.id] = 1;
    if (t.special) special[t.id] = 1;
  }
}

void TokenizerCore::encode_stretch(std::string_view text, bool at_start,
                                   std::vector<int32_t>& out) const {
  thread_local PreTokenized pt;
  std::string s(text);
  if (normalizer) normalizer->apply(s);
  auto model_part = [&](std::string part, bool start) {
    pt.reset(std::move(part), start);
    if (pre) pre->apply(pt);
    for (size_t i = 0; i < pt.pieces.size(); ++i) model->encode(pt.piece(i), pt.byte_level, out);
  };
  if (!added.has_normalized()) {
    model_part(std::move(s), at_start);
    return;
  }
  std::vector<Segment> segs;
  added.split(s, true, segs);
  for (const Segment& g : segs) {
    if (g.id >= 0)
      out.push_back(g.id);
    else
      model_part(s.substr(g.begin, g.end - g.begin), at_start && g.begin == 0);
  }
}

void TokenizerCore::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Segment> segs;
  added.split(text, false, segs);
  for (const Segment& g : segs) {
    if (g.id >= 0)
      out.push_back(g.id);
    else
      encode_stretch(text.substr(g.begin, g.end - g.begin), g.begin == 0, out);
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  Tokenizer t;
  auto tekken_name = [](const fs::path& p) {
    std::string n = p.filename().string();
    return n.find("tekken") != std::string::npos && p.extension() == ".json";
  };
  if (fs::is_directory(path, ec)) {
    fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json")) {
      fs::path cfg = dir / "tokenizer_config.json";
      t.core_ = load_tokenizer_json((dir / "tokenizer.json").string(),
                                    fs::exists(cfg) ? cfg.string() : std::string());
    } else if (fs::exists(dir / "tekken.json")) {
      t.core_ = load_tekken((dir / "tekken.json").string());
    } else {
      fail("%s: no tokenizer.json or tekken.json in this folder", path.c_str());
    }
  } else if (fs::is_regular_file(path, ec)) {
    fs::path p(path);
    if (tekken_name(p)) {
      t.core_ = load_tekken(path);
    } else {
      fs::path cfg = p.parent_path() / "tokenizer_config.json";
      t.core_ = load_tokenizer_json(path, fs::exists(cfg) ? cfg.string() : std::string());
    }
  } else {
    fail("%s: no such tokenizer file or folder", path.c_str());
  }
#if defined(__GLIBC__)
  // The parsed JSON (hundreds of MB for a large vocab) is gone: consolidate
  // and return the freed heap now rather than on the first encode.
  malloc_trim(0);
#endif
  return t;
}

Tokenizer Tokenizer::from_json_text(const std::string& tokenizer_json,
                                    const std::string& config_json, const std::string& source) {
  Tokenizer t;
  t.core_ = load_tokenizer_json_text(tokenizer_json, config_json, source);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out.insert(out.end(), core_->prefix.begin(), core_->prefix.end());
  if (is_valid_utf8(text)) {
    core_->encode_plain(text, out);
  } else {
    std::string fixed = utf8_lossy(text);
    core_->encode_plain(fixed, out);
  }
  if (add_special) out.insert(out.end(), core_->suffix.begin(), core_->suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  Detokenizer d(core_, skip_special);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  out += d.flush();
  return out;
}

Detokenizer Tokenizer::detokenizer(bool skip_special) const {
  return Detokenizer(core_, skip_special);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& t : core_->added.tokens())
    if (t.content == token) return t.id;
  return core_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return core_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && core_->special[id];
}
bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && core_->added_flag[id];
}
int32_t Tokenizer::bos_id() const {
  return core_->bos;
}
int32_t Tokenizer::eos_id() const {
  return core_->eos;
}
int32_t Tokenizer::pad_id() const {
  return core_->pad;
}
const std::string& Tokenizer::bos_token() const {
  return core_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return core_->eos_token;
}
const std::vector<int32_t>& Tokenizer::prefix_ids() const {
  return core_->prefix;
}
const std::vector<int32_t>& Tokenizer::suffix_ids() const {
  return core_->suffix;
}
int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(core_->tokens.size());
}
const std::string& Tokenizer::format() const {
  return core_->format;
}
const std::string& Tokenizer::source() const {
  return core_->source;
}

}  // namespace tandem::text
