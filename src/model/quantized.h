// Weight matrices in every stored form, as the loader and `tandem quantize`
// read them: dense F32/F16/BF16 (zero-copy), MLX affine-quantized (zero-copy:
// weight/scales/biases of the checkpoint), FP8 e4m3 with a weight_scale_inv
// (dequantized to bf16 at load), and on-load quantization of any of them.
//
// MLX checkpoints (mlx-lm, mlx-vlm): a module is quantized iff
// "<module>.scales" exists; "<module>.weight" is then U32 [rows, cols·bits/32]
// and "<module>.scales" / "<module>.biases" are [rows, cols/group_size].
// config.json's "quantization" (or "quantization_config") holds "group_size",
// "bits", "mode" and per-module overrides ("<module>": {"group_size", "bits"}
// or false). bits and group size are read from the tensor shapes and must
// agree with the config where it names them.
//
// FP8 checkpoints ("quantization_config": {"quant_method": "fp8",
// "weight_block_size": [128, 128] or null}, e.g. Ministral 3 2512): weight
// F8_E4M3 [rows, cols], "<module>.weight_scale_inv" F32/BF16 either one value
// (per tensor) or [ceil(rows/b0), ceil(cols/b1)] (per block);
// W = fp8 · scale_inv.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/owned_buffer.h"
#include "core/tensor.h"
#include "model/safetensors.h"

namespace tandem {

struct QuantConfig {
  // MLX affine ("quantization" / "quantization_config" with bits and group_size).
  bool mlx = false;
  int bits = 0;
  int group_size = 0;
  struct Module {
    bool quantized = true;  // false: the override is `false`
    int bits = 0;
    int group_size = 0;
  };
  std::map<std::string, Module> modules;  // per-module overrides, by module path
  // FP8 ("quant_method": "fp8").
  bool fp8 = false;
  int64_t fp8_block[2] = {0, 0};  // weight_block_size; 0 = not given
};

// The quantization settings of a config.json (top level, as MLX and
// transformers write them). Throws Error naming `source` on malformed values
// and on quantization methods tandem does not read (GPTQ, AWQ, ...).
QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& source);
QuantConfig read_quant_config(const std::string& dir);

// Reads matrices of one checkpoint, converting as asked.
class MatrixLoader {
 public:
  // quantize_bits 0 keeps weights as stored; 4 or 8 quantizes every other
  // matrix whose row length group_size divides. New buffers go to `owned`,
  // their size is added to `owned_bytes`.
  MatrixLoader(const Checkpoint& ckpt, QuantConfig config, int quantize_bits, int group_size,
               OwnedBuffers& owned, uint64_t& owned_bytes);

  // pack: dense BF16 matrices loaded with `packable` are packed for the CPU
  // (LoadOptions::pack_for_cpu) into new buffers.
  void set_pack_for_cpu(bool pack) { pack_ = pack; }
  // Called after each load() with the matrix's bytes in the checkpoint.
  void set_progress(std::function<void(uint64_t)> fn) { progress_ = std::move(fn); }

  // The matrix stored as `name` (".weight" ending; for an MLX-quantized module
  // the codes, with ".scales"/".biases" beside), of logical shape [rows, cols].
  // packable: only ever a matmul's weight (not an embedding table).
  WeightMatrix load(const std::string& name, int64_t rows, int64_t cols, bool packable = false);

  const QuantConfig& config() const { return config_; }

 private:
  WeightMatrix affine(const std::string& name, const std::string& module, int64_t rows,
                      int64_t cols);
  WeightMatrix fp8(const std::string& name, const std::string& module, int64_t rows, int64_t cols);
  WeightMatrix convert(const std::string& name, int64_t rows, int64_t cols, bool packable);
  uint8_t* allocate(size_t bytes);

  const Checkpoint& ckpt_;
  QuantConfig config_;
  int quantize_bits_;
  int group_size_;
  bool pack_ = false;
  std::function<void(uint64_t)> progress_;
  OwnedBuffers& owned_;
  uint64_t& owned_bytes_;
};

// The MLX-quantized matrix "<module>.weight" (+ .scales, .biases) of logical
// shape [rows, cols], viewed in place; bits and group size from the shapes.
// Error naming the tensor when a shape, dtype or the format is off.
WeightMatrix view_affine(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                         int64_t cols);

// A conv weight [out, in, k, k] (PyTorch OIHW) as a [out, in·k·k] matrix in
// (c, ky, kx) order: viewed in place, or, stored OHWI [out, k, k, in] as MLX
// writes it, permuted into `owned`. Error naming the tensor for any other shape.
WeightMatrix read_conv_weight(const Checkpoint& ckpt, const std::string& name, int64_t out,
                              int64_t in, int64_t k, std::vector<uint8_t>& owned);

// Quantizes `src` (any format) to MLX affine `bits` with `group_size` into new
// buffers appended to `owned`; scales and biases in `scale_dtype` (F32, F16 or
// BF16). Rows are split over the hardware threads. release_source: `src`
// views a mapped file whose pages are handed back as rows are done.
WeightMatrix quantize_matrix(const WeightMatrix& src, int bits, int group_size, DType scale_dtype,
                             OwnedBuffers& owned, uint64_t* owned_bytes = nullptr,
                             bool release_source = false);

// Packs a dense BF16 matrix (cols even) for the CPU's outer-product kernels
// (WeightFormat::PackedBf16) into a new buffer appended to `owned`; the
// blocks of 16 rows are split over the hardware threads.
WeightMatrix pack_matrix(const WeightMatrix& dense, OwnedBuffers& owned, uint64_t& owned_bytes);

// For a model on the CPU: a dense head that views a mapped file is copied
// into a buffer appended to `owned` (on huge pages, owned_buffer.h) and its
// mapped pages handed back; `embed` follows when it is the same matrix (tied).
// Every step reads the whole head, and from the file's 4 KiB pages it
// streamed slower: llama-3.2-1B bf16 decode 17.1 -> 19.6 tok/s on the 2-core
// EPYC. Other heads are left as they are.
void keep_head_resident(WeightMatrix& head, WeightMatrix& embed, OwnedBuffers& owned,
                        uint64_t& owned_bytes);

// Regroups an Affine matrix for the CPU's int8 outer-product kernels
// (WeightFormat::PackedAffine) into one new buffer appended to `owned`.
WeightMatrix pack_affine_matrix(const WeightMatrix& affine, OwnedBuffers& owned,
                                uint64_t& owned_bytes);

// `w` in the CPU's packed layout where it has one and this processor runs
// its kernels (dense BF16 with even cols: PackedBf16; Affine where
// cpu::packed_affine_preferred(bits): PackedAffine), its source handed back
// (drop_source); else `w` itself.
WeightMatrix pack_for_cpu(const WeightMatrix& w, OwnedBuffers& owned, uint64_t& owned_bytes);

// Hands back the storage of a matrix that was converted into another: its
// buffer in `owned` (an FP8 weight's bf16 copy, a GGUF permuted or
// dequantized one) is freed, else it views a mapped file whose pages are
// released (release_pages).
void drop_source(const WeightMatrix& src, OwnedBuffers& owned, uint64_t& owned_bytes);

// Dequantizes an FP8 e4m3 tensor with its scale_inv (one value, or one per
// block of block[0] x block[1]) into bf16 at `dst` (rows·cols values).
// Throws Error naming `name` when the scale's shape fits neither.
void dequantize_fp8(const TensorView& weight, const TensorView& scale_inv, const int64_t block[2],
                    const std::string& name, uint16_t* dst);

// The module path of a tensor name: "a.b.weight" -> "a.b".
std::string module_of(const std::string& tensor_name);

// Hands the pages of a mapped range back to the kernel (madvise DONTNEED):
// used after a mmapped weight was converted, so it stops counting as resident.
void release_pages(const void* data, size_t bytes);

}  // namespace tandem
