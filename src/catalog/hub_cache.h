// The local model cache, in the huggingface_hub layout, so that models
// downloaded by tandem and by other tools (transformers, huggingface-cli,
// vLLM, mlx) are shared:
//
//   $HF_HUB_CACHE (default $HF_HOME/hub, HF_HOME default
//   $XDG_CACHE_HOME/huggingface, that default ~/.cache/huggingface)
//     models--ORG--NAME/
//       blobs/<sha256 of LFS files | git blob id of small files>
//       blobs/<...>.incomplete          a download in progress (resumable)
//       snapshots/<commit>/<file>  ->  ../../blobs/<...>   (relative symlinks)
//       refs/<revision>                 the commit the revision pointed to
//     .locks/models--ORG--NAME/<blob>.lock   held while a blob downloads
//
// Nothing here uses the network.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::catalog {

// A Hugging Face model repo at a revision (branch, tag or commit).
struct RepoRef {
  std::string repo;  // "org/name"
  std::string revision = "main";
  std::string display() const;  // "org/name" or "org/name@rev"
};

// "org/name" or "org/name@revision"; nullopt for anything else.
std::optional<RepoRef> parse_repo_ref(std::string_view text);

// True for a full 40-hex-digit commit id.
bool is_commit_id(std::string_view s);

std::string hub_cache_dir();
std::string repo_cache_dir(const std::string& repo);  // <cache>/models--org--name
std::string repo_lock_dir(const std::string& repo);   // <cache>/.locks/models--org--name

// The commit refs/<revision> names (the revision itself when it is a commit
// id), or "" when the cache does not know it.
std::string cached_commit(const RepoRef& ref);

// True when `dir` holds a loadable checkpoint: config.json, and every shard
// of model.safetensors.index.json (or at least one *.safetensors), each a
// readable file (symlinks followed).
bool snapshot_complete(const std::string& dir);

// The snapshot folder of `ref` when it is cached and complete.
std::optional<std::string> cached_snapshot(const RepoRef& ref);

// Bytes of regular files under `dir` (blobs, not the symlinks to them).
uint64_t dir_size_bytes(const std::string& dir);

// Writes refs/<revision> = commit atomically (nothing for a commit revision).
void write_ref(const RepoRef& ref, const std::string& commit);

}  // namespace tandem::catalog
