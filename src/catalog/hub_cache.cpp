#include "catalog/hub_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/env.h"
#include "core/error.h"

namespace tandem::catalog {

namespace fs = std::filesystem;

namespace {

bool valid_part(std::string_view s, bool allow_slash) {
  if (s.empty() || s.size() > 200 || s.find("..") != std::string_view::npos) return false;
  if (s.front() == '/' || s.back() == '/' || s.front() == '-') return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          (allow_slash && c == '/')))
      return false;
  return true;
}

// "org/name" -> "models--org--name"
std::string folder_name(const std::string& repo) {
  std::string name = "models--" + repo;
  for (size_t p = 0; (p = name.find('/', p)) != std::string::npos; p += 2) name.replace(p, 1, "--");
  return name;
}

}  // namespace

std::string RepoRef::display() const {
  return revision == "main" ? repo : repo + "@" + revision;
}

std::optional<RepoRef> parse_repo_ref(std::string_view text) {
  RepoRef ref;
  std::string_view id = text;
  if (const size_t at = text.find('@'); at != std::string_view::npos) {
    id = text.substr(0, at);
    ref.revision = std::string(text.substr(at + 1));
    if (!valid_part(ref.revision, /*allow_slash=*/true)) return std::nullopt;
  }
  const size_t slash = id.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  if (!valid_part(id.substr(0, slash), false) || !valid_part(id.substr(slash + 1), false))
    return std::nullopt;
  ref.repo = std::string(id);
  return ref;
}

bool is_commit_id(std::string_view s) {
  if (s.size() != 40) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string hub_cache_dir() {
  if (const char* v = std::getenv("HF_HUB_CACHE"); v && *v) return v;
  const std::string home = env_or("HOME", "/tmp");
  const std::string xdg = env_or("XDG_CACHE_HOME", home + "/.cache");
  return env_or("HF_HOME", xdg + "/huggingface") + "/hub";
}

std::string repo_cache_dir(const std::string& repo) {
  return hub_cache_dir() + "/" + folder_name(repo);
}

std::string repo_lock_dir(const std::string& repo) {
  return hub_cache_dir() + "/.locks/" + folder_name(repo);
}

std::string cached_commit(const RepoRef& ref) {
  if (is_commit_id(ref.revision)) return ref.revision;
  std::ifstream in(repo_cache_dir(ref.repo) + "/refs/" + ref.revision);
  std::string commit;
  if (!(in >> commit) || !is_commit_id(commit)) return "";
  return commit;
}

bool snapshot_complete(const std::string& dir) {
  std::error_code ec;
  auto readable = [&](const fs::path& p) { return fs::is_regular_file(p, ec); };
  if (!readable(fs::path(dir) / "config.json")) return false;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (readable(index)) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(index), nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) return false;
    for (const auto& shard : j["weight_map"])
      if (!shard.is_string() || !readable(fs::path(dir) / shard.get<std::string>())) return false;
    return true;
  }
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && readable(e.path())) return true;
  return false;
}

std::optional<std::string> cached_snapshot(const RepoRef& ref) {
  const std::string commit = cached_commit(ref);
  if (commit.empty()) return std::nullopt;
  const std::string dir = repo_cache_dir(ref.repo) + "/snapshots/" + commit;
  if (!snapshot_complete(dir)) return std::nullopt;
  return dir;
}

uint64_t dir_size_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) total += it->file_size(ec);
  return total;
}

void write_ref(const RepoRef& ref, const std::string& commit) {
  if (is_commit_id(ref.revision)) return;
  const fs::path path = fs::path(repo_cache_dir(ref.repo)) / "refs" / ref.revision;
  fs::create_directories(path.parent_path());
  const std::string tmp = path.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << commit;  // no newline, as huggingface_hub writes it
    if (!out) fail("cannot write %s", tmp.c_str());
  }
  fs::rename(tmp, path);
}

}  // namespace tandem::catalog
