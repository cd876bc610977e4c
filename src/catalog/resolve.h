// What a MODEL argument names (`tandem serve|run|chat|pull MODEL`), and the
// folder to load for it.
//
// Resolution order, first match wins:
//   1. an existing local path (a folder with config.json, as before);
//      an argument that looks like a path (starts with '/', './', '../' or
//      '~') and does not exist is an error;
//   2. a retired alias: an error with its message and what to use instead,
//      before any network use;
//   3. an alias: built-in (catalog/aliases.json) or the user's (tandem alias);
//   4. "org/name[@revision]": a Hugging Face repo;
//   5. anything else: an error listing the close alias names.
#pragma once

#include <string>

#include "catalog/catalog.h"
#include "catalog/hub_cache.h"
#include "catalog/pull.h"

namespace tandem::catalog {

enum class Source { LocalPath, Alias, UserAlias, Repo };

struct Resolved {
  Source source = Source::LocalPath;
  std::string arg;               // as given
  std::string local_path;        // LocalPath (also a user alias to a folder)
  RepoRef ref;                   // Alias, UserAlias (to a repo or alias), Repo
  const Entry* entry = nullptr;  // the built-in alias, when one is involved
  std::string user_target;       // UserAlias: the stored target
  bool is_local() const { return !local_path.empty(); }
};

// Steps 1-5 above. No network. Throws tandem::Error for a retired alias, a
// missing path, or an unknown name.
Resolved resolve_name(const std::string& arg);

// The folder to load for `arg`: a local path as given, else the cached
// snapshot. With allow_download, what is missing is pulled (see pull.h,
// including the disk preflight, whose override is `tandem pull ARG --force`);
// without, a model not in the cache is an error naming `tandem pull`. An
// alias whose weights tandem cannot load yet is refused before any download.
std::string resolve_model_arg(const std::string& arg, bool allow_download);
std::string resolve_model_arg(const std::string& arg, bool allow_download,
                              const PullOptions& options);

// A gated repo (Llama, Gemma) cannot be downloaded without a token: throws,
// before any network use, when `r` names a gated alias that is not cached
// and no token is configured (HF_TOKEN or the huggingface-cli login file).
void require_token_if_gated(const Resolved& r);

// The name a model is served under by default: the alias or repo as given,
// or the folder's last path component.
std::string model_display_name(const std::string& arg);

}  // namespace tandem::catalog
