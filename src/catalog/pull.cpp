#include "catalog/pull.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "catalog/disk.h"
#include "catalog/hub_api.h"
#include "core/clock.h"
#include "core/error.h"

namespace tandem::catalog {

namespace {

bool ask_yes_no(const std::string& question) {
  std::fprintf(stderr, "%s [y/N] ", question.c_str());
  std::fflush(stderr);
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  return !answer.empty() && (answer[0] == 'y' || answer[0] == 'Y');
}

}  // namespace

PullResult pull_repo(const RepoRef& ref, const PullOptions& options) {
  const HubEnv env = HubEnv::from_environment();
  const std::string what = ref.display();
  PullResult result;
  if (env.offline) {
    const auto snap = cached_snapshot(ref);
    if (!snap)
      fail(
          "%s is not in the cache (%s) and HF_HUB_OFFLINE is set, so it cannot be downloaded; "
          "unset HF_HUB_OFFLINE to download it",
          what.c_str(), repo_cache_dir(ref.repo).c_str());
    result.snapshot = *snap;
    result.commit = cached_commit(ref);
    result.from_cache_only = true;
    return result;
  }

  RepoListing listing;
  try {
    listing = fetch_listing(env, ref);
  } catch (const HubError& e) {
    const auto snap = e.unreachable ? cached_snapshot(ref) : std::nullopt;
    if (!snap) throw;
    std::fprintf(stderr, "warning: %s; using the cached snapshot %s\n", e.what(), snap->c_str());
    result.snapshot = *snap;
    result.commit = cached_commit(ref);
    result.from_cache_only = true;
    return result;
  }
  const std::vector<RepoFile> files = select_model_files(listing, ref.repo);
  uint64_t total = 0, missing = 0;
  size_t missing_files = 0;
  for (const RepoFile& f : files) {
    total += f.size;
    const uint64_t have = cached_bytes(ref.repo, f);
    if (have < f.size || !blob_complete(ref.repo, f)) {
      missing += f.size - have;
      ++missing_files;
    }
  }
  result.commit = listing.commit;
  result.snapshot = repo_cache_dir(ref.repo) + "/snapshots/" + listing.commit;

  if (missing_files > 0) {
    std::fprintf(stderr, "pull %s (commit %.10s): %zu files, %s; %s to download into %s\n",
                 what.c_str(), listing.commit.c_str(), files.size(), format_bytes(total).c_str(),
                 format_bytes(missing).c_str(), repo_cache_dir(ref.repo).c_str());
    check_free_space(missing, repo_cache_dir(ref.repo), options.force, options.force_hint);
    if (missing > kConfirmDownloadBytes && !options.assume_yes && isatty(STDIN_FILENO) &&
        isatty(STDERR_FILENO) && !ask_yes_no("Download " + format_bytes(missing) + "?"))
      fail("download of %s cancelled", what.c_str());
    const double t0 = monotonic_seconds();
    {
      Progress progress(stderr, isatty(STDERR_FILENO), missing, files.size());
      try {
        download_blobs(env, ref.repo, listing.commit, files, progress, options.download);
      } catch (...) {
        progress.stop();
        throw;
      }
    }
    const double dt = monotonic_seconds() - t0;
    std::fprintf(stderr, "downloaded %s in %s (%s/s)\n", format_bytes(missing).c_str(),
                 format_duration(dt).c_str(),
                 format_bytes(uint64_t(double(missing) / std::max(dt, 1e-3))).c_str());
    result.downloaded = missing;
  }
  for (const RepoFile& f : files) link_snapshot(ref.repo, listing.commit, f);
  write_ref(ref, listing.commit);
  return result;
}

}  // namespace tandem::catalog
