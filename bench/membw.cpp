// Measures this machine's memory read bandwidth: sums a buffer far larger
// than the caches with 512-bit (or 256-bit) loads on 1 and 2 threads (or
// --threads N), best of several runs. The GEMV benchmark compares itself
// against these figures.
//
//   membw [--gib G] [--threads N] [--runs R] [--huge] [--wait-idle S]
//
// --wait-idle S (default 60): before each figure, wait up to S seconds for the
// machine to be idle (see bench::wait_for_idle); "busy" marks a figure taken
// without that.
#include <cstdio>

#include "bench_util.h"

int main(int argc, char** argv) {
  bench::Args args(argc, argv);
  const double gib = args.get("--gib", 2.0);
  const int runs = int(args.get("--runs", 5.0));
  const bool huge = args.has("--huge");
  const double wait_idle = args.get("--wait-idle", 60.0);
  std::vector<int> thread_counts = {1, 2};
  if (args.has("--threads")) thread_counts = {int(args.get("--threads", 1.0))};

  bench::Buffer buf(size_t(gib * double(1 << 30)) / 4096 * 4096, huge);
  std::printf("buffer %.2f GiB%s, %s loads, best of %d runs\n\n", gib,
              huge ? " (transparent huge pages)" : "",
              __builtin_cpu_supports("avx512f") ? "512-bit" : "256-bit", runs);
  std::printf("| threads | read GB/s |\n|---:|---:|\n");
  for (int t : thread_counts) {
    tandem::ThreadPool pool(t);
    const bool idle = bench::wait_for_idle(wait_idle);
    std::printf("| %d | %.1f%s |\n", t, bench::read_bandwidth(pool, buf, runs),
                idle ? "" : " (busy)");
    std::fflush(stdout);
  }
  return 0;
}
