// Loads a Mistral tekken.json (tiktoken-style byte BPE) into a TokenizerCore.
//
// Format (as mistral-common reads it):
//   config: {pattern, num_vocab_tokens, default_vocab_size,
//            default_num_special_tokens, version}
//   vocab: [{rank, token_bytes (base64), token_str}]   rank = position
//   special_tokens: [{rank, token_str, is_control}]    (absent in old files)
// Ids: special token of rank r -> id r (0 .. num_special-1); vocab token of
// rank r -> id num_special + r; only the first default_vocab_size -
// num_special vocab entries are used.
//
// Encoding is tiktoken's: split with `pattern`, then byte-pair merges where a
// pair may merge when its concatenation is a token, lowest rank first
// (leftmost on ties); a piece that is a whole token is emitted directly. Here
// that is expressed as a byte-level BPE whose merge table holds every split
// (a, b) of every token t with rank(t); ids equal tiktoken's.
//
// Differences from mistral-common, on purpose: special-token strings written
// in the text (e.g. "[INST]") are recognized as their ids, as HF conversions
// of tekken files do and as rendered chat templates need; mistral-common
// encodes them as plain text. encode(text, true) prepends <s> (BOS), as
// mistral-common's encode(bos=True).
//
// UNTESTED against a real Mistral tekken.json (none is available offline):
// tests use a synthetic file (tests/fixtures/tokenizer/tekken_tiny.json)
// checked against tiktoken. Old files without "special_tokens" get
// mistral-common's default names from memory; unverified.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "text/tokenizer_core.h"
#include "text/unicode.h"

namespace tandem::text {

using json = nlohmann::json;

namespace {

std::string base64_decode(const std::string& in, const std::string& path) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int v = val(c);
    if (v < 0) fail("%s: invalid base64 in token_bytes \"%s\"", path.c_str(), in.c_str());
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

std::string to_alphabet(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) append_utf8(s, byte_to_unicode(b));
  return s;
}

// mistral-common's names for the first special tokens of files that do not
// list them (unverified, see the file comment).
const char* const kDefaultSpecials[] = {"<unk>",
                                        "<s>",
                                        "</s>",
                                        "[INST]",
                                        "[/INST]",
                                        "[AVAILABLE_TOOLS]",
                                        "[/AVAILABLE_TOOLS]",
                                        "[TOOL_RESULTS]",
                                        "[/TOOL_RESULTS]",
                                        "[TOOL_CALLS]",
                                        "[IMG]",
                                        "<pad>",
                                        "[IMG_BREAK]",
                                        "[IMG_END]",
                                        "[PREFIX]",
                                        "[MIDDLE]",
                                        "[SUFFIX]",
                                        "[SYSTEM_PROMPT]",
                                        "[/SYSTEM_PROMPT]",
                                        "[TOOL_CONTENT]"};

}  // namespace

std::shared_ptr<TokenizerCore> load_tekken(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("%s: invalid JSON: %s", path.c_str(), e.what());
  }
  auto c = std::make_shared<TokenizerCore>();
  c->format = "tekken";
  c->source = path;
  try {
    const json& cfg = j.at("config");
    std::string pattern = cfg.at("pattern").get<std::string>();
    const json& vocab = j.at("vocab");
    int32_t n_special = cfg.contains("default_num_special_tokens")
                            ? cfg.at("default_num_special_tokens").get<int32_t>()
                            : static_cast<int32_t>(j.value("special_tokens", json::array()).size());
    int32_t vocab_size = cfg.contains("default_vocab_size")
                             ? cfg.at("default_vocab_size").get<int32_t>()
                             : n_special + static_cast<int32_t>(vocab.size());
    int32_t n_inner = std::min<int32_t>(vocab_size - n_special, static_cast<int32_t>(vocab.size()));
    if (n_special < 0 || n_inner <= 0)
      fail("%s: config gives %d special tokens and a vocab size of %d", path.c_str(), n_special,
           vocab_size);

    StringIdMap map;  // alphabet string -> id
    std::vector<std::string> raw(n_inner);
    StringIdMap raw_to_id;
    map.reserve(n_inner);
    raw_to_id.reserve(n_inner);
    for (int32_t r = 0; r < n_inner; ++r) {
      const json& e = vocab.at(r);
      int32_t rank = e.value("rank", r);
      if (rank != r)
        fail("%s: vocab entry %d has rank %d (expected entries in rank order)", path.c_str(), r,
             rank);
      raw[r] = base64_decode(e.at("token_bytes").get<std::string>(), path);
      map.emplace(to_alphabet(raw[r]), n_special + r);
      raw_to_id.emplace(raw[r], n_special + r);
    }
    BpeOptions opt;
    opt.ignore_merges = true;  // tiktoken emits a piece that is a token directly
    c->model = std::make_unique<BpeModel>(std::move(map), opt);
    for (int32_t r = 0; r < n_inner; ++r) {
      const std::string& t = raw[r];
      for (size_t k = 1; k < t.size(); ++k) {
        auto a = raw_to_id.find(std::string_view(t).substr(0, k));
        auto b = raw_to_id.find(std::string_view(t).substr(k));
        if (a != raw_to_id.end() && b != raw_to_id.end())
          c->model->add_merge_ids(a->second, b->second, r, n_special + r);
      }
    }
    c->model->enable_byte_level();
    c->pre = PreTokenizer::tiktoken_style(pattern);
    c->decoder = byte_level_decoder();

    std::vector<std::string> names(n_special);
    for (int32_t i = 0; i < n_special; ++i)
      names[i] = i < static_cast<int32_t>(std::size(kDefaultSpecials))
                     ? kDefaultSpecials[i]
                     : "<SPECIAL_" + std::to_string(i) + ">";
    if (j.contains("special_tokens")) {
      for (const json& s : j.at("special_tokens")) {
        int32_t rank = s.at("rank").get<int32_t>();
        if (rank >= 0 && rank < n_special) names[rank] = s.at("token_str").get<std::string>();
      }
    }
    for (int32_t i = 0; i < n_special; ++i) {
      AddedToken t;
      t.id = i;
      t.content = names[i];
      t.special = true;
      c->added.add(t);
    }
    c->added.build();
    c->index_tokens();
    auto find = [&](const char* name) {
      for (int32_t i = 0; i < n_special; ++i)
        if (names[i] == name) return i;
      return -1;
    };
    c->bos = find("<s>");
    c->eos = find("</s>");
    c->pad = find("<pad>");
    if (c->bos >= 0) c->bos_token = names[c->bos];
    if (c->eos >= 0) c->eos_token = names[c->eos];
    if (c->bos >= 0) c->prefix.push_back(c->bos);
  } catch (const json::exception& e) {
    fail("%s: unexpected tekken structure: %s", path.c_str(), e.what());
  }
  return c;
}

}  // namespace tandem::text
