#include "catalog/user_aliases.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "catalog/hub_cache.h"
#include "core/error.h"

namespace tandem::catalog {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::map<std::string, std::string> read_file(const std::string& path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  if (!in) return out;
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail("%s: not a JSON object (expected {\"aliases\": {\"NAME\": \"TARGET\"}})", path.c_str());
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "aliases") fail("%s: unknown key \"%s\"", path.c_str(), it.key().c_str());
  if (!j.contains("aliases")) return out;
  if (!j["aliases"].is_object()) fail("%s: \"aliases\" must be an object", path.c_str());
  for (auto it = j["aliases"].begin(); it != j["aliases"].end(); ++it) {
    if (!it.value().is_string() || it.value().get<std::string>().empty())
      fail("%s: alias \"%s\" must map to a non-empty string", path.c_str(), it.key().c_str());
    if (!valid_alias_name(it.key()))
      fail("%s: \"%s\" is not a valid alias name", path.c_str(), it.key().c_str());
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

void write_file(const std::string& path, const std::map<std::string, std::string>& aliases) {
  fs::create_directories(fs::path(path).parent_path());
  const json j = {{"aliases", aliases}};
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out) fail("cannot write %s", tmp.c_str());
  }
  fs::rename(tmp, path);
}

}  // namespace

std::string user_aliases_path() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg && *xdg ? xdg : std::string(home ? home : "/tmp") + "/.config";
  return base + "/tandem/aliases.json";
}

std::map<std::string, std::string> load_user_aliases(const Catalog& builtin) {
  const std::string path = user_aliases_path();
  auto aliases = read_file(path);
  for (auto it = aliases.begin(); it != aliases.end();) {
    if (builtin.find(it->first)) {
      std::fprintf(stderr,
                   "warning: %s: user alias \"%s\" is ignored: the built-in catalog now has that "
                   "name (remove it with `tandem alias rm %s`)\n",
                   path.c_str(), it->first.c_str(), it->first.c_str());
      it = aliases.erase(it);
    } else {
      ++it;
    }
  }
  return aliases;
}

void set_user_alias(const std::string& name, const std::string& target, const Catalog& builtin) {
  if (!valid_alias_name(name))
    fail(
        "\"%s\" is not a valid alias name: use lower-case letters, digits, '.', '-' and '_', "
        "starting with a letter or digit",
        name.c_str());
  if (const Entry* e = builtin.find(name))
    fail("\"%s\" is a %s alias; user aliases cannot shadow it", name.c_str(),
         e->is_retired() ? "retired built-in" : "built-in");
  std::string stored = target;
  std::error_code ec;
  if (fs::is_directory(target, ec)) {
    stored = fs::absolute(target).lexically_normal().string();
  } else if (const Entry* e = builtin.find(target)) {
    if (e->is_retired()) fail("\"%s\" is retired: %s", target.c_str(), e->retired.c_str());
  } else if (!parse_repo_ref(target)) {
    fail(
        "target \"%s\" is not a folder, a built-in alias or a Hugging Face repo "
        "\"org/name[@revision]\"",
        target.c_str());
  }
  const std::string path = user_aliases_path();
  auto aliases = read_file(path);
  aliases[name] = stored;
  write_file(path, aliases);
}

bool remove_user_alias(const std::string& name) {
  const std::string path = user_aliases_path();
  auto aliases = read_file(path);
  if (!aliases.erase(name)) return false;
  write_file(path, aliases);
  return true;
}

}  // namespace tandem::catalog
