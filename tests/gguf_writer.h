// Test helpers: a small GGUF v3 writer, reference block encoders (any valid
// encoding: the tests compare against the dequantized values), and the
// writing of a loaded tandem Model as a GGUF checkpoint with llama.cpp's
// names and conventions (llama / mistral3 Q/K permutation, Gemma 3 1+w norms,
// Llama 3 rope_freqs, Gemma 4's per-kind metadata and proportional rope_freqs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/model.h"

namespace tandem::test {

class GgufWriter {
 public:
  void u32(const std::string& key, uint32_t v);
  void i32(const std::string& key, int32_t v);
  void f32(const std::string& key, float v);
  void boolean(const std::string& key, bool v);
  void str(const std::string& key, const std::string& v);
  void str_array(const std::string& key, const std::vector<std::string>& v);
  void i32_array(const std::string& key, const std::vector<int32_t>& v);
  void bool_array(const std::string& key, const std::vector<bool>& v);
  void f32_array(const std::string& key, const std::vector<float>& v);
  // A raw entry: key, value type code, encoded value bytes.
  void raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value);

  // dims innermost first; data must be the type's size for dims.
  void tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
              std::vector<uint8_t> data);
  // Raw type code (for unknown types in malformed-file tests).
  void tensor_code(const std::string& name, uint32_t type, std::vector<int64_t> dims,
                   std::vector<uint8_t> data);

  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;

  uint32_t version = 3;
  uint64_t alignment = 32;
  std::string skip_key;  // a metadata key left out (malformed-model tests)

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> kv_;  // key, type + value
  std::vector<Tensor> tensors_;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

// `rows` rows of `cols` values encoded as type t (cols a multiple of the block).
std::vector<uint8_t> encode_rows(GgmlType t, const float* x, int64_t rows, int64_t cols);

// The row-major values a matrix holds, as f32 (any format).
std::vector<float> matrix_values(const WeightMatrix& w);

// Writes `m` (loaded from a safetensors fixture) as a GGUF file of llama.cpp's
// layout: every matrix whose row length the block divides as `type` (F32 or
// BF16 keep the values exactly; block types quantize), the others and all
// vectors F32. `head_type` overrides the type of `output.weight` (untied).
// The tensor or metadata key named `skip` is left out (malformed-model tests). `tokens`,
// when given, is written as tokenizer.ggml.tokens (the vocabulary's strings).
void write_model_gguf(const Model& m, const std::string& path, GgmlType type, GgmlType head_type,
                      const std::string& skip = "", const std::vector<std::string>& tokens = {});

// Writes the vision tower of the Gemma 3 or Mistral 3 checkpoint `dir`
// (config.json's vision_config, mm_tokens_per_image / spatial_merge_size,
// text hidden size) as a llama.cpp mmproj GGUF, with llama.cpp's converter's
// names and conventions (clip.* metadata, v.* / mm.* tensors; Gemma 3's
// soft_emb_norm stored as 1 + w, Pixtral's q/k rows permuted per head):
// matrices whose row length the block divides as `type`, the rest F32
// (F16/BF16 `type`: every matrix and the patch embedding in it). `skip`
// leaves a GGUF tensor out; `projector` overrides clip.projector_type.
void write_mmproj_gguf(const std::string& dir, const std::string& path, GgmlType type,
                       const std::string& skip = "", const std::string& projector = "");

// llama.cpp's per-head Q/K row permutation (rotate-half -> interleaved RoPE)
// of a [rows, cols] matrix.
std::vector<float> permute_head_rows(const std::vector<float>& v, int64_t rows, int64_t cols,
                                     int64_t head_dim);

}  // namespace tandem::test
