#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/jinja/error.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read %s", p.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::ordered_json read_json(const fs::path& p) {
  try {
    return nlohmann::ordered_json::parse(read_file(p));
  } catch (const nlohmann::json::exception& e) {
    fail("%s: invalid JSON: %s", p.c_str(), e.what());
  }
}

const char* const kSpecialKeys[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                    "sep_token", "cls_token", "mask_token"};

}  // namespace

void ChatTemplate::add(const std::string& name, const std::string& source) {
  Entry e;
  e.source = source;
  try {
    e.tpl = std::make_shared<jinja::Template>(source);
  } catch (const jinja::TemplateError& err) {
    e.parse_error = err.what();
  }
  templates_[name] = std::move(e);
}

ChatTemplate ChatTemplate::from_string(const std::string& source,
                                       std::map<std::string, std::string> special_tokens) {
  ChatTemplate t;
  t.add("default", source);
  t.special_tokens_ = std::move(special_tokens);
  return t;
}

ChatTemplate ChatTemplate::from_folder(const std::string& dir) {
  ChatTemplate t;
  const fs::path root(dir);
  const fs::path cfg_path = root / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    nlohmann::ordered_json cfg = read_json(cfg_path);
    if (!cfg.is_object()) fail("%s: expected a JSON object", cfg_path.c_str());
    for (const char* key : kSpecialKeys) {
      auto it = cfg.find(key);
      if (it == cfg.end()) continue;
      if (it->is_string() && !it->get<std::string>().empty())
        t.special_tokens_[key] = it->get<std::string>();
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        t.special_tokens_[key] = (*it)["content"].get<std::string>();
    }
    auto ct = cfg.find("chat_template");
    if (ct != cfg.end()) {
      if (ct->is_string()) {
        t.add("default", ct->get<std::string>());
      } else if (ct->is_array()) {
        for (const auto& item : *ct) {
          if (!item.is_object() || !item.contains("name") || !item.contains("template") ||
              !item["name"].is_string() || !item["template"].is_string())
            fail("%s: chat_template list items must be {\"name\": ..., \"template\": ...}",
                 cfg_path.c_str());
          t.add(item["name"].get<std::string>(), item["template"].get<std::string>());
        }
      } else if (!ct->is_null()) {
        fail("%s: chat_template must be a string or a list", cfg_path.c_str());
      }
    }
  }
  if (fs::exists(root / "chat_template.jinja")) {
    t.add("default", read_file(root / "chat_template.jinja"));
  } else if (fs::exists(root / "chat_template.json")) {
    nlohmann::ordered_json j = read_json(root / "chat_template.json");
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      t.add("default", j["chat_template"].get<std::string>());
  }
  const fs::path extra = root / "additional_chat_templates";
  if (fs::is_directory(extra)) {
    for (const auto& e : fs::directory_iterator(extra))
      if (e.path().extension() == ".jinja") t.add(e.path().stem().string(), read_file(e.path()));
  }
  if (t.templates_.empty())
    fail(
        "%s: no chat template (looked for chat_template in tokenizer_config.json, "
        "chat_template.jinja, chat_template.json)",
        dir.c_str());
  return t;
}

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> n;
  for (const auto& kv : templates_) n.push_back(kv.first);
  return n;
}

const std::string& ChatTemplate::select(bool has_tools) const {
  if (templates_.size() == 1) return templates_.begin()->first;
  if (has_tools && templates_.count("tool_use")) return templates_.find("tool_use")->first;
  if (templates_.count("default")) return templates_.find("default")->first;
  fail(
      "This model has multiple chat templates with no default specified! Please either pass a "
      "chat template or the name of the template you wish to use to the `chat_template` "
      "argument. Available template names are %s.",
      [&] {
        std::string s;
        for (const auto& kv : templates_) s += (s.empty() ? "" : ", ") + kv.first;
        return s;
      }()
          .c_str());
}

const std::string& ChatTemplate::source(const std::string& name) const {
  auto it = templates_.find(name);
  if (it == templates_.end()) fail("no chat template named \"%s\"", name.c_str());
  return it->second.source;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages,
                                 const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_kwargs,
                                 const jinja::RenderOptions& opts) const {
  if (!messages.is_array()) fail("messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) fail("tools must be null or a JSON array");
  if (!extra_kwargs.is_null() && !extra_kwargs.is_object())
    fail("template kwargs must be a JSON object");
  const Entry& e = templates_.at(select(!tools.is_null()));
  if (!e.tpl) throw tandem::Error(e.parse_error);

  std::vector<std::pair<std::string, jinja::Value>> vars;
  for (const auto& kv : special_tokens_)
    vars.emplace_back(kv.first, jinja::Value::string(kv.second));
  if (extra_kwargs.is_object()) {
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
        fail("render() got multiple values for keyword argument '%s'", k.c_str());
      vars.emplace_back(k, jinja::from_json(it.value()));
    }
  }
  vars.emplace_back("messages", jinja::from_json(messages));
  vars.emplace_back("tools", tools.is_null() ? jinja::Value::none() : jinja::from_json(tools));
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  return e.tpl->render(vars, opts);
}

}  // namespace tandem
