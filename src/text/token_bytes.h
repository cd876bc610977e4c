// The bytes each token of a vocabulary writes, for grammar masks
// (text/grammar.h): byte-level tokens (GPT-2 alphabet) mapped back to bytes,
// byte-fallback tokens (<0xNN>) as their byte, other tokens decoded by the
// tokenizer's decoder chain (so "▁" is a space). Special tokens are not
// usable (usable[id] == 0); added non-special tokens write their content.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/grammar.h"
#include "text/tokenizer.h"

namespace tandem::text {

struct TokenBytes {
  std::vector<std::string> bytes;  // per id
  std::vector<uint8_t> usable;     // per id: may appear in constrained output
};

TokenBytes token_bytes(const Tokenizer& tok);

// A vocabulary for grammar masks: the bytes per id and the trie of the usable
// tokens. Build once per tokenizer and share.
struct TokenVocab {
  TokenBytes tokens;
  TokenTrie trie;
};
std::shared_ptr<const TokenVocab> token_vocab(const Tokenizer& tok);

}  // namespace tandem::text
