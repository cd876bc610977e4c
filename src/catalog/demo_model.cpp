#include "catalog/demo_model.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/env.h"
#include "core/error.h"

namespace tandem::catalog {

namespace fs = std::filesystem;

namespace {

std::string cache_root() {
  const std::string home = env_or("HOME", "/tmp");
  return env_or("TANDEM_CACHE", env_or("XDG_CACHE_HOME", home + "/.cache") + "/tandem");
}

// FNV-1a over names and bytes: a new build with other weights gets its own
// folder instead of reusing a stale one.
std::string content_hash() {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const char* p, const char* e) {
    for (; p != e; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  };
  for (const EmbeddedFile* f = kDemoModelFiles; f->name; ++f) {
    const std::string name = f->name;
    mix(name.data(), name.data() + name.size());
    mix(f->begin, f->end);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

std::string demo_model_dir() {
  const fs::path dir =
      fs::path(cache_root()) / "demo" / (std::string(kDemoModelName) + "-" + content_hash());
  if (fs::exists(dir / "config.json")) return dir.string();
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) fail("cannot create %s for the demo model: %s", tmp.c_str(), ec.message().c_str());
  for (const EmbeddedFile* f = kDemoModelFiles; f->name; ++f) {
    std::ofstream out(tmp / f->name, std::ios::binary);
    out.write(f->begin, f->end - f->begin);
    if (!out) fail("cannot write %s: disk full or not writable?", (tmp / f->name).c_str());
  }
  fs::rename(tmp, dir, ec);
  if (ec) {  // another process won the race: use its copy
    fs::remove_all(tmp);
    if (!fs::exists(dir / "config.json"))
      fail("cannot move the demo model into %s: %s", dir.c_str(), ec.message().c_str());
  }
  return dir.string();
}

}  // namespace tandem::catalog
