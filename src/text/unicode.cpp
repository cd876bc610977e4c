// UTF-8 helpers and Unicode normalization. See unicode.h for the contracts.
#include "text/unicode.h"

#include <algorithm>
#include <vector>

#include "text/unicode_tables.h"

namespace tandem::text {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Result of examining the sequence that starts at s[i].
struct Seq {
  int len;         // bytes consumed: a valid char, or the maximal invalid subpart
  bool valid;      // a complete valid code point
  bool truncated;  // valid so far but the input ended before it completed
  char32_t cp;
};

Seq examine(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char b0 = p[i];
  if (b0 < 0x80) return {1, true, false, b0};
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false, 0};
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return {k, false, true, 0};
    unsigned char b = p[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {k, false, false, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {need + 1, true, false, cp};
}

}  // namespace

int decode_utf8(std::string_view s, size_t i, char32_t* cp) {
  if (i >= s.size()) return 0;
  Seq q = examine(s, i);
  if (!q.valid) return 0;
  *cp = q.cp;
  return q.len;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Seq q = examine(s, i);
    if (!q.valid) return false;
    i += q.len;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      out += s[i++];
      continue;
    }
    Seq q = examine(s, i);
    if (q.valid)
      out.append(s.substr(i, q.len));
    else
      out += "\xEF\xBF\xBD";
    i += q.len;
  }
  return out;
}

size_t utf8_stable_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Seq q = examine(s, i);
    if (q.truncated) return i;
    i += q.len;
  }
  return i;
}

// ---- byte-level alphabet ------------------------------------------------

namespace {
struct ByteTables {
  char32_t to_cp[256];
  ByteTables() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

char32_t byte_to_unicode(uint8_t b) {
  return byte_tables().to_cp[b];
}

int unicode_to_byte(char32_t cp) {
  if (cp >= 256 + 68) return -1;
  static const auto inverse = [] {
    std::vector<int> inv(256 + 68, -1);
    for (int b = 0; b < 256; ++b) inv[byte_tables().to_cp[b]] = b;
    return inv;
  }();
  return inverse[cp];
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// ---- normalization ---------------------------------------------------------

namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
              kSCount = kLCount * kNCount;

uint8_t ccc_of(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = tables::kCcc + tables::kCccCount;
  const auto* it = std::upper_bound(
      tables::kCcc, end, cp, [](char32_t c, const tables::CccRun& r) { return c < r.first; });
  if (it == tables::kCcc) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool in_ranges(const tables::Range* r, size_t n, char32_t cp) {
  const auto* end = r + n;
  const auto* it =
      std::upper_bound(r, end, cp, [](char32_t c, const tables::Range& x) { return c < x.first; });
  if (it == r) return false;
  --it;
  return cp <= it->last;
}

void decompose(char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    int s = static_cast<int>(cp - kSBase);
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xA0) {
    const auto* end = tables::kDecomp + tables::kDecompCount;
    const auto* it = std::lower_bound(tables::kDecomp, end, cp,
                                      [](const tables::Decomp& d, char32_t c) { return d.cp < c; });
    const tables::Decomp* pick = nullptr;
    for (; it != end && it->cp == cp; ++it)
      if (it->compat == 0 || compat) pick = it;  // the compat entry (if any) comes last
    if (pick) {
      out.insert(out.end(), tables::kDecompData + pick->offset,
                 tables::kDecompData + pick->offset + pick->len);
      return;
    }
  }
  out.push_back(cp);
}

bool compose_pair(char32_t a, char32_t b, char32_t* out) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    *out = kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    return true;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    *out = a + (b - kTBase);
    return true;
  }
  const auto* end = tables::kPairs + tables::kPairCount;
  const auto* it =
      std::lower_bound(tables::kPairs, end, std::make_pair(a, b),
                       [](const tables::Pair& p, const std::pair<char32_t, char32_t>& k) {
                         return p.first < k.first || (p.first == k.first && p.second < k.second);
                       });
  if (it != end && it->first == a && it->second == b) {
    *out = it->composite;
    return true;
  }
  return false;
}

}  // namespace

std::string normalize(std::string_view text, NormForm form) {
  const bool compat = form == NormForm::NFKC || form == NormForm::NFKD;
  const bool compose = form == NormForm::NFC || form == NormForm::NFKC;
  // Fast path: nothing in the text can change.
  {
    const tables::Range* r = compat ? tables::kNfkcUnstable : tables::kNfcUnstable;
    size_t n = compat ? tables::kNfkcUnstableCount : tables::kNfcUnstableCount;
    bool stable = true;
    for (size_t i = 0; i < text.size();) {
      unsigned char b = static_cast<unsigned char>(text[i]);
      if (b < 0x80) {
        ++i;
        continue;
      }
      char32_t cp;
      int len = decode_utf8(text, i, &cp);
      if (len == 0) return normalize(utf8_lossy(text), form);
      // Decomposing forms: only ASCII is known stable; composing forms:
      // anything outside the unstable set.
      if (!compose || in_ranges(r, n, cp)) {
        stable = false;
        break;
      }
      i += len;
    }
    if (stable) return std::string(text);
  }
  std::vector<char32_t> d;
  d.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;  // decode_utf8 always sets it; initialized for the compiler
    int len = decode_utf8(text, i, &cp);
    decompose(cp, compat, d);
    i += len;
  }
  // Canonical ordering: stable sort of each run of non-starters by ccc.
  for (size_t i = 1; i < d.size(); ++i) {
    uint8_t c = ccc_of(d[i]);
    if (c == 0) continue;
    size_t j = i;
    while (j > 0) {
      uint8_t p = ccc_of(d[j - 1]);
      if (p == 0 || p <= c) break;
      std::swap(d[j - 1], d[j]);
      --j;
    }
  }
  if (compose) {
    std::vector<char32_t> out;
    out.reserve(d.size());
    long starter = -1;
    uint8_t last_cc = 0;
    for (char32_t c : d) {
      uint8_t cc = ccc_of(c);
      if (starter >= 0) {
        bool adjacent = out.size() == static_cast<size_t>(starter) + 1;
        char32_t comp;
        if ((adjacent || (last_cc != 0 && last_cc < cc)) && compose_pair(out[starter], c, &comp)) {
          out[starter] = comp;
          continue;
        }
      }
      if (cc == 0) starter = static_cast<long>(out.size());
      last_cc = cc;
      out.push_back(c);
    }
    d.swap(out);
  }
  std::string s;
  s.reserve(text.size() + 8);
  for (char32_t c : d) append_utf8(s, c);
  return s;
}

const char* unicode_tables_version() {
  return tables::kUnicodeVersion;
}

}  // namespace tandem::text
