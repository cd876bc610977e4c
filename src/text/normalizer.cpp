// Normalizers; see normalizer.h.
#include "text/normalizer.h"

#include <vector>

#include "core/error.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace tandem::text {

using json = nlohmann::json;

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  size_t pos = s.find(from);
  if (pos == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + (to.size() > from.size() ? s.size() / 4 : 0));
  size_t last = 0;
  while (pos != std::string::npos) {
    out.append(s, last, pos - last);
    out += to;
    last = pos + from.size();
    pos = s.find(from, last);
  }
  out.append(s, last, std::string::npos);
  s.swap(out);
}

namespace {

class SequenceNorm : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> parts;
  void apply(std::string& s) const override {
    for (const auto& p : parts) p->apply(s);
  }
};

class ReplaceNorm : public Normalizer {
 public:
  std::string from, to;
  std::unique_ptr<Regex> regex;  // set for a Regex pattern
  void apply(std::string& s) const override {
    if (!regex) {
      replace_all(s, from, to);
      return;
    }
    std::vector<std::pair<size_t, size_t>> m;
    regex->find_all(s, m);
    if (m.empty()) return;
    std::string out;
    size_t last = 0;
    for (auto [b, e] : m) {
      out.append(s, last, b - last);
      out += to;
      last = e;
    }
    out.append(s, last, std::string::npos);
    s.swap(out);
  }
};

class PrependNorm : public Normalizer {
 public:
  std::string prefix;
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix);  // as `tokenizers`: never on empty text
  }
};

class UnicodeNorm : public Normalizer {
 public:
  NormForm form;
  explicit UnicodeNorm(NormForm f) : form(f) {}
  void apply(std::string& s) const override { s = normalize(s, form); }
};

class StripNorm : public Normalizer {
 public:
  bool left = true, right = true;
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    char32_t cp;
    while (left && b < e) {
      int n = decode_utf8(s, b, &cp);
      if (n == 0 || !is_unicode_whitespace(cp)) break;
      b += n;
    }
    while (right && e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      int n = decode_utf8(s, k, &cp);
      if (n == 0 || !is_unicode_whitespace(cp)) break;
      e = k;
    }
    s = s.substr(b, e - b);
  }
};

// "pattern": {"String": "..."} or {"Regex": "..."}.
void read_pattern(const json& p, std::string* str, std::string* re) {
  if (p.contains("String"))
    *str = p.at("String").get<std::string>();
  else if (p.contains("Regex"))
    *re = p.at("Regex").get<std::string>();
  else
    fail("tokenizer.json: pattern %s has neither \"String\" nor \"Regex\"", p.dump().c_str());
}

}  // namespace

std::unique_ptr<Normalizer> Normalizer::from_json(const json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNorm>();
    for (const auto& n : j.at("normalizers"))
      if (auto p = from_json(n)) seq->parts.push_back(std::move(p));
    return seq;
  }
  if (type == "Replace") {
    auto r = std::make_unique<ReplaceNorm>();
    std::string re;
    read_pattern(j.at("pattern"), &r->from, &re);
    if (!re.empty()) r->regex = std::make_unique<Regex>(re);
    r->to = j.at("content").get<std::string>();
    return r;
  }
  if (type == "Prepend") {
    auto p = std::make_unique<PrependNorm>();
    p->prefix = j.at("prepend").get<std::string>();
    return p;
  }
  if (type == "NFC") return std::make_unique<UnicodeNorm>(NormForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNorm>(NormForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNorm>(NormForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNorm>(NormForm::NFKD);
  if (type == "Strip") {
    auto s = std::make_unique<StripNorm>();
    s->left = j.value("strip_left", true);
    s->right = j.value("strip_right", true);
    return s;
  }
  fail(
      "tokenizer.json: normalizer type \"%s\" is not supported (supported: Sequence, Replace, "
      "Prepend, NFC, NFD, NFKC, NFKD, Strip)",
      type.c_str());
}

}  // namespace tandem::text
