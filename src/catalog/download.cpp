#include "catalog/download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "catalog/blob_hash.h"
#include "catalog/disk.h"
#include "catalog/hub_cache.h"

namespace tandem::catalog {

namespace fs = std::filesystem;

namespace {

std::string blob_path(const std::string& repo, const RepoFile& f) {
  return repo_cache_dir(repo) + "/blobs/" + f.blob_name();
}

uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const uint64_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

// An exclusive flock on .locks/<repo>/<blob>.lock, released on destruction.
class BlobLock {
 public:
  BlobLock(const std::string& repo, const RepoFile& f) {
    const std::string dir = repo_lock_dir(repo);
    fs::create_directories(dir);
    const std::string path = dir + "/" + f.blob_name() + ".lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot open the lock file %s: %s", path.c_str(), std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) fail("cannot lock %s: %s", path.c_str(), std::strerror(errno));
  }
  ~BlobLock() { ::close(fd_); }

 private:
  int fd_ = -1;
};

// A fatal error: not worth retrying.
class Fatal : public Error {
 public:
  using Error::Error;
};

// One attempt's transfer state, shared with the curl callbacks.
struct Transfer {
  FILE* out = nullptr;
  BlobHash* hash = nullptr;
  Progress* progress = nullptr;
  int id = 0;
  uint64_t have = 0;            // bytes in the file before this attempt
  bool checked = false;         // the status was looked at (first body bytes)
  bool restarted = false;       // the server ignored Range: the file was rewound
  bool range_mismatch = false;  // 206 for another offset than asked
  int write_errno = 0;
  std::string content_range;
  CURL* curl = nullptr;
  const std::atomic<bool>* abort = nullptr;
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t n = size * count;
  std::string line(data, n);
  if (line.size() > 14 && strncasecmp(line.c_str(), "content-range:", 14) == 0)
    t.content_range = line.substr(14);
  if (line.rfind("HTTP/", 0) == 0) t.content_range.clear();  // a redirect's headers end
  return n;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (!t.checked) {
    t.checked = true;
    long status = 0;
    curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &status);
    if (t.have > 0 && status == 200) {
      // The server sent the whole file: start over.
      if (std::fflush(t.out) != 0 || ::ftruncate(fileno(t.out), 0) != 0) {
        t.write_errno = errno;
        return 0;
      }
      t.hash->reset();
      t.progress->reset_file(t.id, 0);
      t.restarted = true;
    } else if (t.have > 0 && status == 206) {
      // "bytes START-END/TOTAL": START must be where the file ends.
      const size_t p = t.content_range.find("bytes");
      const uint64_t start =
          p == std::string::npos ? 0 : std::strtoull(t.content_range.c_str() + p + 5, nullptr, 10);
      if (start != t.have) {
        t.range_mismatch = true;
        return 0;
      }
    }
  }
  if (std::fwrite(data, 1, n, t.out) != n) {
    t.write_errno = errno ? errno : EIO;
    return 0;
  }
  t.hash->update(data, n);
  t.progress->add(t.id, n);
  return n;
}

int on_xfer(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<Transfer*>(user)->abort->load() ? 1 : 0;
}

// Feeds the first `n` bytes of `path` to `hash`.
void hash_prefix(const std::string& path, uint64_t n, BlobHash& hash) {
  if (n == 0) return;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot read %s", path.c_str());
  std::vector<char> buf(size_t(1) << 20);
  while (n > 0) {
    const size_t got = std::fread(buf.data(), 1, std::min<uint64_t>(n, buf.size()), f);
    if (got == 0) break;
    hash.update(buf.data(), got);
    n -= got;
  }
  std::fclose(f);
}

struct Job {
  const HubEnv* env;
  std::string repo, commit;
  Progress* progress;
  const DownloadOptions* options;
  std::atomic<bool>* abort;
};

// One attempt: transfers what is missing of `part`. Returns "" when the file
// is complete on disk, else why the attempt failed (retryable). Throws Fatal.
std::string attempt_transfer(const Job& job, const RepoFile& f, const std::string& part,
                             BlobHash& hash, int id) {
  uint64_t have = file_size_or_zero(part);
  if (have > f.size) {
    fs::resize_file(part, 0);
    have = 0;
  }
  hash.reset();
  hash_prefix(part, have, hash);
  job.progress->reset_file(id, have);
  if (have == f.size) {
    // Nothing left to fetch (a zero-byte file, or a resumed file that was whole).
    if (!fs::exists(part)) std::fclose(std::fopen(part.c_str(), "wb"));
    return "";
  }

  FILE* out = std::fopen(part.c_str(), "ab");
  if (!out) throw Fatal(strprintf("cannot write %s: %s", part.c_str(), std::strerror(errno)));
  const std::string url =
      job.env->endpoint + "/" + job.repo + "/resolve/" + job.commit + "/" + encode_path(f.name);
  CurlHeaders headers;
  CurlHandle h = hub_handle(*job.env, url, headers);
  Transfer t;
  t.out = out;
  t.hash = &hash;
  t.progress = job.progress;
  t.id = id;
  t.have = have;
  t.curl = h.get();
  t.abort = job.abort;
  char errbuf[CURL_ERROR_SIZE] = "";
  const std::string range = std::to_string(have) + "-";
  if (have > 0) curl_easy_setopt(h.get(), CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(h.get(), CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h.get(), CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h.get(), CURLOPT_XFERINFOFUNCTION, on_xfer);
  curl_easy_setopt(h.get(), CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(h.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, errbuf);
  const CURLcode rc = curl_easy_perform(h.get());
  long status = 0;
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &status);
  const int close_err = std::fclose(out) != 0 ? errno : 0;

  if (t.write_errno || close_err)
    throw Fatal(strprintf("cannot write %s: %s", part.c_str(),
                          std::strerror(t.write_errno ? t.write_errno : close_err)));
  if (job.abort->load()) throw Fatal("stopped");
  if (t.range_mismatch) {
    fs::resize_file(part, 0);
    return "the server answered another byte range than asked";
  }
  if (rc == CURLE_HTTP_RETURNED_ERROR) {
    if (status == 416) {
      fs::resize_file(part, 0);  // our partial file does not fit the server's: restart
      return "HTTP 416 for the resumed range";
    }
    if (!retryable_status(status)) {
      const char* hint = (status == 401 || status == 403)
                             ? ": the repo is gated or private (accept its license, set HF_TOKEN)"
                             : "";
      throw Fatal(strprintf("%s: the hub answered HTTP %ld%s", f.name.c_str(), status, hint));
    }
    return strprintf("HTTP %ld", status);
  }
  if (rc != CURLE_OK) return errbuf[0] ? errbuf : curl_easy_strerror(rc);
  const uint64_t now = file_size_or_zero(part);
  if (now != f.size)
    return strprintf("received %llu of %llu bytes", (unsigned long long)now,
                     (unsigned long long)f.size);
  return "";
}

void download_one(const Job& job, const RepoFile& f) {
  BlobLock lock(job.repo, f);  // another process may be fetching this blob
  if (blob_complete(job.repo, f)) return;
  const std::string blob = blob_path(job.repo, f), part = blob + ".incomplete";
  fs::create_directories(fs::path(blob).parent_path());
  BlobHash hash(/*git_blob=*/f.sha256.empty(), f.size);
  const int id =
      job.progress->start_file(f.name, f.size, std::min(file_size_or_zero(part), f.size));
  for (int attempt = 1;; ++attempt) {
    if (job.abort->load()) throw Fatal("stopped");
    const std::string why = attempt_transfer(job, f, part, hash, id);
    if (why.empty()) break;
    if (attempt >= job.options->max_attempts)
      throw Fatal(strprintf("%s: download failed after %d attempts: %s", f.name.c_str(), attempt,
                            why.c_str()));
    const double delay = std::min(8.0, job.options->backoff_s * double(1 << (attempt - 1)));
    job.progress->message(strprintf("  retry %s in %.1f s (attempt %d of %d): %s", f.name.c_str(),
                                    delay, attempt + 1, job.options->max_attempts, why.c_str()));
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
  const std::string got = hash.hex();
  const std::string& want = f.blob_name();
  if (got != want) {
    std::error_code ec;
    fs::remove(part, ec);
    throw Fatal(strprintf(
        "%s: checksum mismatch: expected %s %s, got %s; the partial file was "
        "deleted, run the command again to download it afresh",
        f.name.c_str(), f.sha256.empty() ? "git blob id" : "sha256", want.c_str(), got.c_str()));
  }
  fs::rename(part, blob);
  job.progress->finish_file(id, f.sha256.empty() ? "blob id ok" : "sha256 ok");
}

}  // namespace

bool blob_complete(const std::string& repo, const RepoFile& f) {
  std::error_code ec;
  const std::string p = blob_path(repo, f);
  return fs::is_regular_file(p, ec) && fs::file_size(p, ec) == f.size;
}

uint64_t cached_bytes(const std::string& repo, const RepoFile& f) {
  if (blob_complete(repo, f)) return f.size;
  const uint64_t part = file_size_or_zero(blob_path(repo, f) + ".incomplete");
  return part <= f.size ? part : 0;
}

void link_snapshot(const std::string& repo, const std::string& commit, const RepoFile& f) {
  const fs::path link = fs::path(repo_cache_dir(repo)) / "snapshots" / commit / f.name;
  fs::create_directories(link.parent_path());
  std::string target;
  for (size_t i = 0, depth = size_t(std::count(f.name.begin(), f.name.end(), '/')); i < depth + 2;
       ++i)
    target += "../";
  target += "blobs/" + f.blob_name();
  std::error_code ec;
  if (fs::is_symlink(link, ec) && fs::read_symlink(link, ec).string() == target) return;
  const fs::path tmp = link.string() + ".tmp-link-" + std::to_string(getpid()) + "-" +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp);
  fs::rename(tmp, link);
}

void download_blobs(const HubEnv& env, const std::string& repo, const std::string& commit,
                    const std::vector<RepoFile>& files, Progress& progress,
                    const DownloadOptions& options) {
  // Largest first, so the long transfers start at once.
  std::vector<const RepoFile*> order;
  for (const RepoFile& f : files) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(),
                   [](const RepoFile* a, const RepoFile* b) { return a->size > b->size; });
  std::atomic<bool> abort{false};
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  std::exception_ptr first_error;
  Job job{&env, repo, commit, &progress, &options, &abort};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < order.size();) {
      if (abort.load()) return;
      try {
        download_one(job, *order[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!first_error) first_error = std::current_exception();
        abort.store(true);
        return;
      }
    }
  };
  const int n = std::max(1, std::min<int>(options.workers, int(order.size())));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace tandem::catalog
