// Fork-join pool: one job at a time, published through a generation counter.
//
// Protocol (every step is an acquire/release pair, so the job fields need no
// lock of their own):
//   caller: writes job_fn/job_n/job_chunks, next_chunk = 0 and
//           pending = workers (relaxed), then generation += 1 (release) under
//           wake_mu, then notifies.
//   worker: sees generation != seen (acquire) -> reads the job fields, takes
//           chunks from next_chunk until none is left, then pending -= 1
//           (acq_rel).
//   caller: takes chunks the same way, then waits for pending == 0 (acquire):
//           every worker has finished reading the job and writing its
//           results, so the job fields may be rewritten and fn's results are
//           visible.
// Every worker acknowledges every generation, even one it got no chunk of,
// so no worker can still be reading a job when the next one is written.
//
// Chunks are handed out through an atomic counter, up to kChunksPerThread per
// thread: when another process takes the core of one of our threads (this is
// a 2-core machine shared with the server's other threads), the others take
// over its remaining chunks instead of idling until it is scheduled again.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tandem {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a waiting thread spins before it blocks. Long enough to bridge the
// gap between the back-to-back dispatches of one decoded token, short enough
// not to burn a core while the engine is idle. After kPauseTime the spin
// yields between checks, so that on an oversubscribed core the thread it
// waits for (or any other) can run.
constexpr auto kSpinTime = std::chrono::microseconds(100);
constexpr auto kPauseTime = std::chrono::microseconds(20);

// Spins until pred() holds or the spin budget is spent; returns pred().
template <class Pred>
bool spin_until(Pred pred) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    const auto spent = std::chrono::steady_clock::now() - start;
    if (spent >= kSpinTime) return pred();
    if (spent >= kPauseTime) std::this_thread::yield();
  }
}

// Chunks per thread when the grain allows that many; see the protocol above.
constexpr int64_t kChunksPerThread = 4;

// Nonzero while this thread runs a chunk: a parallel_for issued from inside a
// chunk runs inline instead of deadlocking on the busy pool.
thread_local int tl_chunk_depth = 0;

}  // namespace

struct ThreadPool::Impl {
  using Fn = std::function<void(int64_t, int64_t)>;

  int threads = 1;
  std::vector<std::thread> workers;

  // The current job; written only by the caller while no worker reads it.
  const Fn* job_fn = nullptr;
  int64_t job_n = 0;
  int job_chunks = 0;
  bool stopping = false;

  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};     // workers yet to acknowledge the current generation
  std::atomic<int> next_chunk{0};  // the next chunk of the current job to hand out

  std::mutex wake_mu;  // guards the sleep of workers (paired with generation)
  std::condition_variable wake_cv;
  std::mutex done_mu;  // guards the sleep of the caller (paired with pending)
  std::condition_variable done_cv;

  std::mutex error_mu;
  std::exception_ptr error;  // the first exception thrown by any chunk

  // Chunk i of job_chunks near-equal contiguous chunks of [0, job_n).
  void run_chunk(int i) {
    const int64_t base = job_n / job_chunks, extra = job_n % job_chunks;
    const int64_t begin = i * base + std::min<int64_t>(i, extra);
    const int64_t end = begin + base + (i < extra ? 1 : 0);
    ++tl_chunk_depth;
    try {
      (*job_fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu);
      if (!error) error = std::current_exception();
    }
    --tl_chunk_depth;
  }

  // Runs chunks of the current job until all have been handed out.
  void run_chunks() {
    for (int i; (i = next_chunk.fetch_add(1, std::memory_order_relaxed)) < job_chunks;)
      run_chunk(i);
  }

  void publish() {
    {
      // Bumping under wake_mu closes the window between a worker's last check
      // of the predicate and its sleep, so the notify cannot be lost.
      std::lock_guard<std::mutex> lk(wake_mu);
      generation.fetch_add(1, std::memory_order_release);
    }
    wake_cv.notify_all();
  }

  void worker_main() {
    uint64_t seen = 0;
    auto changed = [&] { return generation.load(std::memory_order_acquire) != seen; };
    for (;;) {
      if (!spin_until(changed)) {
        std::unique_lock<std::mutex> lk(wake_mu);
        wake_cv.wait(lk, changed);
      }
      // The caller publishes the next generation only after this worker has
      // acknowledged the current one, so the counter moved by exactly one.
      ++seen;
      if (stopping) return;
      run_chunks();
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(done_mu);
        done_cv.notify_one();
      }
    }
  }

  void wait_for_workers() {
    auto done = [&] { return pending.load(std::memory_order_acquire) == 0; };
    if (spin_until(done)) return;
    std::unique_lock<std::mutex> lk(done_mu);
    done_cv.wait(lk, done);
  }
};

ThreadPool::ThreadPool(int threads) : impl_(std::make_unique<Impl>()) {
  if (threads <= 0) threads = int(std::thread::hardware_concurrency());
  impl_->threads = std::max(threads, 1);
  impl_->workers.reserve(impl_->threads - 1);
  for (int i = 1; i < impl_->threads; ++i)
    impl_->workers.emplace_back([this] { impl_->worker_main(); });
}

ThreadPool::~ThreadPool() {
  impl_->stopping = true;  // published to the workers by the release below
  impl_->publish();
  for (auto& t : impl_->workers) t.join();
}

int ThreadPool::size() const {
  return impl_->threads;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  Impl& p = *impl_;
  // Each of the `chunks` chunks gets at least floor(n / chunks) >= grain items.
  const int64_t chunks = std::min<int64_t>(p.threads * kChunksPerThread, n / grain);
  if (chunks <= 1 || tl_chunk_depth > 0) {
    fn(0, n);
    return;
  }

  p.job_fn = &fn;
  p.job_n = n;
  p.job_chunks = int(chunks);
  p.error = nullptr;
  p.next_chunk.store(0, std::memory_order_relaxed);
  p.pending.store(int(p.workers.size()), std::memory_order_relaxed);
  p.publish();

  p.run_chunks();
  p.wait_for_workers();

  if (p.error) {
    std::exception_ptr e = p.error;
    p.error = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace tandem
