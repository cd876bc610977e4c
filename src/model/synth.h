// Random-weight checkpoints at real model shapes, for benchmarks and tests
// that need a model without downloading one.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tandem {

// Reads CONFIG (a config.json of any supported architecture), writes
// OUT_DIR/config.json (the same text) and OUT_DIR/model.safetensors with every
// tensor the loader needs under Hugging Face names. Weights are uniform with
// std 1/sqrt(fan_in); norm weights are near their identity value. Returns the
// bytes of weights written. `dtype` is F32, F16 or BF16.
uint64_t synth_checkpoint(const std::string& config_path, const std::string& out_dir, DType dtype,
                          uint64_t seed);

}  // namespace tandem
