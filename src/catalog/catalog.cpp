#include "catalog/catalog.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tandem::catalog {

namespace {

using json = nlohmann::json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unknown value";
  }
}

// Reads the fields of one JSON object. An unknown key is reported first (a
// misspelt key would otherwise surface as a "missing" one). Every error names
// `where` (source and path).
class Fields {
 public:
  Fields(const json& obj, std::string where, std::initializer_list<const char*> known)
      : obj_(obj), where_(std::move(where)) {
    if (!obj_.is_object()) fail("%s: must be an object, got %s", where_.c_str(), type_name(obj_));
    std::string list;
    for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (std::none_of(known.begin(), known.end(), [&](const char* k) { return it.key() == k; }))
        fail("%s: unknown key \"%s\" (known keys: %s)", where_.c_str(), it.key().c_str(),
             list.c_str());
  }

  bool has(const char* key) const { return obj_.contains(key); }

  const json* get(const char* key, bool required) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      if (required) fail("%s: missing required field \"%s\"", where_.c_str(), key);
      return nullptr;
    }
    return &*it;
  }

  [[noreturn]] void bad(const char* key, const char* expected, const json& v) const {
    fail("%s: field \"%s\" must be %s, got %s", where_.c_str(), key, expected, type_name(v));
  }

  std::string str(const char* key, bool required, bool allow_null = false) const {
    const json* v = get(key, required);
    if (!v || (allow_null && v->is_null())) return "";
    if (!v->is_string() || v->get<std::string>().empty())
      bad(key, allow_null ? "a non-empty string or null" : "a non-empty string", *v);
    return v->get<std::string>();
  }

  int64_t positive_int(const char* key, bool required) const {
    const json* v = get(key, required);
    if (!v) return 0;
    if (!v->is_number_integer() || v->get<int64_t>() <= 0) bad(key, "a positive integer", *v);
    return v->get<int64_t>();
  }

  std::optional<double> number(const char* key, double lo, double hi) const {
    const json* v = get(key, false);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(key, "a number", *v);
    const double d = v->get<double>();
    if (d < lo || d > hi)
      fail("%s: field \"%s\" must be in [%g, %g], got %g", where_.c_str(), key, lo, hi, d);
    return d;
  }

  bool boolean(const char* key) const {
    const json* v = get(key, false);
    if (!v) return false;
    if (!v->is_boolean()) bad(key, "true or false", *v);
    return v->get<bool>();
  }

  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
};

bool one_of(const std::string& v, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (v == o) return true;
  return false;
}

bool valid_repo_id(const std::string& repo) {
  const size_t slash = repo.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == repo.size()) return false;
  if (repo.find('/', slash + 1) != std::string::npos) return false;
  for (char c : repo)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '/'))
      return false;
  return repo.find("..") == std::string::npos;
}

Entry parse_entry(const std::string& name, const json& value, const std::string& source) {
  Fields f(value, source + ": alias \"" + name + "\"",
           {"repo", "revision", "family", "modalities", "format", "quantization", "size_bytes",
            "context_length", "sampling", "reasoning_parser", "tool_call_parser", "gated",
            "description", "retired", "replacement"});
  Entry e;
  e.name = name;
  e.retired = f.str("retired", false);
  const bool live = !f.has("retired");
  e.replacement = f.str("replacement", false);
  if (live && !e.replacement.empty())
    fail("%s: \"replacement\" is only for retired aliases", f.where().c_str());

  e.repo = f.str("repo", live);
  if (!e.repo.empty() && !valid_repo_id(e.repo))
    fail("%s: field \"repo\" must be a Hugging Face repo id \"org/name\", got \"%s\"",
         f.where().c_str(), e.repo.c_str());
  const std::string rev = f.str("revision", live);
  if (!rev.empty()) e.revision = rev;
  e.family = f.str("family", live);

  if (const json* m = f.get("modalities", live)) {
    if (!m->is_array() || m->empty()) f.bad("modalities", "a non-empty array of strings", *m);
    for (const json& x : *m) {
      if (!x.is_string() || !one_of(x.get<std::string>(), {"text", "vision"}))
        fail("%s: field \"modalities\" holds %s; each must be \"text\" or \"vision\"",
             f.where().c_str(), x.dump().c_str());
      e.modalities.push_back(x.get<std::string>());
    }
    if (std::find(e.modalities.begin(), e.modalities.end(), "text") == e.modalities.end())
      fail("%s: field \"modalities\" must include \"text\"", f.where().c_str());
  }

  e.format = f.str("format", live);
  if (!e.format.empty() && !one_of(e.format, {"safetensors", "mlx"}))
    fail("%s: field \"format\" must be \"safetensors\" or \"mlx\", got \"%s\"", f.where().c_str(),
         e.format.c_str());
  e.quantization = f.str("quantization", live);
  if (!e.quantization.empty() &&
      !one_of(e.quantization, {"bf16", "f16", "f32", "8bit", "6bit", "4bit", "3bit"}))
    fail(
        "%s: field \"quantization\" must be one of bf16, f16, f32, 8bit, 6bit, 4bit, 3bit, got "
        "\"%s\"",
        f.where().c_str(), e.quantization.c_str());
  e.size_bytes = uint64_t(f.positive_int("size_bytes", live));
  e.context_length = f.positive_int("context_length", live);

  if (const json* s = f.get("sampling", live)) {
    Fields sf(*s, f.where() + ": field \"sampling\"", {"temperature", "top_p", "top_k", "min_p"});
    e.sampling.temperature = sf.number("temperature", 0.0, 2.0);
    e.sampling.top_p = sf.number("top_p", 0.0, 1.0);
    e.sampling.min_p = sf.number("min_p", 0.0, 1.0);
    if (const json* k = sf.get("top_k", false)) {
      if (!k->is_number_integer() || k->get<int64_t>() < 0)
        sf.bad("top_k", "a non-negative integer", *k);
      e.sampling.top_k = k->get<int64_t>();
    }
  }
  e.reasoning_parser = f.str("reasoning_parser", live, /*allow_null=*/true);
  e.tool_call_parser = f.str("tool_call_parser", live, /*allow_null=*/true);
  e.gated = f.boolean("gated");
  e.description = f.str("description", false);
  return e;
}

std::string read_file_or_fail(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("%s: cannot read %s", what, path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Lower-case letters and digits only: "Gemma-4_E2B" -> "gemma4e2b".
std::string squash(std::string_view s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      out += char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

bool Entry::has_vision() const {
  return std::find(modalities.begin(), modalities.end(), "vision") != modalities.end();
}

std::string Entry::format_label() const {
  return format == "safetensors" ? quantization : format + " " + quantization;
}

bool valid_alias_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (!(std::islower(static_cast<unsigned char>(name[0])) ||
        std::isdigit(static_cast<unsigned char>(name[0]))))
    return false;
  for (char c : name)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
      return false;
  return true;
}

Catalog Catalog::parse(const std::string& json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail("%s: not valid JSON: %s", source.c_str(), e.what());
  }
  Fields top(doc, source, {"version", "aliases"});
  if (const json* v = top.get("version", true); !v->is_number_integer() || v->get<int>() != 1)
    fail("%s: field \"version\" must be 1, got %s", source.c_str(), v->dump().c_str());
  const json* aliases = top.get("aliases", true);
  if (!aliases->is_object() || aliases->empty())
    top.bad("aliases", "a non-empty object of alias entries", *aliases);

  Catalog c;
  for (auto it = aliases->begin(); it != aliases->end(); ++it) {
    if (!valid_alias_name(it.key()))
      fail("%s: alias name \"%s\" is not valid (lower-case letters, digits, '.', '-', '_')",
           source.c_str(), it.key().c_str());
    c.entries_.push_back(parse_entry(it.key(), it.value(), source));
  }
  std::sort(c.entries_.begin(), c.entries_.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  for (const Entry& e : c.entries_) {
    if (e.replacement.empty()) continue;
    const Entry* r = c.find(e.replacement);
    if (!r || r->is_retired())
      fail("%s: alias \"%s\": replacement \"%s\" is not a live alias of this catalog",
           source.c_str(), e.name.c_str(), e.replacement.c_str());
  }
  return c;
}

const Catalog& Catalog::builtin() {
  static const Catalog c = [] {
    const char* path = std::getenv("TANDEM_CATALOG");
    if (path && *path) return parse(read_file_or_fail(path, "TANDEM_CATALOG"), path);
    return parse(kBuiltinCatalogJson, "catalog/aliases.json (built in)");
  }();
  return c;
}

const Entry* Catalog::find(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, std::string_view n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

std::string unsupported_reason(const Entry& e) {
  // The loader reads plain bf16/f16/f32 and FP8 safetensors, and MLX affine
  // checkpoints of 4 or 8 bits (src/model/quantized.h).
  if (e.format == "mlx" && e.quantization != "4bit" && e.quantization != "8bit")
    return "its weights are MLX " + e.quantization +
           " quantized, and tandem loads MLX checkpoints of 4 or 8 bits only";
  return "";
}

nlohmann::json entry_to_json(const Entry& e) {
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  auto str_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json j;
  j["name"] = e.name;
  j["retired"] = str_or_null(e.retired);
  if (e.is_retired()) j["replacement"] = str_or_null(e.replacement);
  if (!e.repo.empty()) {
    j["repo"] = e.repo;
    j["revision"] = e.revision;
    j["family"] = e.family;
    j["modalities"] = e.modalities;
    j["format"] = e.format;
    j["quantization"] = e.quantization;
    j["size_bytes"] = e.size_bytes;
    j["context_length"] = e.context_length;
    j["sampling"] = {{"temperature", opt(e.sampling.temperature)},
                     {"top_p", opt(e.sampling.top_p)},
                     {"top_k", opt(e.sampling.top_k)},
                     {"min_p", opt(e.sampling.min_p)}};
    j["reasoning_parser"] = str_or_null(e.reasoning_parser);
    j["tool_call_parser"] = str_or_null(e.tool_call_parser);
    j["gated"] = e.gated;
    j["description"] = str_or_null(e.description);
  }
  return j;
}

std::vector<std::string> close_names(std::string_view name,
                                     const std::vector<std::string>& candidates, size_t max) {
  const std::string n = lower(name);
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& c : candidates) {
    const std::string lc = lower(c);
    size_t d = edit_distance(n, lc);
    // A substring in either direction, punctuation aside, counts as close.
    const std::string sn = squash(n), sc = squash(lc);
    if (!sn.empty() && (sc.find(sn) != std::string::npos || sn.find(sc) != std::string::npos))
      d = std::min(d, size_t(1));
    if (d <= std::max<size_t>(2, n.size() / 3)) scored.emplace_back(d, c);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < max; ++i) out.push_back(scored[i].second);
  return out;
}

}  // namespace tandem::catalog
