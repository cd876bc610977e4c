// Code point classes for the coherence gate (tandem coherence): which writing
// system a letter belongs to, what counts as a word character, and a simple
// case fold. Table-free range checks covering the scripts the supported
// models write; code points outside the listed ranges are "not a letter".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::coherence {

// Script groups. Cjk is Han + Kana + Hangul + Bopomofo together (Japanese
// mixes Han and Kana; one group keeps that from counting as a mix). Other:
// letters of the remaining listed scripts (Ethiopic, Khmer, Lao, ...).
enum class Script : uint8_t {
  None,  // not a letter: digits, punctuation, symbols, marks, emoji, ...
  Latin,
  Greek,
  Cyrillic,
  Armenian,
  Hebrew,
  Arabic,
  Indic,
  Thai,
  Georgian,
  Cjk,
  Other,
};
constexpr int kScriptCount = int(Script::Other) + 1;

// A set of scripts as a bit mask (bit i = Script(i)); Script::None is never in it.
using ScriptSet = uint32_t;
inline ScriptSet script_bit(Script s) {
  return s == Script::None ? 0u : 1u << unsigned(s);
}

const char* script_name(Script s);  // "Latin", "CJK", ...
// "Latin+Cyrillic" (in enum order); "none" for the empty set.
std::string script_set_name(ScriptSet set);

// The script of a letter; Script::None for anything that is not a letter.
Script script_of(char32_t cp);

// Letters, decimal digits (ASCII, fullwidth, Arabic-Indic) and combining
// marks: what words (garbage_detector.h) are made of.
bool is_word_char(char32_t cp);

// Han and Kana characters are words on their own (those scripts put no
// spaces between words).
bool is_ideographic(char32_t cp);

// The scripts of the letters in valid UTF-8 text.
ScriptSet scripts_in(std::string_view text);

// Simple lower-casing of Latin, Greek, Cyrillic and Armenian capitals (the
// rest unchanged). fold_case also maps ß/ẞ to "ss" and final sigma to sigma,
// like Unicode full case folding does for those; input must be valid UTF-8.
char32_t to_lower(char32_t cp);
std::string fold_case(std::string_view text);

}  // namespace tandem::coherence
