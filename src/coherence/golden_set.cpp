#include "coherence/golden_set.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tandem::coherence {

namespace {

using json = nlohmann::json;

std::string base64_encode(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const size_t n = std::min<size_t>(3, in.size() - i);
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (n > 1) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    if (n > 2) v |= uint8_t(in[i + 2]);
    out += t[v >> 18];
    out += t[v >> 12 & 63];
    out += n > 1 ? t[v >> 6 & 63] : '=';
    out += n > 2 ? t[v & 63] : '=';
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read %s", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The image file as a data URL (its type from the first bytes).
std::string image_data_url(const std::string& path) {
  const std::string bytes = read_file(path);
  const char* mime = nullptr;
  if (bytes.rfind("\x89PNG", 0) == 0) mime = "image/png";
  if (bytes.rfind("\xff\xd8", 0) == 0) mime = "image/jpeg";
  if (bytes.rfind("GIF8", 0) == 0) mime = "image/gif";
  if (bytes.rfind("BM", 0) == 0) mime = "image/bmp";
  if (bytes.size() > 12 && bytes.compare(8, 4, "WEBP") == 0) mime = "image/webp";
  if (!mime) fail("%s is not a PNG, JPEG, GIF, BMP or WebP image", path.c_str());
  return std::string("data:") + mime + ";base64," + base64_encode(bytes);
}

std::vector<std::string> string_list(const json& c, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (!c.contains(key)) return out;
  const json& v = c[key];
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) fail("%s: \"%s\" must be a string or an array of strings", where.c_str(), key);
  for (const json& s : v) {
    if (!s.is_string()) fail("%s: \"%s\" must hold strings only", where.c_str(), key);
    out.push_back(s.get<std::string>());
  }
  return out;
}

json convert_messages(const json& messages, const std::string& base_dir, const std::string& where) {
  if (!messages.is_array() || messages.empty())
    fail("%s: \"messages\" must be a non-empty array", where.c_str());
  json out = messages;
  for (json& m : out) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      fail("%s: each message must be an object with a \"role\"", where.c_str());
    if (!m.contains("content") || !m["content"].is_array()) continue;
    for (json& part : m["content"]) {
      if (!part.is_object() || part.value("type", "") != "image_file") continue;
      if (!part.contains("path") || !part["path"].is_string())
        fail("%s: an image_file part needs a \"path\"", where.c_str());
      if (base_dir.empty())
        fail("%s: a built-in set cannot reference image files; use a data URL", where.c_str());
      const std::filesystem::path p =
          std::filesystem::path(base_dir) / part["path"].get<std::string>();
      part = {{"type", "image_url"}, {"image_url", {{"url", image_data_url(p.string())}}}};
    }
  }
  return out;
}

GoldenCase parse_case(const json& c, size_t index, const std::string& base_dir) {
  std::string where = strprintf("case %zu", index);
  if (!c.is_object()) fail("%s: must be an object", where.c_str());
  static const std::set<std::string> kKeys = {"id",       "messages",   "accept",     "reject",
                                              "contains", "max_tokens", "description"};
  for (const auto& [key, value] : c.items())
    if (!kKeys.count(key)) fail("%s: unknown field \"%s\"", where.c_str(), key.c_str());
  GoldenCase out;
  if (!c.contains("id") || !c["id"].is_string() || c["id"].get<std::string>().empty())
    fail("%s: \"id\" must be a non-empty string", where.c_str());
  out.id = c["id"].get<std::string>();
  where = "case '" + out.id + "'";
  if (!c.contains("messages")) fail("%s: \"messages\" is missing", where.c_str());
  out.messages = convert_messages(c["messages"], base_dir, where);
  out.accept = string_list(c, "accept", where);
  out.reject = string_list(c, "reject", where);
  out.contains = string_list(c, "contains", where);
  if (out.accept.empty() && out.contains.empty())
    fail("%s: give \"accept\" (accepted answers) or \"contains\"", where.c_str());
  if (c.contains("max_tokens")) {
    if (!c["max_tokens"].is_number_integer() || c["max_tokens"].get<int64_t>() < 1 ||
        c["max_tokens"].get<int64_t>() > 1 << 20)
      fail("%s: \"max_tokens\" must be a positive integer", where.c_str());
    out.max_tokens = c["max_tokens"].get<int>();
  }
  return out;
}

}  // namespace

GoldenSet parse_golden_set(const json& set, const std::string& base_dir,
                           const std::string& source) {
  if (!set.is_object() || !set.contains("cases") || !set["cases"].is_array() ||
      set["cases"].empty())
    fail("%s: a golden set is {\"name\": ..., \"cases\": [...]} with at least one case",
         source.c_str());
  GoldenSet out;
  out.source = source;
  out.name =
      set.contains("name") && set["name"].is_string() ? set["name"].get<std::string>() : source;
  std::set<std::string> ids;
  try {
    for (size_t i = 0; i < set["cases"].size(); ++i) {
      out.cases.push_back(parse_case(set["cases"][i], i, base_dir));
      if (!ids.insert(out.cases.back().id).second)
        fail("case id '%s' appears twice", out.cases.back().id.c_str());
    }
  } catch (const Error& e) {
    fail("%s: %s", source.c_str(), e.what());
  }
  return out;
}

GoldenSet load_golden_set(const std::string& arg) {
  const bool is_path = arg.find('/') != std::string::npos ||
                       (arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".json") == 0);
  if (is_path) {
    const json j = json::parse(read_file(arg), nullptr, false);
    if (j.is_discarded()) fail("%s is not valid JSON", arg.c_str());
    const std::string dir = std::filesystem::absolute(arg).parent_path().string();
    return parse_golden_set(j, dir, arg);
  }
  std::string names;
  for (size_t i = 0; i < kBuiltinSetCount; ++i) {
    if (arg == kBuiltinSets[i].name)
      return parse_golden_set(json::parse(kBuiltinSets[i].json), "",
                              std::string("built-in set '") + arg + "'");
    names += std::string(names.empty() ? "" : ", ") + kBuiltinSets[i].name;
  }
  fail("no built-in golden set '%s' (built in: %s); a file path needs a '/' or a .json ending",
       arg.c_str(), names.c_str());
}

}  // namespace tandem::coherence
