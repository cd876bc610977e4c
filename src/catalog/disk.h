// Free disk space and the download preflight.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::catalog {

// Bytes available to this user on the file system holding `path` (or its
// nearest existing ancestor). $TANDEM_TEST_FREE_BYTES, when set, replaces
// the measurement (tests use it to simulate a full disk).
uint64_t free_disk_bytes(const std::string& path);

// The preflight rule: a download of `missing` bytes into `dir` needs
// 1.1 × missing free. Throws tandem::Error with both figures and `force_hint`
// (how to override) when short, unless `force`.
void check_free_space(uint64_t missing, const std::string& dir, bool force,
                      const std::string& force_hint);

// "3.52 GB", "812.3 MB", "4.0 KB", "17 B" (decimal units, as download sizes are
// usually quoted).
std::string format_bytes(uint64_t bytes);

}  // namespace tandem::catalog
