// Throughput of cpu::matmul at real model shapes.
//
// n = 1 (decode GEMV): GB/s of weights streamed and the fraction of this
// machine's read bandwidth (measured inline like membw, or given with
// --peak1/--peak2 in GB/s for 1/2 threads). Each shape is replicated over
// >= --rotate-mib MiB of distinct copies that are cycled through, so a matrix
// that fits the L3 cache is not measured from it (decode streams every layer).
// n = 64 (prefill): GFLOP/s (2 * n * rows * cols per call, the copies cycled
// through as well, so the weights come from memory as in a model's step), for
// bf16 weights also with bf16 inputs (cpu::MatmulInputs::Bf16). "bf16-packed"
// is bf16 packed as the CPU loads it where it can (WeightFormat::PackedBf16);
// "q4" / "q8" are MLX affine codes (group 64, bf16 scales; random codes), and
// "q4-packed" / "q8-packed" the same packed as the CPU loads them where it
// can (WeightFormat::PackedAffine). Their GB/s count codes, scales and biases.
// Figures are the
// best of --trials timed trials (default 5) within --seconds per measurement.
//
//   gemv [--seconds S] [--trials T] [--dtypes bf16,bf16-packed,f32,f16,q4,q4-packed,q8,q8-packed]
//        [--threads 1,2]
//        [--shapes all|small]
//        [--peak1 GBS --peak2 GBS] [--rotate-mib M] [--n N] [--huge] [--wait-idle S]
//        [--no-vnni]
//
// TANDEM_ISA=avx2 (or scalar) narrows the kernels' ISA; --no-vnni keeps the
// quantized kernels off VNNI (vpmaddubsw), as on processors without it.
//
// --wait-idle S (default 60): before each measurement, wait up to S seconds
// for the machine to be idle (see bench::wait_for_idle); rows measured
// without that are marked "busy".
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "bench_util.h"
#include "core/dtype.h"

using namespace tandem;

namespace {

struct BenchShape {
  const char* name;
  int64_t rows, cols;
};

const BenchShape kShapes[] = {
    {"llama-3.2-1B q/o", 2048, 2048},   {"llama-3.2-1B up/gate", 8192, 2048},
    {"llama-3.2-1B down", 2048, 8192},  {"llama-3.2-1B head", 128256, 2048},
    {"gemma-3-1b up/gate", 6912, 1152}, {"gemma-3-1b down", 1152, 6912},
    {"gemma-3-1b head", 262144, 1152},
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Fills a weight buffer with small pseudo-random values of the given dtype.
void fill_weights(void* data, DType dtype, size_t count, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < count; ++i) {
    s = s * 1664525u + 1013904223u;
    const float v = (float(s >> 8) / float(1 << 24) - 0.5f) * 0.1f;
    if (dtype == DType::F32)
      static_cast<float*>(data)[i] = v;
    else if (dtype == DType::BF16)
      static_cast<uint16_t*>(data)[i] = f32_to_bf16(v);
    else
      static_cast<uint16_t*>(data)[i] = f32_to_f16(v);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv);
  const double seconds = args.get("--seconds", 1.0);
  const int trials = std::max(1, int(args.get("--trials", 5.0)));
  const bool huge = args.has("--huge");
  if (args.has("--no-vnni")) cpu::set_vnni_for_testing(false);
  const double wait_idle = args.get("--wait-idle", 60.0);
  const size_t rotate_bytes = size_t(args.get("--rotate-mib", 512.0) * (1 << 20));
  const int64_t prefill_n = int64_t(args.get("--n", 64.0));
  std::vector<int> thread_counts;
  for (const auto& t : split(args.get("--threads", std::string("1,2"))))
    thread_counts.push_back(std::stoi(t));
  std::vector<std::string> dtypes = split(args.get("--dtypes", std::string("bf16,f32")));
  const bool small_only = args.get("--shapes", std::string("all")) == "small";

  // Peak read bandwidth per thread count.
  double peak[3] = {0, args.get("--peak1", 0.0), args.get("--peak2", 0.0)};
  if (peak[1] <= 0 || peak[2] <= 0) {
    bench::Buffer probe(size_t(1) << 30, huge);
    for (int t : {1, 2}) {
      ThreadPool pool(t);
      bench::wait_for_idle(wait_idle);
      if (peak[t] <= 0) peak[t] = bench::read_bandwidth(pool, probe, 5);
    }
  }
  std::printf(
      "isa %s; peak read bandwidth (1 GiB sum, best of 5): 1 thread %.1f GB/s, "
      "2 threads %.1f GB/s\n",
      std::string(cpu::active_isa()).c_str(), peak[1], peak[2]);
  {
    // Fork-join overhead: back-to-back parallel_for calls with empty chunks.
    ThreadPool pool(2);
    const int reps = 20000;
    double best = 1e30;
    for (int trial = 0; trial < 5; ++trial) {
      const double t0 = bench::now_s();
      for (int i = 0; i < reps; ++i) pool.parallel_for(2, 1, [](int64_t, int64_t) {});
      best = std::min(best, (bench::now_s() - t0) / reps);
    }
    std::printf("ThreadPool(2) parallel_for round trip (empty chunks): %.2f us\n\n", best * 1e6);
  }
  std::printf(
      "| dtype | shape | rows x cols | MB | threads | n=1 us/call | n=1 GB/s | "
      "%% of peak | n=%lld GFLOP/s | bf16 inputs (%s) |\n",
      (long long)prefill_n, cpu::bf16_dot_products() ? "vdpbf16ps" : "rounded, f32 kernels");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");

  for (const std::string& dtype_arg : dtypes) {
    const bool packed = dtype_arg.size() > 7 && dtype_arg.substr(dtype_arg.size() - 7) == "-packed";
    const int bits = dtype_arg.rfind("q4", 0) == 0 ? 4 : dtype_arg.rfind("q8", 0) == 0 ? 8 : 0;
    const DType dtype = dtype_arg == "f32"   ? DType::F32
                        : dtype_arg == "f16" ? DType::F16
                                             : DType::BF16;
    for (const BenchShape& shape : kShapes) {
      if (small_only && shape.rows > 10000) continue;
      // The matrix as stored, data at `base` (affine: codes, scales, biases
      // back to back, as packed_affine_view lays them out too).
      auto layout = [&](uint8_t* base) {
        WeightMatrix w{dtype, base, shape.rows, shape.cols};
        if (bits == 0) return packed ? cpu::packed_bf16_view(w, base) : w;
        w.format = WeightFormat::Affine;
        w.bits = bits;
        w.group_size = 64;
        const size_t codes = size_t(shape.rows * shape.cols * bits / 8);
        const size_t scales = size_t(shape.rows * (shape.cols / 64)) * 2;
        w.scales = base ? base + codes : nullptr;
        w.biases = base ? base + codes + scales : nullptr;
        return packed ? cpu::packed_affine_view(w, base) : w;
      };
      const size_t bytes = layout(nullptr).nbytes();
      const size_t copies = std::max<size_t>(1, (rotate_bytes + bytes - 1) / bytes);
      std::vector<bench::Buffer> weights;
      std::vector<uint8_t> staging;
      for (size_t i = 0; i < copies; ++i) {
        weights.emplace_back(bytes, huge);
        auto* dst = reinterpret_cast<uint8_t*>(weights.back().data());
        if (bits > 0) {
          // Random codes, small bf16 scales and biases, in MLX's layout
          // (packed from a staging copy for "-packed").
          WeightMatrix affine = layout(nullptr);
          affine.format = WeightFormat::Affine;
          staging.resize(affine.nbytes());
          uint8_t* base = packed ? staging.data() : dst;
          uint32_t state = 2654435761u * uint32_t(i + 1);
          const size_t code_bytes = size_t(shape.rows * shape.cols * bits / 8);
          for (size_t k = 0; k < code_bytes; ++k) {
            state = state * 1664525u + 1013904223u;
            base[k] = uint8_t(state >> 24);
          }
          auto* sc = reinterpret_cast<uint16_t*>(base + code_bytes);
          for (size_t k = 0; k < (affine.nbytes() - code_bytes) / 2; ++k)
            sc[k] = f32_to_bf16(0.001f * float(k % 7) - 0.003f);
          affine.data = base;
          affine.scales = base + code_bytes;
          affine.biases = base + code_bytes + (affine.nbytes() - code_bytes) / 2;
          if (packed) {
            const WeightMatrix p = layout(dst);
            cpu::pack_affine_rows16(affine, p, 0, p.stored_rows() / 16);
          }
          continue;
        }
        if (!packed) {
          fill_weights(weights.back().data(), dtype, size_t(shape.rows * shape.cols), uint32_t(i));
          continue;
        }
        std::vector<uint16_t> dense(size_t(shape.rows * shape.cols));
        fill_weights(dense.data(), dtype, dense.size(), uint32_t(i));
        cpu::pack_bf16_rows16(WeightMatrix{dtype, dense.data(), shape.rows, shape.cols},
                              weights.back().data(), 0, (shape.rows + 15) / 16);
      }
      std::vector<float> x(size_t(prefill_n * shape.cols));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) * 0.01f - 0.08f;
      std::vector<float> y(size_t(prefill_n * shape.rows));
      auto view = [&](size_t i) { return layout(reinterpret_cast<uint8_t*>(weights[i].data())); };

      for (int t : thread_counts) {
        ThreadPool pool(t);
        // Decode: each trial cycles through all copies for >= seconds / trials;
        // the best trial counts (other processes on this 2-core machine only
        // ever slow a trial down).
        for (size_t i = 0; i < copies; ++i)
          cpu::matmul(pool, x.data(), 1, view(i), nullptr, y.data());
        const bool idle = bench::wait_for_idle(wait_idle);
        double best_call = 1e30;
        for (int trial = 0; trial < trials; ++trial) {
          int64_t calls = 0;
          const double t0 = bench::now_s();
          double elapsed = 0;
          do {
            for (size_t i = 0; i < copies; ++i, ++calls)
              cpu::matmul(pool, x.data(), 1, view(i), nullptr, y.data());
            elapsed = bench::now_s() - t0;
          } while (elapsed < seconds / trials);
          best_call = std::min(best_call, elapsed / double(calls));
        }
        const double gbs = double(bytes) / best_call / 1e9;

        // Prefill: one copy; best of `trials` calls (at least seconds in all).
        bool idle_prefill = true;
        auto prefill_gflops = [&](cpu::MatmulInputs inputs) {
          idle_prefill = bench::wait_for_idle(wait_idle) && idle_prefill;
          cpu::matmul(pool, x.data(), prefill_n, view(0), nullptr, y.data(), inputs);
          double best_prefill = 1e30, pelapsed = 0;
          for (int calls = 0; calls < trials || pelapsed < seconds; ++calls) {
            const WeightMatrix w = view(size_t(calls + 1) % copies);  // from memory, as in a model
            const double p0 = bench::now_s();
            cpu::matmul(pool, x.data(), prefill_n, w, nullptr, y.data(), inputs);
            const double dt = bench::now_s() - p0;
            pelapsed += dt;
            best_prefill = std::min(best_prefill, dt);
          }
          return 2.0 * double(prefill_n) * double(shape.rows * shape.cols) / best_prefill / 1e9;
        };
        const double gflops = prefill_gflops(cpu::MatmulInputs::F32);
        char bf16_inputs[32] = "-";
        if (dtype == DType::BF16 && bits == 0)
          std::snprintf(bf16_inputs, sizeof bf16_inputs, "%.1f",
                        prefill_gflops(cpu::MatmulInputs::Bf16));

        const double pk = t < 3 ? peak[t] : peak[2];
        std::printf("| %s | %s | %lld x %lld | %.1f | %d | %.1f | %.1f | %.0f%% | %.1f | %s |%s\n",
                    dtype_arg.c_str(), shape.name, (long long)shape.rows, (long long)shape.cols,
                    double(bytes) / 1e6, t, best_call * 1e6, gbs, 100.0 * gbs / pk, gflops,
                    bf16_inputs, idle && idle_prefill ? "" : " busy");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
