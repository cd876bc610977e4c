// Added-token matching; see added_vocab.h.
#include "text/added_vocab.h"

#include <algorithm>

#include "text/regex.h"
#include "text/unicode.h"

namespace tandem::text {

void AddedVocab::Trie::insert(const std::string& s, int32_t token) {
  if (s.empty()) return;
  first[static_cast<unsigned char>(s[0])] = true;
  int32_t node = 0;
  for (unsigned char c : s) {
    auto& nx = nodes[node].next;
    auto it = std::lower_bound(
        nx.begin(), nx.end(), c,
        [](const std::pair<unsigned char, int32_t>& p, unsigned char v) { return p.first < v; });
    if (it != nx.end() && it->first == c) {
      node = it->second;
    } else {
      int32_t id = static_cast<int32_t>(nodes.size());
      nx.insert(it, {c, id});
      nodes.emplace_back();
      node = id;
    }
  }
  nodes[node].token = token;
}

int32_t AddedVocab::Trie::longest(std::string_view text, size_t i, size_t* len) const {
  int32_t node = 0, best = -1;
  for (size_t k = i; k < text.size(); ++k) {
    unsigned char c = static_cast<unsigned char>(text[k]);
    const auto& nx = nodes[node].next;
    auto it = std::lower_bound(
        nx.begin(), nx.end(), c,
        [](const std::pair<unsigned char, int32_t>& p, unsigned char v) { return p.first < v; });
    if (it == nx.end() || it->first != c) break;
    node = it->second;
    if (nodes[node].token >= 0) {
      best = nodes[node].token;
      *len = k + 1 - i;
    }
  }
  return best;
}

void AddedVocab::add(const AddedToken& t) {
  for (auto& x : tokens_)
    if (x.content == t.content) {
      x = t;
      return;
    }
  tokens_.push_back(t);
}

void AddedVocab::build() {
  raw_ = Trie{};
  norm_ = Trie{};
  has_norm_ = has_raw_ = false;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const AddedToken& t = tokens_[k];
    if (t.content.empty()) continue;
    if (t.normalized) {
      norm_.insert(t.content, static_cast<int32_t>(k));
      has_norm_ = true;
    } else {
      raw_.insert(t.content, static_cast<int32_t>(k));
      has_raw_ = true;
    }
  }
}

namespace {

// \w as Rust's regex crate defines it is close to PCRE2's UCP \w; used only
// for single_word tokens.
bool word_char_at_start(std::string_view s) {
  static const Regex re("^\\w");
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(s.substr(0, std::min<size_t>(s.size(), 4)), m);
  return !m.empty();
}

bool word_char_at_end(std::string_view s) {
  if (s.empty()) return false;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return word_char_at_start(s.substr(k));
}

}  // namespace

void AddedVocab::split_with(const Trie& trie, std::string_view text,
                            std::vector<Segment>& out) const {
  size_t done = 0;  // end of the last emitted segment
  size_t i = 0;
  while (i < text.size()) {
    if (!trie.first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    size_t len = 0;
    int32_t k = trie.longest(text, i, &len);
    if (k < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[k];
    size_t b = i, e = i + len;
    i = e;
    if (t.single_word) {
      bool left_ok = b == 0 || !word_char_at_end(text.substr(0, b));
      bool right_ok = e == text.size() || !word_char_at_start(text.substr(e));
      if (!left_ok || !right_ok) continue;
    }
    if (t.lstrip) {
      while (b > done) {
        size_t k2 = b - 1;
        while (k2 > done && (static_cast<unsigned char>(text[k2]) & 0xC0) == 0x80) --k2;
        char32_t cp;
        if (!decode_utf8(text, k2, &cp) || !is_unicode_whitespace(cp)) break;
        b = k2;
      }
    }
    if (t.rstrip) {
      char32_t cp;
      while (e < text.size()) {
        int n = decode_utf8(text, e, &cp);
        if (!n || !is_unicode_whitespace(cp)) break;
        e += n;
      }
      i = e;
    }
    if (b > done) out.push_back({done, b, -1});
    out.push_back({b, e, t.id});
    done = e;
  }
  if (done < text.size()) out.push_back({done, text.size(), -1});
}

void AddedVocab::split(std::string_view text, bool normalized, std::vector<Segment>& out) const {
  const Trie& trie = normalized ? norm_ : raw_;
  bool any = normalized ? has_norm_ : has_raw_;
  if (!any) {
    if (!text.empty()) out.push_back({0, text.size(), -1});
    return;
  }
  split_with(trie, text, out);
}

}  // namespace tandem::text
