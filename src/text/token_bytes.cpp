#include "text/token_bytes.h"

#include <unordered_map>

#include "text/tokenizer_core.h"

namespace tandem::text {

namespace {

// Appends the UTF-8 code points of `s` one at a time.
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n && i + size_t(k) < s.size(); ++k)
      cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
    out.push_back(cp);
    i += size_t(n);
  }
  return out;
}

// GPT-2's bytes_to_unicode, inverted: code point -> byte.
const std::unordered_map<uint32_t, uint8_t>& byte_level_inverse() {
  static const std::unordered_map<uint32_t, uint8_t> inv = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      m[direct ? uint32_t(b) : 256 + extra++] = uint8_t(b);
    }
    return m;
  }();
  return inv;
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

TokenBytes token_bytes(const Tokenizer& tok) {
  const TokenizerCore& core = *tok.core();
  TokenBytes out;
  const size_t n = core.tokens.size();
  out.bytes.resize(n);
  out.usable.assign(n, 0);
  // Which decoding the chain does: a byte-level chain turns "Ġa" into " a".
  bool byte_level = core.format == "tekken";
  if (!byte_level) {
    ChainRunner r(core.decoder);
    byte_level = r.push(
                     "\xC4\xA0"
                     "a") +
                     r.flush() ==
                 " a";
  }
  const auto& inv = byte_level_inverse();
  for (size_t id = 0; id < n; ++id) {
    if (core.special[id]) continue;
    const std::string& t = core.tokens[id];
    std::string b;
    const bool added = core.added_flag[id];  // decoded by the chain, as transformers does
    if (!added && t.size() == 6 && t[0] == '<' && t[1] == '0' && t[2] == 'x' && t[5] == '>' &&
        hex(t[3]) >= 0 && hex(t[4]) >= 0) {
      b.push_back(char(hex(t[3]) * 16 + hex(t[4])));
    } else if (!added && byte_level) {
      bool ok = true;
      for (uint32_t cp : code_points(t)) {
        auto it = inv.find(cp);
        if (it == inv.end()) {
          ok = false;
          break;
        }
        b.push_back(char(it->second));
      }
      if (!ok) continue;
    } else {
      // After a leading "a" so that first-token rules (strip, prefix space)
      // do not apply to it.
      ChainRunner r(core.decoder);
      std::string s = r.push("a");
      s += r.push(t);
      s += r.flush();
      if (s.empty() || s[0] != 'a') continue;
      b = s.substr(1);
      if (b.find("\xEF\xBF\xBD") != std::string::npos &&
          t.find("\xEF\xBF\xBD") == std::string::npos)
        continue;  // not representable as bytes
    }
    out.bytes[id] = std::move(b);
    out.usable[id] = !out.bytes[id].empty();
  }
  return out;
}

std::shared_ptr<const TokenVocab> token_vocab(const Tokenizer& tok) {
  TokenBytes tb = token_bytes(tok);
  TokenTrie trie(tb.bytes, tb.usable);
  return std::make_shared<TokenVocab>(TokenVocab{std::move(tb), std::move(trie)});
}

}  // namespace tandem::text
