// Pre-tokenizers; see pretokenize.h.
#include "text/pretokenize.h"

#include <algorithm>

#include "core/error.h"
#include "text/regex.h"

namespace tandem::text {

using json = nlohmann::json;
using Range = std::pair<uint32_t, uint32_t>;

void PreTokenized::reset(std::string text, bool start) {
  buf = std::move(text);
  pieces.clear();
  if (!buf.empty()) pieces.emplace_back(0, static_cast<uint32_t>(buf.size()));
  byte_level = false;
  at_start = start;
}

void split_range(Range range, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Range>& out) {
  // (range, is_delimiter) covering `range`, as `tokenizers` builds it.
  struct Part {
    Range r;
    bool delim;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  uint32_t prev = range.first;
  for (auto [b, e] : matches) {
    if (prev != b) parts.push_back({{prev, static_cast<uint32_t>(b)}, invert});
    parts.push_back({{static_cast<uint32_t>(b), static_cast<uint32_t>(e)}, !invert});
    prev = static_cast<uint32_t>(e);
  }
  if (prev != range.second) parts.push_back({{prev, range.second}, invert});

  std::vector<Range> res;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (auto& p : parts) res.push_back(p.r);
      break;
    case SplitBehavior::Removed:
      for (auto& p : parts)
        if (!p.delim) res.push_back(p.r);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_delim = false;
      for (auto& p : parts) {
        if (p.delim && !prev_delim && !res.empty())
          res.back().second = p.r.second;
        else
          res.push_back(p.r);
        prev_delim = p.delim;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_delim = false;
      for (size_t k = parts.size(); k-- > 0;) {
        auto& p = parts[k];
        if (p.delim && !prev_delim && !res.empty())
          res.back().first = p.r.first;
        else
          res.push_back(p.r);
        prev_delim = p.delim;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_delim = false;
      for (auto& p : parts) {
        if (p.delim == prev_delim && !res.empty())
          res.back().second = p.r.second;
        else
          res.push_back(p.r);
        prev_delim = p.delim;
      }
      break;
    }
  }
  for (auto& r : res)
    if (r.first != r.second) out.push_back(r);
}

namespace {

// Finds delimiter matches in one piece, as absolute offsets.
class Matcher {
 public:
  virtual ~Matcher() = default;
  virtual void find(std::string_view buf, Range r,
                    std::vector<std::pair<size_t, size_t>>& out) const = 0;
};

class LiteralMatcher : public Matcher {
 public:
  std::string lit;
  void find(std::string_view buf, Range r,
            std::vector<std::pair<size_t, size_t>>& out) const override {
    if (lit.empty()) return;
    std::string_view s = buf.substr(r.first, r.second - r.first);
    for (size_t pos = s.find(lit); pos != std::string_view::npos; pos = s.find(lit, pos)) {
      out.emplace_back(r.first + pos, r.first + pos + lit.size());
      pos += lit.size();
    }
  }
};

class RegexMatcher : public Matcher {
 public:
  explicit RegexMatcher(const std::string& p) : re(p) {}
  Regex re;
  void find(std::string_view buf, Range r,
            std::vector<std::pair<size_t, size_t>>& out) const override {
    size_t first = out.size();
    re.find_all(buf.substr(r.first, r.second - r.first), out);
    for (size_t k = first; k < out.size(); ++k) {
      out[k].first += r.first;
      out[k].second += r.first;
    }
  }
};

// Applies a matcher + behavior to every piece.
void split_all(PreTokenized& pt, const Matcher& m, SplitBehavior b, bool invert) {
  std::vector<Range> out;
  out.reserve(pt.pieces.size() * 2);
  std::vector<std::pair<size_t, size_t>> matches;
  for (const Range& r : pt.pieces) {
    matches.clear();
    m.find(pt.buf, r, matches);
    if (matches.empty() && !invert) {
      out.push_back(r);
      continue;
    }
    split_range(r, matches, b, invert, out);
  }
  pt.pieces.swap(out);
}

// Rewrites every piece with f(piece) -> new text, rebuilding buf.
template <class F>
void rewrite_pieces(PreTokenized& pt, F f) {
  std::string nb;
  nb.reserve(pt.buf.size() + pt.pieces.size() * 3);
  std::vector<Range> np;
  np.reserve(pt.pieces.size());
  for (size_t i = 0; i < pt.pieces.size(); ++i) {
    std::string s = f(pt.piece(i), i);
    uint32_t b = static_cast<uint32_t>(nb.size());
    nb += s;
    np.emplace_back(b, static_cast<uint32_t>(nb.size()));
  }
  pt.buf.swap(nb);
  pt.pieces.swap(np);
}

class SplitPre : public PreTokenizer {
 public:
  std::unique_ptr<Matcher> matcher;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  void apply(PreTokenized& pt) const override { split_all(pt, *matcher, behavior, invert); }
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre : public PreTokenizer {
 public:
  bool add_prefix_space = false;
  std::unique_ptr<RegexMatcher> regex;  // set when use_regex
  bool is_byte_level() const override { return true; }
  void apply(PreTokenized& pt) const override {
    if (add_prefix_space) {
      rewrite_pieces(pt, [](std::string_view p, size_t) {
        return (!p.empty() && p[0] == ' ') ? std::string(p) : " " + std::string(p);
      });
    }
    if (regex) split_all(pt, *regex, SplitBehavior::Isolated, false);
    pt.byte_level = true;
  }
};

class MetaspacePre : public PreTokenizer {
 public:
  std::string replacement = "\xE2\x96\x81";  // U+2581
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;
  void apply(PreTokenized& pt) const override {
    rewrite_pieces(pt, [&](std::string_view p, size_t i) {
      std::string s;
      s.reserve(p.size() + 3);
      for (char c : p) {
        if (c == ' ')
          s += replacement;
        else
          s += c;
      }
      bool starts = s.compare(0, replacement.size(), replacement) == 0;
      bool first = pt.at_start && i == 0 && pt.pieces[0].first == 0;
      if (!starts && (prepend == Prepend::Always || (prepend == Prepend::First && first)))
        s.insert(0, replacement);
      return s;
    });
    if (split) {
      LiteralMatcher m;
      m.lit = replacement;
      split_all(pt, m, SplitBehavior::MergedWithNext, false);
    }
  }
};

class SequencePre : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  bool is_byte_level() const override { return !parts.empty() && parts.back()->is_byte_level(); }
  void apply(PreTokenized& pt) const override {
    for (const auto& p : parts) p->apply(pt);
  }
};

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("tokenizer.json: unknown Split behavior \"%s\"", s.c_str());
}

}  // namespace

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePre>();
    for (const auto& p : j.at("pretokenizers")) {
      if (!seq->parts.empty() && seq->parts.back()->is_byte_level())
        fail("tokenizer.json: a ByteLevel pre-tokenizer followed by another one is not supported");
      if (auto q = from_json(p)) seq->parts.push_back(std::move(q));
    }
    return seq;
  }
  if (type == "Split") {
    auto s = std::make_unique<SplitPre>();
    const json& p = j.at("pattern");
    if (p.contains("String")) {
      auto m = std::make_unique<LiteralMatcher>();
      m->lit = p.at("String").get<std::string>();
      s->matcher = std::move(m);
    } else if (p.contains("Regex")) {
      s->matcher = std::make_unique<RegexMatcher>(p.at("Regex").get<std::string>());
    } else {
      fail("tokenizer.json: Split pattern %s has neither String nor Regex", p.dump().c_str());
    }
    s->behavior = parse_behavior(j.value("behavior", "Isolated"));
    s->invert = j.value("invert", false);
    return s;
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevelPre>();
    b->add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) b->regex = std::make_unique<RegexMatcher>(kGpt2Pattern);
    return b;
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspacePre>();
    if (j.contains("replacement")) m->replacement = j.at("replacement").get<std::string>();
    if (j.contains("prepend_scheme")) {
      std::string s = j.at("prepend_scheme").get<std::string>();
      m->prepend = s == "always"  ? MetaspacePre::Prepend::Always
                   : s == "first" ? MetaspacePre::Prepend::First
                                  : MetaspacePre::Prepend::Never;
    } else if (j.contains("add_prefix_space")) {
      m->prepend = j.at("add_prefix_space").get<bool>() ? MetaspacePre::Prepend::Always
                                                        : MetaspacePre::Prepend::Never;
    }
    m->split = j.value("split", true);
    return m;
  }
  if (type == "Digits") {
    auto s = std::make_unique<SplitPre>();
    s->matcher = std::make_unique<RegexMatcher>("\\p{N}");
    s->behavior =
        j.value("individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous;
    return s;
  }
  fail(
      "tokenizer.json: pre_tokenizer type \"%s\" is not supported (supported: Sequence, Split, "
      "ByteLevel, Metaspace, Digits)",
      type.c_str());
}

std::unique_ptr<PreTokenizer> PreTokenizer::tiktoken_style(const std::string& pattern) {
  auto seq = std::make_unique<SequencePre>();
  auto s = std::make_unique<SplitPre>();
  s->matcher = std::make_unique<RegexMatcher>(pattern);
  s->behavior = SplitBehavior::Isolated;
  seq->parts.push_back(std::move(s));
  auto b = std::make_unique<ByteLevelPre>();
  seq->parts.push_back(std::move(b));
  return seq;
}

}  // namespace tandem::text
