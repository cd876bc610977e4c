#include "catalog/disk.h"

#include <sys/statvfs.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace tandem::catalog {

uint64_t free_disk_bytes(const std::string& path) {
  if (const char* v = std::getenv("TANDEM_TEST_FREE_BYTES"); v && *v)
    return std::strtoull(v, nullptr, 10);
  std::filesystem::path p = std::filesystem::absolute(path);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path())
    p = p.parent_path();
  struct statvfs st {};
  if (statvfs(p.c_str(), &st) != 0) fail("cannot measure free disk space of %s", p.c_str());
  return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

void check_free_space(uint64_t missing, const std::string& dir, bool force,
                      const std::string& force_hint) {
  if (missing == 0) return;
  const uint64_t free = free_disk_bytes(dir);
  const double needed = 1.1 * double(missing);
  if (double(free) >= needed) return;
  const std::string msg = "not enough disk space in " + dir + ": the download needs " +
                          format_bytes(missing) + " (" + format_bytes(uint64_t(needed)) +
                          " with the 10% margin), and " + format_bytes(free) + " is free";
  if (force) {
    std::fprintf(stderr, "warning: %s; continuing (--force)\n", msg.c_str());
    return;
  }
  fail("%s; free some space, or %s", msg.c_str(), force_hint.c_str());
}

std::string format_bytes(uint64_t bytes) {
  const double b = double(bytes);
  if (b >= 1e9) return strprintf("%.2f GB", b / 1e9);
  if (b >= 1e6) return strprintf("%.1f MB", b / 1e6);
  if (b >= 1e3) return strprintf("%.1f KB", b / 1e3);
  return strprintf("%llu B", (unsigned long long)bytes);
}

}  // namespace tandem::catalog
