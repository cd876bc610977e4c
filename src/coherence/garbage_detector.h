// The coherence gate's garbage detector: decides whether a model's reply is
// noise (the output of broken weights, a wrong tokenizer or chat template, a
// runaway decode) rather than language. Blocking in `tandem coherence`: a
// reply flagged here fails its case with the reason.
//
// Checks, in order (the first that fires is the verdict):
//  1. invalid UTF-8;
//  2. empty, or whitespace only;
//  3. U+FFFD (a replacement character: bytes that were not UTF-8);
//  4. a control character: C0 other than \t and \n (\r only directly before
//     \n), DEL, C1;
//  5. mojibake: UTF-8 read as Latin-1 / Windows-1252 — Â or Ã followed by a
//     code point in U+0080..U+00BF or one of the characters Windows-1252 puts
//     at 0x80..0x9F, or "â€";
//  6. special-token text: <unusedN>, <|...|> (within 40 bytes), <pad>,
//     <eos>, <bos>, <unk>, </s>, <start_of_turn>, <end_of_turn>, [INST],
//     [/INST];
//  7. no word character (script.h: letters, digits) at all;
//  8. a run of 20 or more of one non-whitespace character;
//  9. with 10 or more non-whitespace characters, one non-digit character
//     making up more than half of them;
// 10. a word, or a sequence of up to 4 words, repeated 4 or more times in a
//     row. Words are maximal runs of word characters, case folded; each Han
//     or Kana character is a word of its own. Likewise a sequence of 2 to 16
//     characters, with a letter and not all one character, repeated 4 or
//     more times back to back ("SESESESE", "GPIOGPIOGPIOGPIO", "hahahaha");
// 11. with 10 or more words: fewer than 20% distinct words, or one bigram
//     making up more than 30% of the bigrams;
// 12. a mix of scripts (script.h groups of the letters): with expected
//     scripts given, letters of two or more groups of which one is not
//     expected ("Tokyo東京" when Latin is expected; an all-CJK reply is not a
//     mix); with none given, letters of three or more groups.
// Pure function, thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "coherence/script.h"

namespace tandem::coherence {

struct GarbageVerdict {
  bool garbage = false;
  std::string reason;  // why, naming the offending text; "" when not garbage
};

// `expected`: the scripts a correct reply is written in (scripts_in of the
// accepted answers); 0 when unknown (a number, say).
GarbageVerdict detect_garbage(std::string_view text, ScriptSet expected = 0);

}  // namespace tandem::coherence
