// Streaming decoder stages; see decoder.h.
#include "text/decoder.h"

#include "core/error.h"
#include "text/normalizer.h"
#include "text/unicode.h"

namespace tandem::text {

using json = nlohmann::json;

namespace {

class ReplaceDec : public DecodeStage {
 public:
  std::string from, to;
  std::unique_ptr<DecodeStage> fresh() const override {
    auto d = std::make_unique<ReplaceDec>();
    d->from = from;
    d->to = to;
    return d;
  }
  void push(std::string tok, std::vector<std::string>& out) override {
    replace_all(tok, from, to);
    out.push_back(std::move(tok));
  }
};

// "<0xNN>" -> NN, else -1.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

class ByteFallbackDec : public DecodeStage {
 public:
  std::string pending;  // bytes of the current run of byte tokens
  std::unique_ptr<DecodeStage> fresh() const override {
    return std::make_unique<ByteFallbackDec>();
  }
  void push(std::string tok, std::vector<std::string>& out) override {
    int b = byte_token(tok);
    if (b >= 0) {
      pending += static_cast<char>(b);
      return;
    }
    flush(out);
    out.push_back(std::move(tok));
  }
  void flush(std::vector<std::string>& out) override {
    if (pending.empty()) return;
    if (is_valid_utf8(pending)) {
      out.push_back(std::move(pending));
    } else {
      std::string r;
      for (size_t i = 0; i < pending.size(); ++i) r += "\xEF\xBF\xBD";
      out.push_back(std::move(r));
    }
    pending.clear();
  }
};

class FuseDec : public DecodeStage {
 public:
  std::unique_ptr<DecodeStage> fresh() const override { return std::make_unique<FuseDec>(); }
  void push(std::string tok, std::vector<std::string>& out) override {
    out.push_back(std::move(tok));
  }
  bool fuses() const override { return true; }
};

// Removes up to `start` leading and `stop` trailing `content` chars, of each
// token, or (after a fusing stage) of the whole text.
class StripDec : public DecodeStage {
 public:
  std::string content;  // one code point
  size_t start = 0, stop = 0;
  bool fused = false;
  // streaming state (fused mode)
  size_t stripped_left = 0;
  bool seen_other = false;
  std::string held;  // trailing content chars held back
  size_t held_n = 0;
  std::unique_ptr<DecodeStage> fresh() const override {
    auto d = std::make_unique<StripDec>();
    d->content = content;
    d->start = start;
    d->stop = stop;
    d->fused = fused;
    return d;
  }
  void push(std::string tok, std::vector<std::string>& out) override {
    if (!fused) {
      size_t b = 0, e = tok.size();
      for (size_t k = 0; k < start && tok.compare(b, content.size(), content) == 0; ++k)
        b += content.size();
      for (size_t k = 0; k < stop && e >= b + content.size() &&
                         tok.compare(e - content.size(), content.size(), content) == 0;
           ++k)
        e -= content.size();
      out.push_back(tok.substr(b, e - b));
      return;
    }
    size_t b = 0;
    if (!seen_other) {
      while (stripped_left < start && tok.compare(b, content.size(), content) == 0) {
        b += content.size();
        ++stripped_left;
      }
      if (b < tok.size()) seen_other = true;
    }
    std::string s = tok.substr(b);
    if (s.empty()) return;
    // Hold back a trailing run of content chars (they may end the text).
    size_t e = s.size(), n = 0;
    while (e >= content.size() && s.compare(e - content.size(), content.size(), content) == 0) {
      e -= content.size();
      ++n;
    }
    if (e == 0) {  // all content: extend the held run
      held += s;
      held_n += n;
      return;
    }
    out.push_back(held + s.substr(0, e));
    held = s.substr(e);
    held_n = n;
  }
  void flush(std::vector<std::string>& out) override {
    if (!fused) return;
    size_t drop = std::min(held_n, stop);
    out.push_back(held.substr(0, held.size() - drop * content.size()));
    held.clear();
    held_n = 0;
  }
};

class ByteLevelDec : public DecodeStage {
 public:
  std::string pending;  // raw bytes not yet decodable
  std::unique_ptr<DecodeStage> fresh() const override { return std::make_unique<ByteLevelDec>(); }
  void push(std::string tok, std::vector<std::string>& out) override {
    // Alphabet chars back to bytes; a token with any other char is taken as
    // its own UTF-8 bytes (as `tokenizers` does).
    std::string bytes;
    bool ok = true;
    for (size_t i = 0; i < tok.size() && ok;) {
      char32_t cp;
      int n = decode_utf8(tok, i, &cp);
      int b = n ? unicode_to_byte(cp) : -1;
      if (b < 0) {
        ok = false;
        break;
      }
      bytes += static_cast<char>(b);
      i += n;
    }
    pending += ok ? bytes : tok;
    size_t k = utf8_stable_prefix(pending);
    if (k == 0) return;
    out.push_back(utf8_lossy(std::string_view(pending).substr(0, k)));
    pending.erase(0, k);
  }
  void flush(std::vector<std::string>& out) override {
    if (pending.empty()) return;
    out.push_back(utf8_lossy(pending));
    pending.clear();
  }
  bool fuses() const override { return true; }
};

class MetaspaceDec : public DecodeStage {
 public:
  std::string replacement = "\xE2\x96\x81";
  bool strip_first = true;  // prepend_scheme != never
  bool first = true;
  std::unique_ptr<DecodeStage> fresh() const override {
    auto d = std::make_unique<MetaspaceDec>();
    d->replacement = replacement;
    d->strip_first = strip_first;
    return d;
  }
  void push(std::string tok, std::vector<std::string>& out) override {
    // In the first token every replacement char is dropped, as `tokenizers` does.
    replace_all(tok, replacement, first && strip_first ? "" : " ");
    first = false;
    out.push_back(std::move(tok));
  }
};

// No decoder: tokens joined with single spaces.
class JoinDec : public DecodeStage {
 public:
  bool first = true;
  std::unique_ptr<DecodeStage> fresh() const override { return std::make_unique<JoinDec>(); }
  void push(std::string tok, std::vector<std::string>& out) override {
    if (!first) out.push_back(" ");
    first = false;
    out.push_back(std::move(tok));
  }
  bool fuses() const override { return true; }
};

size_t count_code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

void build(const json& j, DecoderChain& chain, bool& fused) {
  std::string type = j.value("type", "");
  auto add = [&](std::unique_ptr<DecodeStage> s) {
    if (s->fuses()) fused = true;
    chain.push_back(std::move(s));
  };
  auto needs_tokens = [&]() {
    if (fused)
      fail("tokenizer.json: decoder %s after a Fuse/ByteLevel decoder is not supported",
           type.c_str());
  };
  if (type == "Sequence") {
    for (const auto& d : j.at("decoders")) build(d, chain, fused);
  } else if (type == "Replace") {
    auto r = std::make_unique<ReplaceDec>();
    const json& p = j.at("pattern");
    if (!p.contains("String"))
      fail("tokenizer.json: Replace decoder with a Regex pattern is not supported");
    r->from = p.at("String").get<std::string>();
    r->to = j.at("content").get<std::string>();
    if (fused && count_code_points(r->from) != 1)
      fail("tokenizer.json: Replace decoder of a multi-char pattern after Fuse is not supported");
    add(std::move(r));
  } else if (type == "ByteFallback") {
    needs_tokens();
    add(std::make_unique<ByteFallbackDec>());
  } else if (type == "Fuse") {
    add(std::make_unique<FuseDec>());
  } else if (type == "Strip") {
    auto s = std::make_unique<StripDec>();
    s->content = j.at("content").get<std::string>();
    s->start = j.value("start", 0);
    s->stop = j.value("stop", 0);
    s->fused = fused;
    add(std::move(s));
  } else if (type == "ByteLevel") {
    needs_tokens();
    add(std::make_unique<ByteLevelDec>());
  } else if (type == "Metaspace") {
    needs_tokens();
    auto m = std::make_unique<MetaspaceDec>();
    if (j.contains("replacement")) m->replacement = j.at("replacement").get<std::string>();
    if (j.contains("prepend_scheme"))
      m->strip_first = j.at("prepend_scheme").get<std::string>() != "never";
    else if (j.contains("add_prefix_space"))
      m->strip_first = j.at("add_prefix_space").get<bool>();
    add(std::move(m));
  } else {
    fail(
        "tokenizer.json: decoder type \"%s\" is not supported (supported: Sequence, Replace, "
        "ByteFallback, Fuse, Strip, ByteLevel, Metaspace)",
        type.c_str());
  }
}

}  // namespace

DecoderChain decoder_from_json(const json& j) {
  DecoderChain chain;
  if (j.is_null()) {
    chain.push_back(std::make_unique<JoinDec>());
    return chain;
  }
  bool fused = false;
  build(j, chain, fused);
  return chain;
}

DecoderChain byte_level_decoder() {
  DecoderChain c;
  c.push_back(std::make_unique<ByteLevelDec>());
  return c;
}

DecoderChain clone_chain(const DecoderChain& c) {
  DecoderChain out;
  out.reserve(c.size());
  for (const auto& s : c) out.push_back(s->fresh());
  return out;
}

std::string ChainRunner::push(std::string tok) {
  a_.clear();
  a_.push_back(std::move(tok));
  for (auto& st : chain_) {
    b_.clear();
    for (auto& t : a_) st->push(std::move(t), b_);
    a_.swap(b_);
    if (a_.empty()) return {};
  }
  std::string out;
  for (auto& t : a_) out += t;
  return out;
}

std::string ChainRunner::flush() {
  // Flush stage k, then run what it released through the later stages.
  std::string out;
  for (size_t k = 0; k < chain_.size(); ++k) {
    a_.clear();
    chain_[k]->flush(a_);
    for (size_t m = k + 1; m < chain_.size() && !a_.empty(); ++m) {
      b_.clear();
      for (auto& t : a_) chain_[m]->push(std::move(t), b_);
      a_.swap(b_);
    }
    for (auto& t : a_) out += t;
  }
  return out;
}

}  // namespace tandem::text
