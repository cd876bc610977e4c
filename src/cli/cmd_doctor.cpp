// tandem doctor: what this machine offers tandem (CPU features, GPU, driver
// and CUDA versions against the build, memory, the model cache, free disk).
// Reports only; exits 0 unless the report itself cannot be written.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "backend/cpu/kernels.h"
#include "catalog/disk.h"
#include "catalog/hub_cache.h"
#include "catalog/hub_http.h"
#include "catalog/user_aliases.h"
#include "cli/commands.h"
#include "core/error.h"
#ifdef TANDEM_HAVE_CUDA
#include "backend/cuda/runtime.h"
#endif

namespace tandem::cli {

namespace {

using namespace tandem::catalog;

void row(const char* key, const std::string& value) {
  std::printf("  %-18s %s\n", key, value.c_str());
}

// The first "key : value" line of /proc/cpuinfo with that key.
std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "";
}

uint64_t meminfo_kb(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  uint64_t kb = 0;
  std::string unit;
  while (in >> name >> kb >> unit)
    if (name == key + ":") return kb;
  return 0;
}

// stdout of a shell command (bounded to 10 s), "" when it fails.
std::string command_output(const std::string& cmd) {
  FILE* p = popen(("timeout 10 " + cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return pclose(p) == 0 ? out : "";
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool on_path(const char* program) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

// "12.4" -> 12004; 0 when unparsable.
int version_number(const std::string& v) {
  int major = 0, minor = 0;
  return std::sscanf(v.c_str(), "%d.%d", &major, &minor) >= 1 ? major * 1000 + minor : 0;
}

void report_cpu() {
  std::printf("CPU\n");
  row("model", cpuinfo_field("model name"));
  row("threads", std::to_string(std::thread::hardware_concurrency()));
  const std::string flags = " " + cpuinfo_field("flags") + " ";
  std::string have, missing;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                        "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16"})
    (flags.find(std::string(" ") + f + " ") != std::string::npos ? have : missing) +=
        std::string(f) + " ";
  row("features", have.empty() ? "-" : trim(have));
  row("absent", missing.empty() ? "-" : trim(missing));
  row("kernels", std::string(cpu::active_isa()) + " (TANDEM_ISA=avx2|scalar overrides)");
}

void report_memory() {
  std::printf("Memory\n");
  row("total", format_bytes(meminfo_kb("MemTotal") * 1024));
  row("available", format_bytes(meminfo_kb("MemAvailable") * 1024));
}

void report_gpu() {
  std::printf("GPU\n");
  std::string driver, cuda_supported;
  if (!on_path("nvidia-smi")) {
    row("nvidia-smi", "not found: no NVIDIA driver installed (CPU only)");
  } else {
    const std::string gpus = command_output(
        "nvidia-smi --query-gpu=index,name,driver_version,memory.total "
        "--format=csv,noheader");
    if (gpus.empty()) row("nvidia-smi", "found, but it failed: the driver is not working");
    std::stringstream ss(gpus);
    std::string line;
    while (std::getline(ss, line)) {
      if (trim(line).empty()) continue;
      row("device", trim(line));
      std::stringstream fields(line);
      std::string f;
      for (int i = 0; std::getline(fields, f, ','); ++i)
        if (i == 2) driver = trim(f);
    }
    const std::string banner = command_output("nvidia-smi");
    if (const size_t p = banner.find("CUDA Version:"); p != std::string::npos) {
      std::stringstream v(banner.substr(p + 13));
      v >> cuda_supported;
    }
    if (!driver.empty()) row("driver", driver);
    if (!cuda_supported.empty())
      row("driver's CUDA", cuda_supported + " (the newest runtime it runs)");
  }
#ifdef TANDEM_HAVE_CUDA
  const std::string runtime = cuda::runtime_version();
  row("build", "CUDA backend, runtime " + runtime);
  std::string why;
  const int n = cuda::device_count(&why);
  row("usable devices", n > 0 ? std::to_string(n) : "0: " + why);
  const std::string drv = cuda_supported.empty() ? cuda::driver_version() : cuda_supported;
  if (!drv.empty() && version_number(drv) > 0) {
    const bool ok = version_number(drv) >= version_number(runtime);
    row("versions", ok ? "match: the driver runs CUDA " + drv + " >= runtime " + runtime
                       : "MISMATCH: the driver runs CUDA up to " + drv + ", this build needs " +
                             runtime + "; update the NVIDIA driver");
  }
#else
  (void)version_number;
  row("build", "CPU only: built without the CUDA backend, so no CUDA runtime is linked");
#endif
}

void report_cache() {
  std::printf("Models\n");
  const std::string cache = hub_cache_dir();
  std::error_code ec;
  int repos = 0;
  if (std::filesystem::is_directory(cache, ec))
    for (const auto& e : std::filesystem::directory_iterator(cache, ec))
      if (e.path().filename().string().rfind("models--", 0) == 0) ++repos;
  row("cache", cache + (std::filesystem::exists(cache, ec) ? "" : " (not created yet)"));
  row("cached repos", std::to_string(repos) + (repos ? " (tandem models --cached)" : ""));
  row("free disk", format_bytes(free_disk_bytes(cache)));
  row("user aliases", user_aliases_path());
  const HubEnv env = HubEnv::from_environment();
  row("hub", env.endpoint + (env.offline ? " (HF_HUB_OFFLINE: no network)" : ""));
  row("token", env.token.empty() ? "none (gated models need HF_TOKEN)" : "set");
}

int run_doctor() {
  std::printf("tandem 0.1.0\n");
  report_cpu();
  report_memory();
  report_gpu();
  report_cache();
  return 0;
}

}  // namespace

Runner add_doctor_command(CLI::App& app) {
  app.add_subcommand("doctor", "Check this machine: CPU, GPU and driver, memory, cache, disk");
  return [] { return run_doctor(); };
}

}  // namespace tandem::cli
