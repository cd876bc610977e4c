#include "coherence/answer_match.h"

#include <array>

#include "coherence/script.h"
#include "text/unicode.h"

namespace tandem::coherence {

namespace {

bool is_space_cp(char32_t cp) {
  return text::is_unicode_whitespace(cp);
}

bool strip_both_ends(char32_t cp) {
  switch (cp) {
    case U'"':
    case U'\'':
    case U'*':
    case U'_':
    case U'`':
    case 0x201C:  // “
    case 0x201D:  // ”
    case 0x2018:  // ‘
    case 0x2019:  // ’
    case 0x00AB:  // «
    case 0x00BB:  // »
    case 0x201E:  // „
    case 0x2039:  // ‹
    case 0x203A:  // ›
    case 0x300C:  // 「
    case 0x300D:  // 」
    case 0x300E:  // 『
    case 0x300F:  // 』
      return true;
    default: return is_space_cp(cp);
  }
}

bool strip_at_start(char32_t cp) {
  return cp == 0x00BF || cp == 0x00A1 || strip_both_ends(cp);
}

bool strip_at_end(char32_t cp) {
  switch (cp) {
    case U'.':
    case U',':
    case U'!':
    case U'?':
    case U';':
    case U':':
    case 0x2026:  // …
    case 0x3002:  // 。
    case 0xFF0E:  // ．
    case 0xFF0C:  // ，
    case 0x3001:  // 、
    case 0xFF01:  // ！
    case 0xFF1F:  // ？
    case 0xFF1B:  // ；
    case 0xFF1A:  // ：
    case 0xFF61:  // ｡
    case 0xFF64:  // ､
      return true;
    default: return strip_both_ends(cp);
  }
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0xFFFD;
    const int n = text::decode_utf8(s, i, &cp);
    out += n == 0 ? char32_t(0xFFFD) : cp;
    i += n == 0 ? 1 : size_t(n);
  }
  return out;
}

}  // namespace

std::string normalize_answer(std::string_view raw) {
  const std::string valid = text::utf8_lossy(raw);
  const std::u32string cps = decode(fold_case(text::normalize(valid, text::NormForm::NFKC)));
  size_t begin = 0, end = cps.size();
  for (bool changed = true; changed;) {
    changed = false;
    while (begin < end && strip_at_start(cps[begin])) ++begin, changed = true;
    while (end > begin && strip_at_end(cps[end - 1])) --end, changed = true;
  }
  std::string out;
  bool in_space = false;
  for (size_t i = begin; i < end; ++i) {
    if (is_space_cp(cps[i])) {
      in_space = true;
      continue;
    }
    if (in_space) out += ' ';
    in_space = false;
    text::append_utf8(out, cps[i]);
  }
  return out;
}

bool answer_matches(std::string_view answer, const std::vector<std::string>& accepted) {
  const std::string got = normalize_answer(answer);
  for (const std::string& a : accepted)
    if (normalize_answer(a) == got) return true;
  return false;
}

std::string find_reasoning_marker(std::string_view content) {
  static constexpr std::array<std::string_view, 7> kMarkers = {
      "<think>", "</think>", "<|channel>", "<channel|>", "<|channel|>", "[THINK]", "[/THINK]"};
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c + 32) : c; };
  std::string folded(content);
  for (char& c : folded) c = lower(c);
  size_t best = std::string::npos;
  std::string_view found;
  for (std::string_view m : kMarkers) {
    std::string lm(m);
    for (char& c : lm) c = lower(c);
    const size_t at = folded.find(lm);
    if (at < best) best = at, found = m;
  }
  return std::string(found);
}

}  // namespace tandem::coherence
