#include "catalog/blob_hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem::catalog {

struct BlobHash::Impl {
  EVP_MD_CTX* ctx = nullptr;
  bool git_blob = false;
  uint64_t size = 0;
};

BlobHash::BlobHash(bool git_blob, uint64_t size) : impl_(std::make_unique<Impl>()) {
  impl_->git_blob = git_blob;
  impl_->size = size;
  impl_->ctx = EVP_MD_CTX_new();
  if (!impl_->ctx) fail("cannot allocate a hash context");
  reset();
}

BlobHash::~BlobHash() {
  EVP_MD_CTX_free(impl_->ctx);
}

void BlobHash::reset() {
  if (EVP_DigestInit_ex(impl_->ctx, impl_->git_blob ? EVP_sha1() : EVP_sha256(), nullptr) != 1)
    fail("cannot start a hash");
  if (impl_->git_blob) {
    const std::string header = "blob " + std::to_string(impl_->size);
    update(header.c_str(), header.size() + 1);  // with its NUL
  }
}

void BlobHash::update(const void* data, size_t n) {
  if (n && EVP_DigestUpdate(impl_->ctx, data, n) != 1) fail("hash update failed");
}

std::string BlobHash::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, md, &len) != 1) fail("hash final failed");
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += digits[md[i] >> 4];
    out += digits[md[i] & 15];
  }
  return out;
}

std::string hash_file(const std::string& path, bool git_blob) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read %s: %s", path.c_str(), ec.message().c_str());
  BlobHash h(git_blob, size);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot read %s", path.c_str());
  std::vector<char> buf(size_t(1) << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  const bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail("error reading %s", path.c_str());
  return h.hex();
}

}  // namespace tandem::catalog
