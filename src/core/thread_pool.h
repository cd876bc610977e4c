// A fork-join thread pool for the CPU backend's data-parallel kernels.
//
// Contract: parallel_for splits [0, n) into contiguous chunks, runs
// fn(begin, end) on the pool's threads and on the calling thread, and returns
// when every chunk is done. One parallel_for at a time per pool (the engine
// loop is the only caller). Workers spin briefly before sleeping so the ~200
// dispatches per decoded token cost microseconds, not a context switch each.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace tandem {

class ThreadPool {
 public:
  // threads: total threads including the caller; <= 0 means the number of
  // hardware threads.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;

  // Runs fn over [0, n) in chunks of at least `grain` items.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
