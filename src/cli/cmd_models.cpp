// tandem models / info / alias: the catalog, one model's profile, and the
// user's own aliases. None of these use the network.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "catalog/catalog.h"
#include "catalog/disk.h"
#include "catalog/hub_cache.h"
#include "catalog/resolve.h"
#include "catalog/user_aliases.h"
#include "cli/commands.h"
#include "core/error.h"

namespace tandem::cli {

namespace {

using json = nlohmann::json;
using namespace tandem::catalog;

// Where a repo stands in the cache.
struct CacheState {
  std::string snapshot;  // complete snapshot folder, "" if none
  bool partial = false;  // something is cached, but no complete snapshot
};

CacheState cache_state(const RepoRef& ref) {
  CacheState s;
  if (auto snap = cached_snapshot(ref)) {
    s.snapshot = *snap;
  } else {
    std::error_code ec;
    s.partial = std::filesystem::exists(repo_cache_dir(ref.repo), ec);
  }
  return s;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

struct ModelsOptions {
  bool json = false;
  bool cached = false;
};

int run_models(const ModelsOptions& o) {
  const Catalog& cat = Catalog::builtin();
  const auto user = load_user_aliases(cat);
  json out = {{"models", json::array()}, {"user_aliases", json::array()}};
  std::vector<std::string> retired;
  std::string table = pad("ALIAS", 22) + pad("FAMILY", 10) + pad("MODALITIES", 13) +
                      pad("FORMAT", 10) + pad("SIZE", 11) + "CACHED\n";
  for (const Entry& e : cat.entries()) {
    if (e.is_retired()) {
      if (!o.cached) {
        retired.push_back(e.name);
        out["models"].push_back(entry_to_json(e));
      }
      continue;
    }
    const CacheState cs = cache_state({e.repo, e.revision});
    if (o.cached && cs.snapshot.empty()) continue;
    json j = entry_to_json(e);
    j["cached"] = !cs.snapshot.empty();
    j["cached_path"] = cs.snapshot.empty() ? json(nullptr) : json(cs.snapshot);
    const std::string why = unsupported_reason(e);
    j["loadable"] = why.empty();
    out["models"].push_back(j);
    table += pad(e.name, 22) + pad(e.family, 10) + pad(join(e.modalities, "+"), 13) +
             pad(e.format_label(), 10) + pad("~" + format_bytes(e.size_bytes), 11) +
             (cs.snapshot.empty() ? (cs.partial ? "partial" : "-") : "yes") +
             (why.empty() ? "" : "  (not loadable yet)") + "\n";
  }
  std::string user_lines;
  for (const auto& [name, target] : user) {
    std::string snapshot;
    if (auto ref = parse_repo_ref(target)) snapshot = cache_state(*ref).snapshot;
    if (const Entry* e = cat.find(target); e && !e->is_retired())
      snapshot = cache_state({e->repo, e->revision}).snapshot;
    const bool local = std::filesystem::exists(target);
    if (o.cached && snapshot.empty() && !local) continue;
    out["user_aliases"].push_back(
        {{"name", name},
         {"target", target},
         {"cached", !snapshot.empty() || local},
         {"cached_path", snapshot.empty() ? json(nullptr) : json(snapshot)}});
    user_lines += "  " + pad(name, 20) + "-> " + target + "\n";
  }
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%s", table.c_str());
  if (!user_lines.empty())
    std::printf("\nuser aliases (%s):\n%s", user_aliases_path().c_str(), user_lines.c_str());
  if (!retired.empty())
    std::printf("\nretired: %s (tandem info NAME says why)\n", join(retired, ", ").c_str());
  std::printf("\ncache: %s\n", hub_cache_dir().c_str());
  return 0;
}

struct InfoOptions {
  std::string name;
  bool json = false;
};

std::string sampling_text(const Sampling& s) {
  std::vector<std::string> parts;
  if (s.temperature) parts.push_back(strprintf("temperature %g", *s.temperature));
  if (s.top_p) parts.push_back(strprintf("top_p %g", *s.top_p));
  if (s.top_k) parts.push_back(strprintf("top_k %lld", (long long)*s.top_k));
  if (s.min_p) parts.push_back(strprintf("min_p %g", *s.min_p));
  return parts.empty() ? "-" : join(parts, ", ");
}

int run_info(const InfoOptions& o) {
  const Catalog& cat = Catalog::builtin();
  const Entry* e = cat.find(o.name);
  json j;
  std::string text;
  auto line = [&](const char* key, const std::string& value) {
    text += "  " + pad(std::string(key) + ":", 16) + value + "\n";
  };
  if (e && e->is_retired()) {
    j = entry_to_json(*e);
    text = o.name + " (retired)\n";
    line("retired", e->retired);
    if (!e->replacement.empty()) line("use instead", e->replacement);
  } else {
    const Resolved r = resolve_name(o.name);
    if (r.is_local()) {
      j = {{"name", o.name}, {"local_path", r.local_path}};
      text = o.name + "\n";
      line("local folder", r.local_path);
      if (r.source == Source::UserAlias) line("user alias", r.user_target);
    } else {
      const CacheState cs = cache_state(r.ref);
      if (r.entry) {
        const Entry& x = *r.entry;
        j = entry_to_json(x);
        text = x.name + (x.description.empty() ? "" : "  " + x.description) + "\n";
        if (r.source == Source::UserAlias) line("user alias", r.user_target);
        line("repo", x.repo + " @ " + x.revision);
        line("family", x.family);
        line("modalities", join(x.modalities, ", "));
        line("format", x.format + " " + x.quantization);
        line("download size", "~" + format_bytes(x.size_bytes));
        line("context length", std::to_string(x.context_length));
        line("sampling", sampling_text(x.sampling));
        line("reasoning", x.reasoning_parser.empty() ? "-" : x.reasoning_parser);
        line("tool calls", x.tool_call_parser.empty() ? "-" : x.tool_call_parser);
        if (x.gated) line("gated", "yes: accept the license on huggingface.co, then set HF_TOKEN");
        if (const std::string why = unsupported_reason(x); !why.empty())
          line("loadable", "not yet: " + why);
      } else {
        j = {{"name", o.name}, {"repo", r.ref.repo}, {"revision", r.ref.revision}};
        text = o.name + "\n";
        if (r.source == Source::UserAlias) line("user alias", r.user_target);
        line("repo", r.ref.repo + " @ " + r.ref.revision);
      }
      j["cached"] = !cs.snapshot.empty();
      j["cached_path"] = cs.snapshot.empty() ? json(nullptr) : json(cs.snapshot);
      if (!cs.snapshot.empty()) {
        line("cached", cs.snapshot);
        line("cache size", format_bytes(dir_size_bytes(repo_cache_dir(r.ref.repo))));
      } else {
        line("cached",
             std::string(cs.partial ? "partly (" + repo_cache_dir(r.ref.repo) + ")" : "no") +
                 "; `tandem pull " + o.name + "` downloads it");
      }
    }
  }
  if (o.json)
    std::printf("%s\n", j.dump(2).c_str());
  else
    std::printf("%s", text.c_str());
  return 0;
}

struct AliasOptions {
  std::string name, target;
  bool json = false;
  CLI::App* set = nullptr;
  CLI::App* rm = nullptr;
  CLI::App* list = nullptr;
};

int run_alias(const AliasOptions& o) {
  const Catalog& cat = Catalog::builtin();
  if (o.set->parsed()) {
    set_user_alias(o.name, o.target, cat);
    std::printf("%s -> %s (%s)\n", o.name.c_str(), load_user_aliases(cat).at(o.name).c_str(),
                user_aliases_path().c_str());
    return 0;
  }
  if (o.rm->parsed()) {
    if (!remove_user_alias(o.name)) {
      const bool builtin = cat.find(o.name) != nullptr;
      fail("no user alias \"%s\"%s", o.name.c_str(),
           builtin ? " (it is a built-in alias, which cannot be removed)" : "");
    }
    std::printf("removed alias %s\n", o.name.c_str());
    return 0;
  }
  const auto user = load_user_aliases(cat);
  if (o.json) {
    json j = json::object();
    for (const auto& [name, target] : user) j[name] = target;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (user.empty()) std::printf("no user aliases (%s)\n", user_aliases_path().c_str());
  for (const auto& [name, target] : user) std::printf("%s -> %s\n", name.c_str(), target.c_str());
  return 0;
}

}  // namespace

Runner add_models_command(CLI::App& app) {
  auto o = std::make_shared<ModelsOptions>();
  auto* cmd = app.add_subcommand("models", "List the model aliases, their size and cache state");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->add_flag("--cached", o->cached, "Only models that are downloaded");
  return [o] { return run_models(*o); };
}

Runner add_info_command(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  auto* cmd = app.add_subcommand("info", "Show a model's profile, size and cached path");
  cmd->add_option("model", o->name, "Alias, user alias, org/name[@revision] or folder")->required();
  cmd->add_flag("--json", o->json, "Print JSON");
  return [o] { return run_info(*o); };
}

Runner add_alias_command(CLI::App& app) {
  auto o = std::make_shared<AliasOptions>();
  auto* cmd = app.add_subcommand("alias", "Manage your own model aliases");
  cmd->require_subcommand(1);
  o->set = cmd->add_subcommand("set", "Set NAME to a repo (org/name[@rev]), an alias or a folder");
  o->set->add_option("name", o->name, "The alias")->required();
  o->set->add_option("target", o->target, "org/name[@revision], a built-in alias, or a folder")
      ->required();
  o->rm = cmd->add_subcommand("rm", "Remove a user alias");
  o->rm->add_option("name", o->name, "The alias")->required();
  o->list = cmd->add_subcommand("list", "List the user aliases");
  o->list->add_flag("--json", o->json, "Print JSON");
  return [o] { return run_alias(*o); };
}

}  // namespace tandem::cli
