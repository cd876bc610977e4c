// The loaded state behind a Tokenizer (shared by its copies and by its
// Detokenizers). Built by load_tokenizer_json() and load_tekken(); read-only
// afterwards except for the BPE model's internal cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/added_vocab.h"
#include "text/bpe.h"
#include "text/decoder.h"
#include "text/normalizer.h"
#include "text/pretokenize.h"

namespace tandem::text {

struct TokenizerCore {
  std::string format;  // "tokenizer.json" | "tekken"
  std::string source;  // file path

  std::unique_ptr<Normalizer> normalizer;  // may be null
  std::unique_ptr<PreTokenizer> pre;       // may be null
  std::unique_ptr<BpeModel> model;
  AddedVocab added;
  DecoderChain decoder;

  // Per id (size = vocab_size): the token string fed to the decoder (vocab
  // string, or an added token's content), and flags.
  std::vector<std::string> tokens;
  std::vector<uint8_t> special;  // skipped by skip_special
  std::vector<uint8_t> added_flag;

  std::vector<int32_t> prefix, suffix;  // post-processor, single sequence
  int32_t bos = -1, eos = -1, pad = -1;
  std::string bos_token, eos_token;

  // Encodes text with no post-processing (added tokens recognized).
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  // Encodes one stretch between added tokens (normalize, pre-tokenize, BPE).
  void encode_stretch(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  // Sizes tokens/special/added_flag from the model vocab and added tokens.
  void index_tokens();
};

// Loaders (tokenizer_json.cpp, tekken.cpp). config_path may be empty.
std::shared_ptr<TokenizerCore> load_tokenizer_json(const std::string& path,
                                                   const std::string& config_path);
std::shared_ptr<TokenizerCore> load_tekken(const std::string& path);
// The same from the texts of a tokenizer.json and a tokenizer_config.json
// ("" = none), built in memory (GGUF metadata); `source` names them in errors.
std::shared_ptr<TokenizerCore> load_tokenizer_json_text(const std::string& tokenizer_json,
                                                        const std::string& config_json,
                                                        const std::string& source);

}  // namespace tandem::text
