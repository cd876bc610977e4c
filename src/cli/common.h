// Helpers shared by the CLI commands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "model/step_runner.h"

namespace tandem::cli {

// "1,2, 3" -> {1, 2, 3}; throws Error naming the flag on anything else.
std::vector<int32_t> parse_id_list(const std::string& text, const char* flag);

// Loads a model folder, touching every weight page once (so the first token
// is not slowed by page faults) with a progress line on stderr. `options`
// converts weights at load (--quantize).
std::unique_ptr<Model> load_model_verbose(const std::string& dir, const LoadOptions& options = {});

// Registers --quantize q4|q8 on a command that loads a model.
void add_quantize_option(CLI::App* cmd, std::string& value);
// Registers --device auto|cpu|cuda[:N] (default auto; resolve_device reads it).
void add_device_option(CLI::App* cmd, std::string& value);
// Registers --kv-cache-dtype auto|f32|bf16 (default auto; resolve_kv_dtype
// reads it).
void add_kv_cache_dtype_option(CLI::App* cmd, std::string& value);
// Registers --gemm-precision bf16|f32 (default bf16; resolve_gemm_precision).
void add_gemm_precision_option(CLI::App* cmd, std::string& value);
// Registers --mmproj FILE (a llama.cpp mmproj GGUF: the vision tower images
// use, Model::mmproj) on a command that loads a model.
void add_mmproj_option(CLI::App* cmd, std::string& value);
// Error naming the flag when a given --mmproj is not a file; the file itself
// is read when the tower loads (VisionTower::load).
void check_mmproj(const std::string& value);
// The LoadOptions of a --quantize value ("" = none; Error on anything else)
// for a model that runs on `device`: on the CPU, dense BF16 layer matrices
// are packed for the outer-product kernels where cpu::packed_weights_preferred()
// and TANDEM_CPU_REPACK is not 0 (docs/cli.md).
LoadOptions load_options(const std::string& quantize, const DeviceChoice& device);

// One sequence of up to `capacity` positions on `device`: its KV pool (block
// ids only on a GPU, rows of resolve_kv_dtype(kv_cache_dtype)) and the
// StepRunner over it (steps of Decoder::kDefaultStepTokens; GEMM inputs as
// resolve_gemm_precision(gemm_precision)), for run_sequence.
struct SequenceRunner {
  std::unique_ptr<KvPool> kv_pool;
  std::unique_ptr<StepRunner> runner;  // declared last: destroyed before its pool
};
SequenceRunner make_sequence_runner(const DeviceChoice& device, const Model& model,
                                    ThreadPool& pool, int64_t capacity,
                                    const std::string& kv_cache_dtype = "auto",
                                    const std::string& gemm_precision = "bf16");

// Bytes of the weights the model reads (mapped and converted), and a short
// description of their storage ("BF16", "affine 4-bit, group 64", "mixed").
uint64_t model_weight_bytes(const Model& model);
std::string weight_format_name(const Model& model);

// Peak resident memory of this process in bytes (VmHWM), 0 if unknown.
uint64_t peak_rss_bytes();

// Seconds on a monotonic clock.
double now_seconds();

}  // namespace tandem::cli
