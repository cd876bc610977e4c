#include "catalog/progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "catalog/disk.h"
#include "core/clock.h"
#include "core/error.h"

namespace tandem::catalog {

namespace {

constexpr double kTtyPeriodS = 0.2;
constexpr double kPlainPeriodS = 10.0;
constexpr double kRateWindowS = 5.0;
constexpr int kBarWidth = 24;
constexpr size_t kNameWidth = 36;

std::string bar(uint64_t have, uint64_t size) {
  const int filled = size ? int(double(have) / double(size) * kBarWidth) : kBarWidth;
  return "[" + std::string(size_t(std::clamp(filled, 0, kBarWidth)), '#') +
         std::string(size_t(kBarWidth - std::clamp(filled, 0, kBarWidth)), '.') + "]";
}

std::string short_name(const std::string& name) {
  if (name.size() <= kNameWidth) return name + std::string(kNameWidth - name.size(), ' ');
  return "..." + name.substr(name.size() - (kNameWidth - 3));
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0 || s > 99 * 3600) return "--:--";
  const long t = std::lround(s);
  if (t >= 3600) return strprintf("%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  return strprintf("%ld:%02ld", t / 60, t % 60);
}

Progress::Progress(FILE* out, bool tty, uint64_t total, size_t max_files)
    : out_(out), tty_(tty), total_(total), t0_(monotonic_seconds()), files_(max_files) {
  last_plain_ = t0_;
  thread_ = std::thread([this] { run(); });
}

Progress::~Progress() {
  stop();
}

int Progress::start_file(const std::string& name, uint64_t size, uint64_t have) {
  std::lock_guard<std::mutex> lock(mu_);
  if (count_ == files_.size()) fail("Progress: more files than announced");
  files_[count_] = std::make_unique<File>();
  File& f = *files_[count_];
  f.name = name;
  f.size = size;
  f.have0 = have;
  f.have = have;
  if (!tty_)
    pending_.push_back("downloading " + name + " (" + format_bytes(size) +
                       (have ? ", resuming at " + format_bytes(have) : std::string()) + ")");
  cv_.notify_all();
  return int(count_++);
}

void Progress::add(int id, uint64_t bytes) {
  files_[size_t(id)]->have.fetch_add(bytes, std::memory_order_relaxed);
}

void Progress::reset_file(int id, uint64_t have) {
  files_[size_t(id)]->have.store(have, std::memory_order_relaxed);
}

void Progress::finish_file(int id, const std::string& note) {
  std::lock_guard<std::mutex> lock(mu_);
  File& f = *files_[size_t(id)];
  f.active = false;
  pending_.push_back((tty_ ? "  done  " + short_name(f.name) : "done " + f.name) + "  " +
                     format_bytes(f.size) + (note.empty() ? "" : "  " + note));
  cv_.notify_all();
}

void Progress::message(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(line);
  cv_.notify_all();
}

uint64_t Progress::transferred() const {
  uint64_t sum = 0;
  for (size_t i = 0; i < count_; ++i) {
    const File& f = *files_[i];
    const uint64_t h = f.have.load(std::memory_order_relaxed);
    sum += h > f.have0 ? h - f.have0 : 0;
  }
  return sum;
}

std::string Progress::total_line(double now) {
  const uint64_t done = std::min(transferred(), total_);
  samples_.emplace_back(now, done);
  while (samples_.size() > 2 && now - samples_.front().first > kRateWindowS)
    samples_.erase(samples_.begin());
  const auto& [t_first, b_first] = samples_.front();
  const double rate =
      now > t_first ? double(done - std::min(done, b_first)) / (now - t_first) : 0.0;
  const double eta = rate > 0 ? double(total_ - done) / rate : -1;
  return strprintf("%s %s / %s  %s/s  ETA %s", tty_ ? bar(done, total_).c_str() : "total",
                   format_bytes(done).c_str(), format_bytes(total_).c_str(),
                   format_bytes(uint64_t(rate)).c_str(), format_duration(eta).c_str());
}

void Progress::render_locked(bool final) {
  const double now = monotonic_seconds();
  std::string text;
  if (tty_) {
    for (int i = 0; i < drawn_lines_; ++i) text += "\033[1A\r\033[K";
    drawn_lines_ = 0;
  }
  for (const std::string& l : pending_) text += l + (tty_ ? "\033[K\n" : "\n");
  pending_.clear();
  if (tty_ && !final) {
    for (size_t i = 0; i < count_; ++i) {
      const File& f = *files_[i];
      if (!f.active) continue;
      const uint64_t h = f.have.load(std::memory_order_relaxed);
      text += "  " + short_name(f.name) + " " + bar(h, f.size) + " " + format_bytes(h) + " / " +
              format_bytes(f.size) + "\033[K\n";
      ++drawn_lines_;
    }
    text += "  " + std::string(kNameWidth, ' ') + " " + total_line(now) + "\033[K\n";
    ++drawn_lines_;
  } else if (!tty_ && !final && now - last_plain_ >= kPlainPeriodS) {
    text += total_line(now) + "\n";
    last_plain_ = now;
  }
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

void Progress::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(tty_ ? kTtyPeriodS : 1.0));
    if (stop_) break;
    render_locked(false);
  }
}

void Progress::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  render_locked(true);
}

}  // namespace tandem::catalog
