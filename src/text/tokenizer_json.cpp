// Loads an HF `tokenizers` tokenizer.json (+ tokenizer_config.json) into a
// TokenizerCore. Supported model: BPE. Unsupported options throw
// tandem::Error naming the file, the key and the value.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "text/tokenizer_core.h"

namespace tandem::text {

using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("%s: invalid JSON: %s", path.c_str(), e.what());
  }
}

// A token setting of tokenizer_config.json: "tok", {"content": "tok"} or null.
std::string token_string(const json& j, const char* key) {
  if (!j.contains(key)) return {};
  const json& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return {};
}

std::unique_ptr<BpeModel> load_bpe(const json& m, const std::string& path) {
  std::string type = m.value("type", "BPE");
  if (type != "BPE")
    fail("%s: model type \"%s\" is not supported (only BPE)", path.c_str(), type.c_str());
  auto str_or_empty = [&](const char* key) {
    return m.contains(key) && m.at(key).is_string() ? m.at(key).get<std::string>() : std::string();
  };
  if (!str_or_empty("continuing_subword_prefix").empty() ||
      !str_or_empty("end_of_word_suffix").empty())
    fail("%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported", path.c_str());
  if (m.contains("dropout") && m.at("dropout").is_number() && m.at("dropout").get<double>() > 0)
    fail("%s: BPE dropout is not supported for inference", path.c_str());
  BpeOptions opt;
  opt.byte_fallback = m.value("byte_fallback", false);
  opt.fuse_unk = m.value("fuse_unk", false);
  opt.ignore_merges = m.value("ignore_merges", false);
  opt.unk_token = str_or_empty("unk_token");
  StringIdMap vocab;
  const json& v = m.at("vocab");
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) vocab.emplace(it.key(), it.value().get<int32_t>());
  auto model = std::make_unique<BpeModel>(std::move(vocab), opt);
  for (const json& mg : m.at("merges")) {
    if (mg.is_string()) {
      const std::string& s = mg.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("%s: merge \"%s\" is not two tokens separated by one space", path.c_str(), s.c_str());
      model->add_merge(std::string_view(s).substr(0, sp), std::string_view(s).substr(sp + 1));
    } else if (mg.is_array() && mg.size() == 2) {
      model->add_merge(mg[0].get_ref<const std::string&>(), mg[1].get_ref<const std::string&>());
    } else {
      fail("%s: merge %s is neither \"a b\" nor [\"a\", \"b\"]", path.c_str(), mg.dump().c_str());
    }
  }
  return model;
}

// Resolves a post-processor into the ids put before/after a single sequence.
void post_processor(const json& p, const std::string& path, TokenizerCore& c,
                    std::vector<int32_t>& pre, std::vector<int32_t>& post) {
  if (p.is_null()) return;
  std::string type = p.value("type", "");
  auto id_of = [&](const std::string& tok) {
    for (const auto& t : c.added.tokens())
      if (t.content == tok) return t.id;
    int32_t id = c.model->token_to_id(tok);
    if (id < 0)
      fail("%s: post-processor token \"%s\" is not in the vocab", path.c_str(), tok.c_str());
    return id;
  };
  if (type == "Sequence") {
    for (const json& q : p.at("processors")) {
      std::vector<int32_t> a, b;
      post_processor(q, path, c, a, b);
      pre.insert(pre.begin(), a.begin(), a.end());
      post.insert(post.end(), b.begin(), b.end());
    }
  } else if (type == "ByteLevel") {
    // Offsets only; ids unchanged.
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    const json& specials = p.value("special_tokens", json::object());
    for (const json& item : p.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken"))
        fail("%s: TemplateProcessing item %s not understood", path.c_str(), item.dump().c_str());
      std::string name = item.at("SpecialToken").at("id").get<std::string>();
      std::vector<int32_t> ids;
      if (specials.contains(name))
        ids = specials.at(name).at("ids").get<std::vector<int32_t>>();
      else
        ids.push_back(id_of(name));
      auto& dst = seen_a ? post : pre;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    // {"cls": ["<s>", 0], "sep": ["</s>", 2]}
    pre.push_back(p.at("cls").at(1).get<int32_t>());
    post.push_back(p.at("sep").at(1).get<int32_t>());
  } else {
    fail(
        "%s: post_processor type \"%s\" is not supported (supported: TemplateProcessing, "
        "ByteLevel, RobertaProcessing, BertProcessing, Sequence)",
        path.c_str(), type.c_str());
  }
}

// Special tokens transformers registers by default for a tokenizer class
// (they are skipped by skip_special_tokens even when the added token is not
// marked special). GemmaTokenizer's mask token "<mask>" is the one case seen.
std::vector<std::string> class_default_specials(const std::string& cls) {
  if (cls == "GemmaTokenizer" || cls == "GemmaTokenizerFast") return {"<mask>"};
  return {};
}

}  // namespace

namespace {

// The tokenizer of parsed tokenizer.json `j` and tokenizer_config.json `cfg`
// (nullptr: none); `path` names the source in errors.
std::shared_ptr<TokenizerCore> load_parsed(const json& j, const json* cfg_ptr,
                                           const std::string& path) {
  auto c = std::make_shared<TokenizerCore>();
  c->format = "tokenizer.json";
  c->source = path;
  try {
    c->model = load_bpe(j.at("model"), path);
    c->normalizer = Normalizer::from_json(j.value("normalizer", json()));
    c->pre = PreTokenizer::from_json(j.value("pre_tokenizer", json()));
    if (c->pre && c->pre->is_byte_level()) c->model->enable_byte_level();
    for (const json& a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.id = a.at("id").get<int32_t>();
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
      c->added.add(t);
    }
    c->added.build();
    c->decoder = decoder_from_json(j.value("decoder", json()));
    c->index_tokens();
    post_processor(j.value("post_processor", json()), path, *c, c->prefix, c->suffix);
  } catch (const json::exception& e) {
    fail("%s: unexpected structure: %s", path.c_str(), e.what());
  }

  if (!cfg_ptr) return c;
  const json& cfg = *cfg_ptr;
  auto id_or_none = [&](const std::string& tok) -> int32_t {
    if (tok.empty()) return -1;
    for (const auto& t : c->added.tokens())
      if (t.content == tok) return t.id;
    return c->model->token_to_id(tok);
  };
  c->bos_token = token_string(cfg, "bos_token");
  c->eos_token = token_string(cfg, "eos_token");
  c->bos = id_or_none(c->bos_token);
  c->eos = id_or_none(c->eos_token);
  c->pad = id_or_none(token_string(cfg, "pad_token"));
  // transformers rebuilds the template from these flags when the config sets them.
  if (cfg.contains("add_bos_token") || cfg.contains("add_eos_token")) {
    c->prefix.clear();
    c->suffix.clear();
    if (cfg.value("add_bos_token", false) && c->bos >= 0) c->prefix.push_back(c->bos);
    if (cfg.value("add_eos_token", false) && c->eos >= 0) c->suffix.push_back(c->eos);
  }
  // Named special tokens count as special for skip_special_tokens.
  std::vector<std::string> named;
  for (const char* k :
       {"bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "cls_token", "sep_token"})
    named.push_back(token_string(cfg, k));
  for (const char* k : {"additional_special_tokens", "extra_special_tokens"}) {
    if (!cfg.contains(k)) continue;
    for (const json& v : cfg.at(k)) {
      if (v.is_string()) named.push_back(v.get<std::string>());
      if (v.is_object() && v.contains("content"))
        named.push_back(v.at("content").get<std::string>());
    }
  }
  if (!cfg.contains("mask_token"))
    for (auto& s : class_default_specials(cfg.value("tokenizer_class", ""))) named.push_back(s);
  for (const std::string& s : named) {
    int32_t id = id_or_none(s);
    if (id >= 0 && id < static_cast<int32_t>(c->special.size())) c->special[id] = 1;
  }
  return c;
}

}  // namespace

std::shared_ptr<TokenizerCore> load_tokenizer_json(const std::string& path,
                                                   const std::string& config_path) {
  const json j = read_json(path);
  if (config_path.empty()) return load_parsed(j, nullptr, path);
  const json cfg = read_json(config_path);
  return load_parsed(j, &cfg, path);
}

std::shared_ptr<TokenizerCore> load_tokenizer_json_text(const std::string& tokenizer_json,
                                                        const std::string& config_json,
                                                        const std::string& source) {
  auto parse = [&](const std::string& text) {
    try {
      return json::parse(text);
    } catch (const json::exception& e) {
      fail("%s: invalid JSON: %s", source.c_str(), e.what());
    }
  };
  const json j = parse(tokenizer_json);
  if (config_json.empty()) return load_parsed(j, nullptr, source);
  const json cfg = parse(config_json);
  return load_parsed(j, &cfg, source);
}

}  // namespace tandem::text
