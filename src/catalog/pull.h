// Making a repo revision present in the cache: list, choose the model's
// files, preflight the disk, download what is missing, link the snapshot.
//
// Contract of pull_repo: returns the snapshot folder of `ref` holding every
// file select_model_files() chose, or throws tandem::Error. With
// HF_HUB_OFFLINE set it never touches the network: a complete cached
// snapshot is returned, anything else is an error. When the hub cannot be
// reached at all and the cache holds a complete snapshot, that snapshot is
// used with a warning. Before any transfer: free space must be at least
// 1.1 × the bytes still missing (else an error with the figures and
// options.force_hint, unless options.force), and with stdin and stderr on a
// terminal a download over 10 GB asks for confirmation (unless assume_yes).
// refs/<revision> is written once the snapshot is complete.
#pragma once

#include <cstdint>
#include <string>

#include "catalog/download.h"
#include "catalog/hub_cache.h"

namespace tandem::catalog {

struct PullOptions {
  bool force = false;       // download even when the disk looks too small
  bool assume_yes = false;  // no question before big downloads
  std::string force_hint = "pass --force to download anyway";
  DownloadOptions download;
};

struct PullResult {
  std::string snapshot;  // the folder to load
  std::string commit;
  uint64_t downloaded = 0;       // bytes transferred by this call
  bool from_cache_only = false;  // offline or hub unreachable: no listing was fetched
};

PullResult pull_repo(const RepoRef& ref, const PullOptions& options = {});

// Downloads larger than this ask first on a terminal.
constexpr uint64_t kConfirmDownloadBytes = 10'000'000'000ull;

}  // namespace tandem::catalog
