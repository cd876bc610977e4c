// The checksum of a cached blob, computed while it downloads: the sha256 of
// the content for LFS files, the git blob id (sha1 of "blob <size>\0" +
// content) for small files. Uses OpenSSL's libcrypto (EVP).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tandem::catalog {

class BlobHash {
 public:
  // git_blob: hash as git does, for a file of `size` bytes; else sha256.
  BlobHash(bool git_blob, uint64_t size);
  ~BlobHash();
  BlobHash(const BlobHash&) = delete;
  BlobHash& operator=(const BlobHash&) = delete;

  void reset();  // back to the state after construction
  void update(const void* data, size_t n);
  std::string hex();  // finishes; call once after the last update

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hashes the file at `path` as BlobHash(git_blob, file size) would.
std::string hash_file(const std::string& path, bool git_blob);

}  // namespace tandem::catalog
