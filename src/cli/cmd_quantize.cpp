// tandem quantize: a checkpoint rewritten as MLX affine-quantized safetensors.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/quantize_checkpoint.h"

namespace tandem::cli {

namespace {

struct QuantizeOptions {
  std::string in;
  std::string out;
  int bits = 4;
  int group_size = 64;
};

int run_quantize(const QuantizeOptions& o) {
  const double t0 = now_seconds();
  const QuantizeStats st = quantize_checkpoint(o.in, o.out, o.bits, o.group_size);
  std::fprintf(stderr,
               "wrote %s: %lld matrices quantized to %d-bit (group %d), %lld tensors kept; "
               "%.2f GB -> %.2f GB in %.1f s\n",
               o.out.c_str(), (long long)st.quantized, o.bits, o.group_size, (long long)st.kept,
               double(st.bytes_in) / 1e9, double(st.bytes_out) / 1e9, now_seconds() - t0);
  return 0;
}

}  // namespace

Runner add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  auto* cmd = app.add_subcommand(
      "quantize", "Write an MLX affine-quantized copy of a checkpoint (loadable by mlx-lm too)");
  cmd->add_option("in_dir", o->in, "Checkpoint folder (bf16, f16, f32 or FP8)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("out_dir", o->out, "Folder to write the quantized checkpoint into")->required();
  cmd->add_option("--bits", o->bits, "4 or 8")->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "Values per scale and bias: 32, 64 or 128")
      ->capture_default_str();
  return [o] { return run_quantize(*o); };
}

}  // namespace tandem::cli
