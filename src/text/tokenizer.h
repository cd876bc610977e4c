// Tokenizer: text <-> token ids for the models tandem serves.
//
// Formats:
//  - tokenizer.json (HF `tokenizers`): BPE models, byte-level (Llama 3, Qwen)
//    or SentencePiece-style with byte fallback (Gemma 3); the normalizers,
//    pre-tokenizers, post-processors and decoders listed in normalizer.h,
//    pretokenize.h and decoder.h; added tokens (added_vocab.h). Settings of a
//    tokenizer_config.json beside it: bos/eos tokens, add_bos_token /
//    add_eos_token (which replace the post-processor's template, as
//    transformers does), and the special tokens transformers skips.
//  - tekken.json (Mistral): see tekken.cpp.
//
// encode(text, true) equals transformers' `tokenizer(text).input_ids`;
// encode(text, false) its add_special_tokens=False form; decode(ids, skip)
// equals `tokenizer.decode(ids, skip_special_tokens=skip)` (transformers 5
// applies no clean-up of spaces for BPE tokenizers, and neither does tandem).
// Added/special tokens written in the text are always recognized.
//
// Input text must be UTF-8; invalid sequences are replaced by U+FFFD first
// (the reference library only accepts valid strings).
//
// A Tokenizer is immutable after load and safe to use from many threads.
// Copies share the loaded data.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::text {

struct TokenizerCore;

class Detokenizer;

class Tokenizer {
 public:
  // path: a model folder (tokenizer.json [+ tokenizer_config.json], or
  // tekken.json), a tokenizer.json file, or a tekken.json file. Throws
  // tandem::Error naming the file and the problem.
  static Tokenizer load(const std::string& path);
  // A tokenizer from the texts of a tokenizer.json and its tokenizer_config.json
  // ("" = none), e.g. built from GGUF metadata; `source` names it in errors.
  static Tokenizer from_json_text(const std::string& tokenizer_json, const std::string& config_json,
                                  const std::string& source);

  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  std::string decode(std::initializer_list<int32_t> ids, bool skip_special = false) const {
    return decode(std::span<const int32_t>(ids.begin(), ids.size()), skip_special);
  }
  // A streaming decoder; see detokenizer.h.
  Detokenizer detokenizer(bool skip_special = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  std::string id_to_token(int32_t id) const;          // "" when out of range
  bool is_special(int32_t id) const;                  // skipped by decode(..., skip_special=true)
  bool is_added(int32_t id) const;                    // an added token (matched before BPE)

  int32_t bos_id() const;  // -1 when the tokenizer has none
  int32_t eos_id() const;
  int32_t pad_id() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  // Ids the post-processor puts around a text when add_special is true.
  const std::vector<int32_t>& prefix_ids() const;
  const std::vector<int32_t>& suffix_ids() const;
  // Number of ids (one past the largest id, added tokens included).
  int32_t vocab_size() const;
  // "tokenizer.json" or "tekken".
  const std::string& format() const;
  // The file the tokenizer was loaded from.
  const std::string& source() const;

  std::shared_ptr<const TokenizerCore> core() const { return core_; }

 private:
  std::shared_ptr<const TokenizerCore> core_;
};

}  // namespace tandem::text
