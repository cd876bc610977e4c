// A compiled PCRE2 regular expression (UTF + UCP, JIT-compiled) for the
// tokenizer's Split pre-tokenizers and Replace normalizers.
//
// Patterns come from tokenizer.json, written for Oniguruma (the `tokenizers`
// library) or Rust's regex crates (tiktoken). PCRE2's \s also matches U+180E,
// which Oniguruma's (the White_Space property) does not, so \s and \S are
// rewritten to the explicit White_Space set before compiling. \p{L}, \p{N},
// lookahead and (?i:...) need no change.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::text {

class Regex {
 public:
  // Throws tandem::Error naming the pattern and PCRE2's message on failure.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of all non-overlapping matches in
  // `text` (valid UTF-8) to `out`, left to right. Empty matches are skipped
  // (the search moves on by one code point). Thread-safe.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

  // The rewrite applied to Oniguruma patterns (exposed for tests).
  static std::string translate(const std::string& pattern);

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace tandem::text
