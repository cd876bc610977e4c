// UTF-8 and Unicode helpers for the tokenizer: decoding/encoding code points,
// lossy UTF-8 repair (exactly Rust's String::from_utf8_lossy, which the
// `tokenizers` library uses), the GPT-2 byte-level alphabet, and Unicode
// normalization forms (NFC, NFD, NFKC, NFKD) from generated tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::text {

// Appends the UTF-8 encoding of cp (cp must be a scalar value <= 0x10FFFF).
void append_utf8(std::string& out, char32_t cp);

// Decodes one code point at s[i]; returns its length in bytes (1..4), or 0
// when s[i..] does not start with a complete, valid UTF-8 sequence.
int decode_utf8(std::string_view s, size_t i, char32_t* cp);

// Length of the code point starting at s[i] for a string known to be valid
// UTF-8 (from its lead byte).
inline int utf8_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

bool is_valid_utf8(std::string_view s);

// Like Rust's String::from_utf8_lossy: every maximal invalid subpart (as the
// Unicode standard's "substitution of maximal subparts" defines it) becomes
// one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Streaming form of utf8_lossy: the number of leading bytes of `bytes` whose
// lossy decoding can no longer change whatever bytes follow. Only a trailing
// incomplete-but-so-far-valid sequence (at most 3 bytes) is held back, so
//   utf8_lossy(b[0..k]) + utf8_lossy(b[k..]) == utf8_lossy(b)  for k = this.
size_t utf8_stable_prefix(std::string_view bytes);

// The GPT-2 byte-level alphabet: each byte maps to one printable code point
// (printable Latin-1 bytes to themselves, the rest to U+0100...).
char32_t byte_to_unicode(uint8_t b);
// Inverse; returns -1 for a code point outside the alphabet.
int unicode_to_byte(char32_t cp);

// White_Space property (what Rust's char::is_whitespace and Oniguruma's \s
// test).
bool is_unicode_whitespace(char32_t cp);

enum class NormForm { NFC, NFD, NFKC, NFKD };
// Normalizes valid UTF-8 text. Fast path: text that cannot change (ASCII, or
// no code point from the form's "unstable" set) is returned unchanged.
std::string normalize(std::string_view text, NormForm form);
const char* unicode_tables_version();

}  // namespace tandem::text
