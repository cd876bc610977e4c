// tandem synth: a random-weight checkpoint at a real model's shapes.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "model/synth.h"

namespace tandem::cli {

namespace {

struct SynthOptions {
  std::string config;
  std::string out;
  std::string dtype = "bf16";
  uint64_t seed = 0;
};

int run_synth(const SynthOptions& o) {
  DType dtype;
  if (o.dtype == "bf16")
    dtype = DType::BF16;
  else if (o.dtype == "f16")
    dtype = DType::F16;
  else if (o.dtype == "f32")
    dtype = DType::F32;
  else
    fail("--dtype: \"%s\" is not one of bf16, f16, f32", o.dtype.c_str());
  const double t0 = now_seconds();
  uint64_t bytes = synth_checkpoint(o.config, o.out, dtype, o.seed);
  std::fprintf(stderr, "wrote %s: %.2f GB of %s weights in %.1f s\n", o.out.c_str(),
               double(bytes) / 1e9, o.dtype.c_str(), now_seconds() - t0);
  return 0;
}

}  // namespace

Runner add_synth_command(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  auto* cmd = app.add_subcommand("synth", "Write a random-weight checkpoint for a config.json");
  cmd->add_option("config", o->config, "config.json of a supported architecture")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("out_dir", o->out, "Folder to write config.json and model.safetensors into")
      ->required();
  cmd->add_option("--dtype", o->dtype, "Weight dtype: bf16, f16 or f32")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  return [o] { return run_synth(*o); };
}

}  // namespace tandem::cli
