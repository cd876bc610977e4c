#include "catalog/resolve.h"

#include <filesystem>

#include "catalog/hub_http.h"
#include "catalog/user_aliases.h"
#include "core/error.h"

namespace tandem::catalog {

namespace fs = std::filesystem;

namespace {

bool looks_like_path(const std::string& s) {
  return s == "." || s == ".." || s.rfind("/", 0) == 0 || s.rfind("./", 0) == 0 ||
         s.rfind("../", 0) == 0 || s.rfind("~", 0) == 0;
}

[[noreturn]] void fail_retired(const Entry& e) {
  std::string msg = "\"" + e.name + "\" is retired: " + e.retired;
  if (!e.replacement.empty())
    msg += ". Use \"" + e.replacement + "\" instead (tandem info " + e.replacement + ")";
  fail("%s", msg.c_str());
}

Resolved from_entry(const Entry& e, Resolved r) {
  if (e.is_retired()) fail_retired(e);
  r.entry = &e;
  r.ref.repo = e.repo;
  r.ref.revision = e.revision;
  return r;
}

}  // namespace

Resolved resolve_name(const std::string& arg) {
  Resolved r;
  r.arg = arg;
  std::error_code ec;
  if (arg.empty()) fail("no model given");
  if (fs::exists(arg, ec)) {
    r.source = Source::LocalPath;
    r.local_path = arg;
    return r;
  }
  if (looks_like_path(arg)) fail("no such model folder: %s", arg.c_str());

  const Catalog& cat = Catalog::builtin();
  if (const Entry* e = cat.find(arg)) {
    r.source = Source::Alias;
    return from_entry(*e, r);
  }
  const auto user = load_user_aliases(cat);
  if (auto it = user.find(arg); it != user.end()) {
    r.source = Source::UserAlias;
    r.user_target = it->second;
    if (fs::exists(it->second, ec)) {
      r.local_path = it->second;
      return r;
    }
    if (const Entry* e = cat.find(it->second)) return from_entry(*e, r);
    if (auto ref = parse_repo_ref(it->second)) {
      r.ref = *ref;
      return r;
    }
    fail("user alias \"%s\" points to \"%s\", which is not a folder, an alias or a repo (%s)",
         arg.c_str(), it->second.c_str(), user_aliases_path().c_str());
  }
  if (auto ref = parse_repo_ref(arg)) {
    r.source = Source::Repo;
    r.ref = *ref;
    return r;
  }

  std::vector<std::string> names;
  for (const Entry& e : cat.entries())
    if (!e.is_retired()) names.push_back(e.name);
  for (const auto& [name, target] : user) names.push_back(name);
  const auto close = close_names(arg, names);
  std::string hint;
  for (const auto& n : close) hint += (hint.empty() ? "" : ", ") + n;
  fail(
      "unknown model \"%s\": not a folder, an alias or a Hugging Face repo (org/name)%s; "
      "`tandem models` lists the aliases",
      arg.c_str(), hint.empty() ? "" : (". Did you mean: " + hint + "?").c_str());
}

std::string resolve_model_arg(const std::string& arg, bool allow_download) {
  PullOptions options;
  options.force_hint = "run `tandem pull " + arg + " --force` first to download anyway";
  return resolve_model_arg(arg, allow_download, options);
}

std::string resolve_model_arg(const std::string& arg, bool allow_download,
                              const PullOptions& options) {
  const Resolved r = resolve_name(arg);
  if (r.is_local()) return r.local_path;
  if (r.entry) {
    const std::string why = unsupported_reason(*r.entry);
    if (!why.empty()) {
      std::string alt;  // the bf16 twin of a quantized alias: "x-3bit" -> "x"
      const std::string& n = r.entry->name;
      if (const size_t dash = n.rfind('-'); dash != std::string::npos) {
        const Entry* base = Catalog::builtin().find(n.substr(0, dash));
        if (base && !base->is_retired() && unsupported_reason(*base).empty())
          alt = "; use \"" + base->name + "\" (" + base->format_label() + ") instead";
      }
      fail("\"%s\" cannot be loaded: %s%s", arg.c_str(), why.c_str(), alt.c_str());
    }
  }
  if (allow_download) require_token_if_gated(r);
  if (!allow_download) {
    if (auto snap = cached_snapshot(r.ref)) return *snap;
    fail("%s (%s) is not in the cache (%s); download it with `tandem pull %s`", arg.c_str(),
         r.ref.display().c_str(), repo_cache_dir(r.ref.repo).c_str(), arg.c_str());
  }
  const PullResult p = pull_repo(r.ref, options);
  std::fprintf(stderr, "model %s: %s\n", arg.c_str(), p.snapshot.c_str());
  return p.snapshot;
}

void require_token_if_gated(const Resolved& r) {
  if (!r.entry || !r.entry->gated || cached_snapshot(r.ref)) return;
  const HubEnv env = HubEnv::from_environment();
  if (!env.token.empty() || env.offline) return;
  fail(
      "%s (%s) is gated: accept its license at https://huggingface.co/%s with your Hugging Face "
      "account, then set HF_TOKEN to an access token (huggingface.co/settings/tokens) and retry",
      r.arg.c_str(), r.ref.repo.c_str(), r.ref.repo.c_str());
}

std::string model_display_name(const std::string& arg) {
  std::error_code ec;
  if (!fs::exists(arg, ec) && !looks_like_path(arg)) return arg;
  std::string path = arg;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace tandem::catalog
