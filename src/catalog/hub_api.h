// The hub's file listing of a repo revision, and which of its files a model
// needs.
//
// fetch_listing: GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true
// (with the token when set), answered with the commit id ("sha") and the
// files ("siblings": rfilename, size, blobId, lfs {sha256, size}). Throws
// HubError: unreachable (no answer), 401/403 (gated or private: set HF_TOKEN),
// 404 (no such repo or revision), or a listing that does not parse. Retries
// 408/429/5xx and dropped answers a few times with backoff.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "catalog/hub_cache.h"
#include "catalog/hub_http.h"

namespace tandem::catalog {

struct RepoFile {
  std::string name;     // path in the repo ("model.safetensors")
  uint64_t size = 0;    // bytes
  std::string sha256;   // LFS files: the content's sha256 (hex)
  std::string blob_id;  // git blob id (sha1 of "blob <size>\0<content>")
  // The blob's file name in the cache: the sha256 for LFS files, else the
  // git blob id (what huggingface_hub names them).
  const std::string& blob_name() const { return sha256.empty() ? blob_id : sha256; }
};

struct RepoListing {
  std::string commit;  // 40 hex digits
  std::vector<RepoFile> files;
};

RepoListing fetch_listing(const HubEnv& env, const RepoRef& ref);

// Parses the listing JSON; throws tandem::Error naming `repo` when malformed.
RepoListing parse_listing(const std::string& body, const std::string& repo);

// The files a model folder needs, from the repo's root: config.json,
// generation_config.json, the safetensors weights (+ index), the tokenizer,
// chat template and (pre)processor configs. Skips pickles, GGUF, ONNX and
// other formats, Mistral's consolidated*.safetensors when the transformers
// shards exist, and subfolders. Throws when the repo has no config.json or no
// safetensors weights (tandem loads nothing else).
std::vector<RepoFile> select_model_files(const RepoListing& listing, const std::string& repo);

}  // namespace tandem::catalog
