// safetensors reading (mmap, validated) and writing.
//
// Format: 8-byte little-endian header length N, then N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//  "__metadata__": {"k": "v"}}, then the data section; offsets are relative to
// the data section's start.
//
// Contract: open() validates everything before any tensor is used and throws
// tandem::Error naming the file (and tensor) with the expected and the actual
// value: header length within the file, valid JSON object, known dtype names,
// non-negative shapes, end - begin == numel * dtype size, offsets inside the
// data section, no two tensors overlapping. A view stays valid while its
// SafetensorsFile (or Checkpoint) lives.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  TensorView view(const TensorInfo& info) const;

 private:
  friend class Checkpoint;
  SafetensorsFile() = default;
  std::string path_;
  // In-memory tensors (Checkpoint::from_memory): each tensor's data, in the
  // order of tensors_, kept alive by owner_; empty for a mapped file.
  std::vector<const void*> memory_;
  std::shared_ptr<const void> owner_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint folder's tensors: model.safetensors, or the shards listed in
// model.safetensors.index.json ("weight_map": name -> file), or else every
// *.safetensors file in the folder. A name present in two files is an error.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);

  // One tensor held elsewhere, for from_memory().
  struct MemoryTensor {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;
    const void* data = nullptr;  // numel(shape) * dtype_size(dtype) bytes
  };
  // A checkpoint over tensors that already live in memory (e.g. a GGUF
  // mmproj file's tensors under their transformers names:
  // model/gguf_mmproj.h). `owner` keeps their memory alive as long as any
  // copy of the checkpoint or any view's user holds it; `label` is what dir()
  // and file_of() name in errors. Error on a duplicate name.
  static Checkpoint from_memory(const std::string& label, std::vector<MemoryTensor> tensors,
                                std::shared_ptr<const void> owner);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // The tensor, or Error("missing tensor NAME in DIR").
  TensorView get(const std::string& name) const;
  // get() plus a shape check: Error "tensor NAME in FILE: expected shape [..],
  // found [..]".
  TensorView require(const std::string& name, const Shape& shape) const;
  // The file that holds a tensor (for error messages).
  const std::string& file_of(const std::string& name) const;
  // A tensor's size in bytes without viewing it.
  size_t tensor_bytes(const std::string& name) const;
  // Names passed to get()/require() so far, sorted: what the process has
  // touched (tests check that --text-only never touches a vision tensor).
  std::vector<std::string> viewed() const;

 private:
  struct ViewLog {
    std::mutex mu;
    std::set<std::string> names;
  };
  std::shared_ptr<ViewLog> viewed_ = std::make_shared<ViewLog>();
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> tensors_;
};

// One tensor to write: its bytes must be numel(shape) * dtype_size(dtype).
struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file (tensors sorted by name, 8-byte aligned data as
// the reference implementation does). Throws Error on I/O failure.
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem
