// A GGUF file's tokenizer and chat template, from its metadata.
//
// tokenizer.ggml.model "gpt2" (byte-level BPE) is translated into the
// tokenizer.json + tokenizer_config.json a transformers checkpoint carries and
// loaded by the same code (text/tokenizer.h):
//  - tokens whose token_type is 3 (control) or 4 (user-defined) become added
//    tokens (control ones special), every other token is in the BPE vocab;
//  - tokenizer.ggml.merges are the BPE merges;
//  - tokenizer.ggml.pre picks the pre-tokenizer: "llama-bpe" (Llama 3: its
//    split regex, and whole words found in the vocab skip the merges),
//    "qwen2" (Qwen2/Qwen3: NFC, its split regex), "default"/"gpt2" or absent
//    (GPT-2's byte-level regex); any other value is an Error;
//  - bos/eos/padding ids name the tokenizer_config.json tokens, and
//    tokenizer.ggml.add_bos_token / add_eos_token (default: false) decide
//    what encode(text, true) adds.
// tokenizer.ggml.model "llama" (SentencePiece BPE, Gemma) becomes the
// byte-fallback BPE tokenizer.json transformers' converter makes: every piece
// in the vocab, merges rebuilt from the scores (sentencepiece_json in the
// .cpp states the ranking), " " → "▁" (plus a leading "▁" when
// tokenizer.ggml.add_space_prefix is true), add_bos_token defaulting to true.
// tokenizer.ggml.model "gemma4" (llama.cpp's converter for Gemma 4) becomes
// the tokenizer.json Gemma 4 ships: a byte-fallback BPE over raw UTF-8 with
// tokenizer.ggml.merges as its merges ("left right", split at the first space
// after the first byte, as llama.cpp does), every token in the vocab,
// " " → "▁", no word splitting, add_bos_token defaulting to true (llama.cpp
// forces it for Gemma 4; the converter writes true). The converter's
// user-defined chat tokens (<|channel>, <|tool_call>, ...) are special again,
// as in tokenizer.json; tokenizer.ggml.pre is not read (llama.cpp ignores it).
// Other tokenizer models (bert, t5, rwkv, ...) are an Error that says to put
// the model's tokenizer.json beside the .gguf (server/model_text.cpp then
// uses it).
#pragma once

#include <map>
#include <string>

#include "model/gguf.h"
#include "text/tokenizer.h"

namespace tandem {

// The translated tokenizer.json and tokenizer_config.json texts.
struct GgufTokenizerJson {
  std::string tokenizer;
  std::string config;
};
GgufTokenizerJson gguf_tokenizer_json(const GgufFile& f);

// gguf_tokenizer_json loaded.
text::Tokenizer gguf_tokenizer(const GgufFile& f);

// tokenizer.chat_template, "" when absent.
std::string gguf_chat_template(const GgufFile& f);

// The special tokens a chat template sees (bos_token, eos_token, ... as strings).
std::map<std::string, std::string> gguf_template_tokens(const GgufFile& f);

}  // namespace tandem
