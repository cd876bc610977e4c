// Parallel, resumable, verified file transfers into the hub cache.
//
// Contract of download_blobs: for every file, blobs/<blob_name> exists with
// the file's size and checksum when it returns (files already there are
// trusted by size and skipped). A transfer writes blobs/<name>.incomplete
// (the name huggingface_hub uses, so either tool resumes the other's
// download), resumes it with an HTTP Range request after an interruption
// (here or in an earlier run), hashes while it writes, and renames it into
// place only when the sha256 (LFS) or git blob id (small files) matches. A
// mismatch deletes the partial file and throws. Dropped connections, 408,
// 429 and 5xx are retried (max_attempts, exponential backoff); 401/403/404
// and disk errors are not. The first failure stops the other transfers.
// Concurrent tandem (or huggingface_hub) processes serialize on
// .locks/models--org--name/<blob>.lock.
//
// Nothing here touches snapshots/: link_snapshot does, after every blob of a
// snapshot is in place.
#pragma once

#include <string>
#include <vector>

#include "catalog/hub_api.h"
#include "catalog/progress.h"

namespace tandem::catalog {

struct DownloadOptions {
  int workers = 8;         // files in flight at once
  int max_attempts = 5;    // per file
  double backoff_s = 0.5;  // first retry delay; doubles, at most 8 s
};

void download_blobs(const HubEnv& env, const std::string& repo, const std::string& commit,
                    const std::vector<RepoFile>& files, Progress& progress,
                    const DownloadOptions& options = {});

// Bytes of `f` already in the cache: its size when the blob is complete,
// else the size of its .incomplete file (0 if none or too large).
uint64_t cached_bytes(const std::string& repo, const RepoFile& f);
bool blob_complete(const std::string& repo, const RepoFile& f);

// snapshots/<commit>/<f.name> -> ../../blobs/<blob>, replaced atomically.
void link_snapshot(const std::string& repo, const std::string& commit, const RepoFile& f);

}  // namespace tandem::catalog
