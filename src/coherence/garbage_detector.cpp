#include "coherence/garbage_detector.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "text/unicode.h"

namespace tandem::coherence {

namespace {

constexpr int kMaxRun = 20;               // check 8
constexpr size_t kMinCharsForShare = 10;  // check 9
constexpr int kMaxRepeats = 4;            // check 10
constexpr size_t kMaxLoopWords = 4;
constexpr size_t kMinLoopChars = 2, kMaxLoopChars = 16;
constexpr size_t kMinWordsForStats = 10;  // check 11
constexpr double kMinDistinctRatio = 0.2;
constexpr double kMaxBigramShare = 0.3;

GarbageVerdict flag(std::string reason) {
  return {true, std::move(reason)};
}

std::string cp_name(char32_t cp) {
  return strprintf("U+%04X", unsigned(cp));
}

std::string cp_text(char32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return cp_name(cp);
  std::string s = "'";
  text::append_utf8(s, cp);
  return s + "'";
}

// Windows-1252's characters at 0x80..0x9F (the second byte of UTF-8 read as
// cp1252).
bool is_cp1252_high(char32_t cp) {
  static constexpr std::array<char32_t, 27> kChars = {
      0x20AC, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030,
      0x0160, 0x2039, 0x0152, 0x017D, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
      0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x017E, 0x0178};
  return std::find(kChars.begin(), kChars.end(), cp) != kChars.end();
}

std::optional<std::string> special_token_text(std::string_view s) {
  static constexpr std::array<std::string_view, 10> kTokens = {
      "<pad>",           "<eos>",         "<bos>",  "<unk>",   "</s>",
      "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]", "<unused"};
  for (std::string_view t : kTokens) {
    const size_t at = s.find(t);
    if (at == std::string_view::npos) continue;
    if (t != "<unused") return std::string(t);
    size_t end = at + t.size();
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    if (end > at + t.size() && end < s.size() && s[end] == '>')
      return std::string(s.substr(at, end + 1 - at));
  }
  for (size_t at = s.find("<|"); at != std::string_view::npos; at = s.find("<|", at + 2)) {
    const size_t close = s.find("|>", at + 2);
    if (close != std::string_view::npos && close - at <= 40)
      return std::string(s.substr(at, close + 2 - at));
  }
  return std::nullopt;
}

std::string join_words(const std::vector<std::string>& words, size_t from, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? " " : "") + words[from + i];
  return out;
}

// Check 10: the first word sequence (1..kMaxLoopWords long) repeated
// kMaxRepeats times back to back.
std::optional<std::string> repetition_loop(const std::vector<std::string>& words) {
  for (size_t n = 1; n <= kMaxLoopWords; ++n) {
    for (size_t start = 0; start + n * kMaxRepeats <= words.size(); ++start) {
      int reps = 1;
      size_t next = start + n;
      while (next + n <= words.size() &&
             std::equal(words.begin() + long(start), words.begin() + long(start + n),
                        words.begin() + long(next))) {
        ++reps;
        next += n;
      }
      if (reps >= kMaxRepeats)
        return strprintf("'%s' repeated %d times in a row", join_words(words, start, n).c_str(),
                         reps);
    }
  }
  return std::nullopt;
}

// Check 10, within words: a unit of kMinLoopChars..kMaxLoopChars code points,
// with a letter and not one character repeated, kMaxRepeats times back to back.
std::optional<std::string> character_loop(const std::vector<char32_t>& cps) {
  for (size_t p = kMinLoopChars; p <= kMaxLoopChars; ++p) {
    size_t same = 0;  // cps[j - same + 1 .. j] each equal their p-th successor
    for (size_t j = 0; j + p < cps.size(); ++j) {
      same = cps[j] == cps[j + p] ? same + 1 : 0;
      if (same < (kMaxRepeats - 1) * p) continue;
      const size_t start = j + 1 - same;
      const std::vector<char32_t> unit(cps.begin() + long(start), cps.begin() + long(start + p));
      const bool has_letter = std::any_of(unit.begin(), unit.end(),
                                          [](char32_t c) { return script_of(c) != Script::None; });
      const bool one_char =
          std::all_of(unit.begin(), unit.end(), [&](char32_t c) { return c == unit[0]; });
      if (!has_letter || one_char) continue;
      size_t end = j + p + 1;  // extend the loop to its end
      while (end < cps.size() && cps[end] == cps[end - p]) ++end;
      std::string shown;
      for (char32_t c : unit) text::append_utf8(shown, c);
      return strprintf("'%s' repeated %zu times in a row", shown.c_str(), (end - start) / p);
    }
  }
  return std::nullopt;
}

// Check 11.
std::optional<std::string> low_diversity(const std::vector<std::string>& words) {
  if (words.size() < kMinWordsForStats) return std::nullopt;
  const std::set<std::string> distinct(words.begin(), words.end());
  const double ratio = double(distinct.size()) / double(words.size());
  if (ratio < kMinDistinctRatio)
    return strprintf("only %zu distinct words of %zu", distinct.size(), words.size());
  std::map<std::string, size_t> bigrams;
  size_t top = 0;
  std::string top_bigram;
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    const std::string b = words[i] + " " + words[i + 1];
    const size_t c = ++bigrams[b];
    if (c > top) top = c, top_bigram = b;
  }
  const size_t total = words.size() - 1;
  if (double(top) > kMaxBigramShare * double(total))
    return strprintf("the bigram '%s' is %zu of %zu bigrams", top_bigram.c_str(), top, total);
  return std::nullopt;
}

}  // namespace

GarbageVerdict detect_garbage(std::string_view s, ScriptSet expected) {
  if (!text::is_valid_utf8(s)) return flag("invalid UTF-8");
  std::vector<char32_t> cps;
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    i += size_t(text::decode_utf8(s, i, &cp));
    cps.push_back(cp);
  }
  if (std::all_of(cps.begin(), cps.end(), text::is_unicode_whitespace))
    return flag(cps.empty() ? "empty output" : "whitespace only");

  for (size_t i = 0; i < cps.size(); ++i) {  // checks 3-5
    const char32_t cp = cps[i];
    if (cp == 0xFFFD) return flag("replacement character U+FFFD");
    const bool cr_lf = cp == U'\r' && i + 1 < cps.size() && cps[i + 1] == U'\n';
    if (((cp < 0x20 && cp != U'\t' && cp != U'\n' && !cr_lf) || (cp >= 0x7F && cp <= 0x9F)))
      return flag("control character " + cp_name(cp));
    if ((cp == 0x00C2 || cp == 0x00C3) && i + 1 < cps.size() &&
        ((cps[i + 1] >= 0x80 && cps[i + 1] <= 0xBF) || is_cp1252_high(cps[i + 1]))) {
      std::string shown;
      text::append_utf8(shown, cp);
      text::append_utf8(shown, cps[i + 1]);
      return flag("mojibake '" + shown + "' (UTF-8 read as Latin-1)");
    }
    if (cp == 0x00E2 && i + 1 < cps.size() && cps[i + 1] == 0x20AC)
      return flag("mojibake '\u00e2\u20ac' (UTF-8 read as Windows-1252)");
  }
  if (auto t = special_token_text(s)) return flag("special-token text " + *t);
  if (std::none_of(cps.begin(), cps.end(), is_word_char)) return flag("no word characters");

  size_t visible = 0;  // checks 8, 9
  std::map<char32_t, size_t> counts;
  for (size_t i = 0; i < cps.size();) {
    size_t j = i;
    while (j < cps.size() && cps[j] == cps[i]) ++j;
    if (!text::is_unicode_whitespace(cps[i])) {
      if (j - i >= size_t(kMaxRun))
        return flag(strprintf("a run of %zu ", j - i) + cp_text(cps[i]));
      visible += j - i;
      counts[cps[i]] += j - i;
    }
    i = j;
  }
  if (visible >= kMinCharsForShare) {
    for (const auto& [cp, n] : counts) {
      const bool digit = cp >= U'0' && cp <= U'9';
      if (!digit && 2 * n > visible)
        return flag(cp_text(cp) + strprintf(" is %zu of %zu characters", n, visible));
    }
  }

  std::vector<std::string> words;  // checks 10, 11
  std::string word;
  auto end_word = [&] {
    if (!word.empty()) words.push_back(fold_case(word));
    word.clear();
  };
  for (char32_t cp : cps) {
    if (is_ideographic(cp)) {
      end_word();
      text::append_utf8(word, cp);
      end_word();
    } else if (is_word_char(cp)) {
      text::append_utf8(word, cp);
    } else {
      end_word();
    }
  }
  end_word();
  if (auto r = repetition_loop(words)) return flag(*r);
  if (auto r = character_loop(cps)) return flag(*r);
  if (auto r = low_diversity(words)) return flag(*r);

  const ScriptSet found = scripts_in(s);  // check 12
  const int groups = __builtin_popcount(found);
  if (expected != 0 && groups >= 2 && (found & ~expected) != 0)
    return flag("mixed scripts " + script_set_name(found) + " (expected " +
                script_set_name(expected) + ")");
  if (expected == 0 && groups >= 3) return flag("mixed scripts " + script_set_name(found));
  return {};
}

}  // namespace tandem::coherence
