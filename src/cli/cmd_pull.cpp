// tandem pull / tandem rm: download a model into the hub cache, or remove it.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "catalog/catalog.h"
#include "catalog/disk.h"
#include "catalog/hub_cache.h"
#include "catalog/pull.h"
#include "catalog/resolve.h"
#include "cli/commands.h"
#include "core/error.h"

namespace tandem::cli {

namespace {

using namespace tandem::catalog;

struct PullCliOptions {
  std::string model;
  bool force = false;
  bool yes = false;
};

// Prints the snapshot folder on stdout (for scripts); progress goes to stderr.
int run_pull(const PullCliOptions& o) {
  const Resolved r = resolve_name(o.model);
  if (r.is_local()) {
    std::fprintf(stderr, "%s is a local folder: nothing to pull\n", r.local_path.c_str());
    std::printf("%s\n", r.local_path.c_str());
    return 0;
  }
  if (r.entry)
    if (const std::string why = unsupported_reason(*r.entry); !why.empty())
      std::fprintf(stderr, "note: %s cannot be served yet: %s\n", o.model.c_str(), why.c_str());
  require_token_if_gated(r);
  PullOptions p;
  p.force = o.force;
  p.assume_yes = o.yes;
  p.force_hint = "pass --force to download anyway";
  const PullResult res = pull_repo(r.ref, p);
  if (res.downloaded == 0 && !res.from_cache_only)
    std::fprintf(stderr, "%s is up to date (commit %.10s)\n", r.ref.display().c_str(),
                 res.commit.c_str());
  std::printf("%s\n", res.snapshot.c_str());
  return 0;
}

struct RmOptions {
  std::string model;
  bool yes = false;
};

int run_rm(const RmOptions& o) {
  const Resolved r = resolve_name(o.model);
  if (r.is_local())
    fail("%s is a local folder; tandem rm removes only downloaded models from the cache",
         r.local_path.c_str());
  const std::string dir = repo_cache_dir(r.ref.repo);
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec))
    fail("%s (%s) is not in the cache (%s)", o.model.c_str(), r.ref.repo.c_str(), dir.c_str());
  const uint64_t bytes = dir_size_bytes(dir);
  if (!o.yes) {
    if (!isatty(STDIN_FILENO))
      fail("pass -y to remove %s (%s) without a question", dir.c_str(),
           format_bytes(bytes).c_str());
    std::fprintf(stderr, "Remove %s (%s)? [y/N] ", dir.c_str(), format_bytes(bytes).c_str());
    std::string answer;
    if (!std::getline(std::cin, answer) || answer.empty() || (answer[0] != 'y' && answer[0] != 'Y'))
      fail("nothing removed");
  }
  std::filesystem::remove_all(dir, ec);
  if (ec) fail("cannot remove %s: %s", dir.c_str(), ec.message().c_str());
  std::filesystem::remove_all(repo_lock_dir(r.ref.repo), ec);
  std::printf("removed %s (%s)\n", dir.c_str(), format_bytes(bytes).c_str());
  return 0;
}

}  // namespace

Runner add_pull_command(CLI::App& app) {
  auto o = std::make_shared<PullCliOptions>();
  auto* cmd = app.add_subcommand("pull", "Download a model (alias or org/name[@revision])");
  cmd->add_option("model", o->model, "Alias, user alias or org/name[@revision]")->required();
  cmd->add_flag("--force", o->force, "Download even when the disk looks too small");
  cmd->add_flag("-y,--yes", o->yes, "Do not ask before downloads over 10 GB");
  return [o] { return run_pull(*o); };
}

Runner add_rm_command(CLI::App& app) {
  auto o = std::make_shared<RmOptions>();
  auto* cmd = app.add_subcommand("rm", "Remove a downloaded model from the cache");
  cmd->add_option("model", o->model, "Alias, user alias or org/name")->required();
  cmd->add_flag("-y,--yes", o->yes, "Do not ask");
  return [o] { return run_rm(*o); };
}

}  // namespace tandem::cli
