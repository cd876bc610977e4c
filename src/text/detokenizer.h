// Detokenizer: incremental, UTF-8-safe decoding of a token stream.
//
//   Detokenizer d = tok.detokenizer(/*skip_special=*/true);
//   for (id : generated) send(d.push(id));
//   send(d.flush());
//
// Contract:
//  - push() returns only complete UTF-8 text: never half a code point. Bytes
//    that a later token may complete are held back: a trailing incomplete
//    UTF-8 sequence of byte-level tokens, or a run of <0xNN> byte-fallback
//    tokens (held whole until a non-byte token ends it, because
//    `tokenizers` turns an invalid run into one U+FFFD per byte).
//  - The concatenation of every push() and the final flush() equals
//    Tokenizer::decode(all ids, skip_special) exactly.
//  - Ids outside the vocabulary are ignored (as `tokenizers` does); with
//    skip_special, special tokens are dropped before the decoder sees them.
// Not thread-safe (one per stream); cheap to create.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "text/decoder.h"

namespace tandem::text {

struct TokenizerCore;

class Detokenizer {
 public:
  Detokenizer(std::shared_ptr<const TokenizerCore> core, bool skip_special);

  std::string push(int32_t id);
  std::string flush();
  // Forgets the stream (held-back bytes included), keeps the settings.
  void reset();

 private:
  std::shared_ptr<const TokenizerCore> core_;
  bool skip_special_;
  ChainRunner runner_;
};

}  // namespace tandem::text
