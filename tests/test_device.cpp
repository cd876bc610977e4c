// --device: parsing, resolution on a machine without a usable GPU, the
// engine's and the CLI's view of it (docs/cli.md, issue #6).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "model/decoder.h"
#include "test_util.h"

#if TANDEM_HAVE_CUDA
#include "backend/cuda/runtime.h"
#endif

using namespace tandem;
using namespace tandem::test;

namespace {

// True when this process can run on a CUDA device; the no-GPU expectations
// below hold only where it cannot.
bool cuda_usable() {
#if TANDEM_HAVE_CUDA
  std::string why;
  return cuda::device_count(&why) > 0;
#else
  return false;
#endif
}

}  // namespace

TEST(Device, ParsesEveryAcceptedValue) {
  EXPECT_FALSE(parse_device("auto").has_value());
  const auto cpu = parse_device("cpu");
  ASSERT_TRUE(cpu.has_value());
  EXPECT_FALSE(cpu->cuda);
  EXPECT_EQ(cpu->name(), "cpu");
  const auto cuda = parse_device("cuda");
  ASSERT_TRUE(cuda.has_value());
  EXPECT_TRUE(cuda->cuda);
  EXPECT_EQ(cuda->index, 0);
  EXPECT_EQ(cuda->name(), "cuda:0");
  const auto cuda2 = parse_device("cuda:2");
  ASSERT_TRUE(cuda2.has_value());
  EXPECT_TRUE(cuda2->cuda);
  EXPECT_EQ(cuda2->index, 2);
  EXPECT_EQ(cuda2->name(), "cuda:2");
}

TEST(Device, BogusValuesNameTheFlagAndTheAcceptedValues) {
  for (const char* bad :
       {"gpu", "", "CPU", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda:99999", "cuda0", " cpu"}) {
    const std::string err = error_of([&] { parse_device(bad); });
    EXPECT_NE(err.find("--device"), std::string::npos) << bad << ": " << err;
    EXPECT_NE(err.find("auto, cpu, cuda or cuda:N"), std::string::npos) << bad << ": " << err;
    EXPECT_EQ(error_of([&] { resolve_device(bad); }), err) << bad;
  }
}

TEST(Device, KvCacheDtypeIsBf16OnCudaAndF32OnTheCpu) {
  const DeviceChoice cpu{}, gpu{.cuda = true, .index = 0};
  EXPECT_EQ(resolve_kv_dtype("auto", cpu), DType::F32);
  EXPECT_EQ(resolve_kv_dtype("auto", gpu), DType::BF16);
  EXPECT_EQ(resolve_kv_dtype("f32", gpu), DType::F32);
  EXPECT_EQ(resolve_kv_dtype("bf16", gpu), DType::BF16);
  EXPECT_EQ(resolve_kv_dtype("f32", cpu), DType::F32);
  const std::string on_cpu = error_of([&] { resolve_kv_dtype("bf16", cpu); });
  EXPECT_NE(on_cpu.find("--kv-cache-dtype bf16"), std::string::npos) << on_cpu;
  EXPECT_NE(on_cpu.find("use f32 or auto"), std::string::npos) << on_cpu;
  for (const char* bad : {"fp16", "BF16", "", "f16", "int8"}) {
    const std::string err = error_of([&] { resolve_kv_dtype(bad, gpu); });
    EXPECT_NE(err.find("--kv-cache-dtype"), std::string::npos) << bad << ": " << err;
    EXPECT_NE(err.find("auto, f32 or bf16"), std::string::npos) << bad << ": " << err;
  }
}

TEST(Device, GemmPrecisionIsBf16OrF32) {
  EXPECT_TRUE(resolve_gemm_precision("bf16"));
  EXPECT_FALSE(resolve_gemm_precision("f32"));
  for (const char* bad : {"fp32", "BF16", "", "f16", "auto", "tf32"}) {
    const std::string err = error_of([&] { resolve_gemm_precision(bad); });
    EXPECT_NE(err.find("--gemm-precision"), std::string::npos) << bad << ": " << err;
    EXPECT_NE(err.find("use bf16 or f32"), std::string::npos) << bad << ": " << err;
  }
}

TEST(Device, WithoutAUsableGpuAutoIsTheCpuAndCudaFailsClearly) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here";
  testing::internal::CaptureStderr();
  const DeviceChoice d = resolve_device("auto");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(d.cuda);
  EXPECT_NE(log.find("--device auto"), std::string::npos) << log;
  EXPECT_NE(log.find("running on the CPU"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_FALSE(resolve_device("cpu").cuda);
  for (const char* flag : {"cuda", "cuda:0", "cuda:3"}) {
    const std::string err = error_of([&] { resolve_device(flag); });
    EXPECT_NE(err.find(std::string("--device ") + flag), std::string::npos) << err;
    EXPECT_NE(err.find("use --device cpu"), std::string::npos) << err;
  }
}

TEST(Device, AnEngineOnTheCpuSaysSo) {
  auto model = load_model(fixture_dir("llama-f32"));
  EngineConfig c;
  c.threads = 1;
  c.max_concurrent = 2;
  Engine engine(*model, c);
  const EngineStatus st = engine.status();
  EXPECT_EQ(st.device, "cpu");
  EXPECT_FALSE(st.has_gpu_memory);
}

TEST(Device, AnEngineOnAnUnusableGpuFailsAtConstruction) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here";
  auto model = load_model(fixture_dir("llama-f32"));
  EngineConfig c;
  c.threads = 1;
  c.device = DeviceChoice{.cuda = true, .index = 0};
  EXPECT_NE(error_of([&] { Engine e(*model, c); }).find("--device cpu"), std::string::npos);
  c.gpu_memory_fraction = 0.5;
  EXPECT_NE(error_of([&] { Engine e(*model, c); }).find("--device cpu"), std::string::npos);
}

TEST(Device, CliRunsOnTheCpuAndRefusesBadDevices) {
  const std::string model = fixture_dir("llama-f32");
  auto cpu = run_tandem("run " + model + " --ids 1,2,3 -n 4 --ignore-eos --json --device cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  auto automatic = run_tandem("run " + model + " --ids 1,2,3 -n 4 --ignore-eos --json");
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  if (!cuda_usable()) {
    EXPECT_EQ(automatic.out, cpu.out);
  }
  auto bad = run_tandem("logits " + model + " --ids 1,2 --device gpu");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--device: 'gpu' is not a device"), std::string::npos) << bad.err;
  // --kv-cache-dtype: f32 is the CPU's own type; bf16 rows are CUDA's.
  auto f32 = run_tandem("run " + model + " --ids 1,2,3 -n 4 --ignore-eos --json --device cpu " +
                        "--kv-cache-dtype f32");
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  EXPECT_EQ(f32.out, cpu.out);
  for (const char* cmd : {"run --ids 1,2", "logits --ids 1,2", "bench --tokens 1"}) {
    const std::string c(cmd);
    const size_t space = c.find(' ');
    auto rows = run_tandem(c.substr(0, space) + " " + model + c.substr(space) +
                           " --device cpu --kv-cache-dtype bf16");
    EXPECT_EQ(rows.exit_code, 1) << cmd;
    EXPECT_NE(rows.err.find("--kv-cache-dtype bf16: the CPU keeps f32 KV rows"), std::string::npos)
        << cmd << ": " << rows.err;
  }
}

TEST(Device, ServeOnCudaWithoutAGpuExitsAtOnceSayingWhatToDo) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_tandem("serve " + fixture_dir("llama-f32") + " --port 0 --device cuda");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: --device cuda"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use --device cpu"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("listening"), std::string::npos) << r.err;  // before binding the port
  EXPECT_LT(seconds, 10.0);
  r = run_tandem("serve " + fixture_dir("llama-f32") + " --port 0 --gpu-memory-fraction 1.5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--gpu-memory-fraction"), std::string::npos) << r.err;
}
