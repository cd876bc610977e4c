#include "model/gguf_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// The split regexes of transformers' tokenizer.json files for each
// tokenizer.ggml.pre value (llama.cpp names them the same way).
const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const std::vector<GgufValue>& require_array(const GgufFile& f, const char* key) {
  const GgufValue* v = f.find(key);
  if (!v) fail("%s: missing metadata \"%s\"", f.path().c_str(), key);
  if (!v->is_array())
    fail("%s: metadata \"%s\" must be an array, found %s", f.path().c_str(), key,
         gguf_value_type_name(v->type));
  return v->as_array();
}

std::vector<std::string> string_array(const GgufFile& f, const char* key) {
  std::vector<std::string> out;
  for (const GgufValue& x : require_array(f, key)) {
    if (!x.is_string())
      fail("%s: metadata \"%s\" must hold strings, found %s", f.path().c_str(), key,
           gguf_value_type_name(x.type));
    out.push_back(x.as_string());
  }
  return out;
}

// The token string of the id under `key`, "" when the key is absent.
std::string token_of(const GgufFile& f, const std::vector<std::string>& tokens, const char* key) {
  const int64_t id = f.get_int(key, -1);
  if (id < 0) return "";
  if (id >= int64_t(tokens.size()))
    fail("%s: metadata \"%s\" = %lld is not a token id (vocabulary of %zu)", f.path().c_str(), key,
         (long long)id, tokens.size());
  return tokens[size_t(id)];
}

bool get_bool(const GgufFile& f, const char* key, bool fallback) {
  const GgufValue* v = f.find(key);
  if (!v) return fallback;
  if (v->type != GgufValue::Type::Bool)
    fail("%s: metadata \"%s\" must be a bool, found %s", f.path().c_str(), key,
         gguf_value_type_name(v->type));
  return v->as_int() != 0;
}

json pre_tokenizer(const GgufFile& f, const std::string& pre, json* normalizer,
                   bool* ignore_merges) {
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  auto split = [&](const char* regex) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", regex}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  byte_level}}};
  };
  if (pre == "llama-bpe" || pre == "llama3") {
    *ignore_merges = true;
    return split(kLlama3Regex);
  }
  if (pre == "qwen2") {
    *normalizer = {{"type", "NFC"}};
    return split(kQwen2Regex);
  }
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2")
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  fail(
      "%s: tokenizer.ggml.pre \"%s\" is not supported (llama-bpe, qwen2, default); put the "
      "model's tokenizer.json beside the .gguf to use it instead",
      f.path().c_str(), pre.c_str());
}

// Code points of a UTF-8 string (Python's len()).
size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Added tokens: control (3) and user-defined (4) types, control ones special.
json added_tokens(const std::vector<std::string>& tokens, const std::vector<int64_t>& types) {
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 3 || types[i] == 4)
      added.push_back({{"id", int64_t(i)},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[i] == 3}});
  return added;
}

// The byte-fallback BPE tokenizer.json of SentencePiece-style vocabularies
// (Gemma): " " normalized to "▁" (and a "▁" prepended when
// tokenizer.ggml.add_space_prefix is true), no word splitting, "▁" decoded
// back to " " and <0xNN> pieces to their bytes.
json byte_fallback_bpe(const GgufFile& f, const std::vector<std::string>& tokens,
                       const std::vector<int64_t>& types, json vocab, json merges) {
  const std::string unk = token_of(f, tokens, "tokenizer.ggml.unknown_token_id");
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  json normalizer = replace;
  if (get_bool(f, "tokenizer.ggml.add_space_prefix", false))
    normalizer = {{"type", "Sequence"},
                  {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace}}};
  return {{"model",
           {{"type", "BPE"},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merges)},
            {"byte_fallback", true},
            {"fuse_unk", true},
            {"unk_token", unk.empty() ? json(nullptr) : json(unk)}}},
          {"normalizer", normalizer},
          {"pre_tokenizer",
           {{"type", "Split"},
            {"pattern", {{"String", " "}}},
            {"behavior", "MergedWithPrevious"},
            {"invert", false}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}}}}}},
          {"added_tokens", added_tokens(tokens, types)}};
}

// A SentencePiece BPE vocabulary (tokens + scores) as the BPE tokenizer.json
// transformers' converter makes of it: every piece in the vocab; the merges
// are every split of a piece into two pieces, ranked by the piece's score
// (descending), then the left and the right part's length in code points
// (descending), ties in piece order and, within a piece, by the parts' ids
// (transformers' SentencePieceExtractor); then byte_fallback_bpe.
json sentencepiece_json(const GgufFile& f, const std::vector<std::string>& tokens,
                        const std::vector<int64_t>& types) {
  std::vector<double> scores(tokens.size(), 0.0);
  if (f.find("tokenizer.ggml.scores")) {
    const auto& a = require_array(f, "tokenizer.ggml.scores");
    if (a.size() != tokens.size())
      fail("%s: tokenizer.ggml.scores has %zu entries for %zu tokens", f.path().c_str(), a.size(),
           tokens.size());
    for (size_t i = 0; i < a.size(); ++i) scores[i] = a[i].as_number();
  }
  std::unordered_map<std::string, int64_t> ids;
  ids.reserve(tokens.size());
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (ids.emplace(tokens[i], int64_t(i)).second) vocab[tokens[i]] = int64_t(i);
  struct Merge {
    int64_t left, right, piece;
    size_t left_len, right_len;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& p = tokens[i];
    const size_t first = merges.size();
    for (size_t k = 1; k < p.size(); ++k) {
      if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // inside a code point
      auto l = ids.find(p.substr(0, k)), r = ids.find(p.substr(k));
      if (l != ids.end() && r != ids.end())
        merges.push_back(
            {l->second, r->second, int64_t(i), code_points(l->first), code_points(r->first)});
    }
    std::sort(merges.begin() + ptrdiff_t(first), merges.end(), [](const Merge& a, const Merge& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
  }
  std::stable_sort(merges.begin(), merges.end(), [&](const Merge& a, const Merge& b) {
    const double sa = scores[size_t(a.piece)], sb = scores[size_t(b.piece)];
    if (sa != sb) return sa > sb;
    if (a.left_len != b.left_len) return a.left_len > b.left_len;
    return a.right_len > b.right_len;
  });
  json merge_list = json::array();
  for (const Merge& m : merges)
    merge_list.push_back({tokens[size_t(m.left)], tokens[size_t(m.right)]});
  return byte_fallback_bpe(f, tokens, types, std::move(vocab), std::move(merge_list));
}

// tokenizer.ggml.model "gemma4" (llama.cpp's converter for Gemma 4): a BPE
// over raw UTF-8 with its merges stored as "left right" strings, " " as "▁",
// byte fallback, no splitting into words: the layout of Gemma 4's own
// tokenizer.json. Every token, added ones too, is in the vocab, as there.
json gemma4_json(const GgufFile& f, const std::vector<std::string>& tokens,
                 const std::vector<int64_t>& types) {
  if (!f.find("tokenizer.ggml.merges"))
    fail("%s: tokenizer.ggml.model \"gemma4\" needs tokenizer.ggml.merges", f.path().c_str());
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (!vocab.contains(tokens[i])) vocab[tokens[i]] = int64_t(i);
  // The converter writes these special tokens as user-defined (4) so that
  // llama.cpp renders them for its chat parser; tokenizer.json has them
  // special (skipped by decode(ids, skip_special=true)), so they are again.
  static const char* const kDemoted[] = {"<|channel>",   "<channel|>",       "<|tool_call>",
                                         "<tool_call|>", "<|tool_response>", "<tool_response|>",
                                         "<|\"|>"};
  std::vector<int64_t> t = types;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (t[i] == 4 &&
        std::find(std::begin(kDemoted), std::end(kDemoted), tokens[i]) != std::end(kDemoted))
      t[i] = 3;
  json merges = json::array();
  for (const std::string& m : string_array(f, "tokenizer.ggml.merges")) {
    // llama.cpp splits at the first space after the first byte.
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos)
      fail("%s: tokenizer.ggml.merges entry \"%s\" is not \"left right\"", f.path().c_str(),
           m.c_str());
    merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
  }
  return byte_fallback_bpe(f, tokens, t, std::move(vocab), std::move(merges));
}

}  // namespace

GgufTokenizerJson gguf_tokenizer_json(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model", "");
  if (model.empty())
    fail("%s: no tokenizer in the GGUF metadata (tokenizer.ggml.model is missing)",
         f.path().c_str());
  if (model != "gpt2" && model != "llama" && model != "gemma4")
    fail(
        "%s: GGUF tokenizer model \"%s\" is not supported (\"gpt2\": byte-level BPE, "
        "\"llama\": SentencePiece BPE, \"gemma4\": Gemma 4's BPE); put the model's "
        "tokenizer.json (and tokenizer_config.json) beside the .gguf",
        f.path().c_str(), model.c_str());
  const std::vector<std::string> tokens = string_array(f, "tokenizer.ggml.tokens");
  std::vector<int64_t> types(tokens.size(), 1);
  if (f.find("tokenizer.ggml.token_type")) {
    const auto& t = require_array(f, "tokenizer.ggml.token_type");
    if (t.size() != tokens.size())
      fail("%s: tokenizer.ggml.token_type has %zu entries for %zu tokens", f.path().c_str(),
           t.size(), tokens.size());
    for (size_t i = 0; i < t.size(); ++i) types[i] = t[i].as_int();
  }
  json cfg = {{"add_bos_token", get_bool(f, "tokenizer.ggml.add_bos_token", model != "gpt2")},
              {"add_eos_token", get_bool(f, "tokenizer.ggml.add_eos_token", false)}};
  for (const auto& [name, key] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                                  {"eos_token", "tokenizer.ggml.eos_token_id"},
                                  {"pad_token", "tokenizer.ggml.padding_token_id"},
                                  {"unk_token", "tokenizer.ggml.unknown_token_id"}}) {
    const std::string t = token_of(f, tokens, key);
    if (!t.empty()) cfg[name] = t;
  }
  if (model == "llama") return {sentencepiece_json(f, tokens, types).dump(), cfg.dump()};
  if (model == "gemma4") return {gemma4_json(f, tokens, types).dump(), cfg.dump()};
  const std::vector<std::string> merges = f.find("tokenizer.ggml.merges")
                                              ? string_array(f, "tokenizer.ggml.merges")
                                              : std::vector<std::string>{};
  json normalizer = nullptr;
  bool ignore_merges = false;
  const json pre =
      pre_tokenizer(f, f.get_string("tokenizer.ggml.pre", "default"), &normalizer, &ignore_merges);

  json vocab = json::object();
  json added = added_tokens(tokens, types);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] != 3 && types[i] != 4 && !vocab.contains(tokens[i])) vocab[tokens[i]] = int64_t(i);
  json tok = {{"model",
               {{"type", "BPE"},
                {"vocab", std::move(vocab)},
                {"merges", merges},
                {"ignore_merges", ignore_merges},
                {"byte_fallback", false},
                {"fuse_unk", false}}},
              {"normalizer", normalizer},
              {"pre_tokenizer", pre},
              {"post_processor", nullptr},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", false},
                {"use_regex", false}}},
              {"added_tokens", std::move(added)}};
  return {tok.dump(), cfg.dump()};
}

text::Tokenizer gguf_tokenizer(const GgufFile& f) {
  const GgufTokenizerJson j = gguf_tokenizer_json(f);
  return text::Tokenizer::from_json_text(j.tokenizer, j.config, f.path() + " (GGUF tokenizer)");
}

std::string gguf_chat_template(const GgufFile& f) {
  return f.get_string("tokenizer.chat_template", "");
}

std::map<std::string, std::string> gguf_template_tokens(const GgufFile& f) {
  std::map<std::string, std::string> out;
  if (!f.find("tokenizer.ggml.tokens")) return out;
  const std::vector<std::string> tokens = string_array(f, "tokenizer.ggml.tokens");
  for (const auto& [name, key] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                                  {"eos_token", "tokenizer.ggml.eos_token_id"},
                                  {"pad_token", "tokenizer.ggml.padding_token_id"},
                                  {"unk_token", "tokenizer.ggml.unknown_token_id"}}) {
    const std::string t = token_of(f, tokens, key);
    if (!t.empty()) out[name] = t;
  }
  return out;
}

}  // namespace tandem
