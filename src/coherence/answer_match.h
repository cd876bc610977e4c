// Answer matching for the coherence gate: normalized exact match, and the
// reasoning markers that must never reach a reply's content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::coherence {

// The comparable form of an answer:
//  - invalid UTF-8 repaired (U+FFFD), NFKC (fullwidth forms become ASCII),
//    case folded (script.h: fold_case);
//  - from both ends, repeatedly: whitespace, quotes (" ' “ ” ‘ ’ « » „ ‹ ›
//    「 」 『 』), markdown emphasis (* _ `); from the start also ¿ ¡; from the
//    end also punctuation . , ! ? ; : … and the CJK forms 。 ． ， 、 ！ ？
//    ； ： (NFKC already turned ！ ？ ， ； ： ． into ASCII);
//  - inner whitespace runs collapsed to one space.
// "**Tokyo.**" -> "tokyo", "「東京」。" -> "東京", "  Seven!\n" -> "seven".
std::string normalize_answer(std::string_view text);

// Whether `answer` normalizes equal to one of `accepted` (normalized too).
bool answer_matches(std::string_view answer, const std::vector<std::string>& accepted);

// The first reasoning marker found in `content` — <think>, </think>,
// <|channel>, <channel|>, <|channel|>, [THINK], [/THINK] (the families of
// text/reasoning_parser.h, plus Harmony's channel tag), compared without
// regard to ASCII case — or "" when there is none.
std::string find_reasoning_marker(std::string_view content);

}  // namespace tandem::coherence
