// Download progress on stderr: on a terminal, a bar per file in flight and
// one for the whole download (bytes, rate, ETA), redrawn in place five times
// a second; otherwise plain lines (each file's start and end, and the total
// every 10 s), fit for logs.
//
// Thread-safe: transfers call add()/reset_file() from any thread; those are
// lock-free. Lines written through message() never tear the bars.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::catalog {

class Progress {
 public:
  // `total`: the bytes this download will transfer (what is missing);
  // `max_files`: how many start_file() calls may come.
  Progress(FILE* out, bool tty, uint64_t total, size_t max_files);
  ~Progress();  // stop()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A file starts; `have` of its `size` bytes are already on disk (resumed).
  int start_file(const std::string& name, uint64_t size, uint64_t have);
  void add(int id, uint64_t bytes);
  // The file's bytes on disk went back to `have` (a server ignored Range).
  void reset_file(int id, uint64_t have);
  void finish_file(int id, const std::string& note);
  void message(const std::string& line);
  // Prints the pending lines and erases the bars; idempotent.
  void stop();

 private:
  struct File {
    std::string name;
    uint64_t size = 0;
    uint64_t have0 = 0;             // on disk when it started
    std::atomic<uint64_t> have{0};  // on disk now
    bool active = true;
  };
  void run();
  void render_locked(bool final);
  std::string total_line(double now);
  uint64_t transferred() const;

  FILE* out_;
  bool tty_;
  uint64_t total_;
  double t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<File>> files_;  // max_files slots, filled in order
  size_t count_ = 0;
  std::vector<std::string> pending_;  // lines to print above the bars
  int drawn_lines_ = 0;
  double last_plain_ = 0;
  std::vector<std::pair<double, uint64_t>> samples_;  // (time, transferred) for the rate
  bool stop_ = false;
  std::thread thread_;
};

// "1:05:03", "4:12", "0:07"; "--:--" for unknown.
std::string format_duration(double seconds);

}  // namespace tandem::catalog
