// GGUF (version 3) reading: header, metadata, tensor infos, mmapped data.
//
// Layout (all little-endian): "GGUF", u32 version, u64 tensor count, u64
// metadata count; each metadata entry is a string key, a u32 value type and
// the value (strings are u64 length + bytes; arrays a u32 element type, a u64
// count and the elements); each tensor info is a string name, u32 n_dims,
// n_dims u64 dimensions (innermost first, as ggml's ne[]), u32 ggml type and a
// u64 offset into the data section. The data section starts at the first
// multiple of `general.alignment` (default 32) after the infos; each offset is
// a multiple of it too.
//
// Contract: open() validates everything before any tensor is used and throws
// tandem::Error naming the file and what is wrong: bad magic, versions other
// than 3, truncated metadata or infos, unknown value or tensor types, counts
// and lengths that cannot fit in the file, rows that are not whole blocks,
// tensors past the end of the file or overlapping. Views stay valid while the
// GgufFile lives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace tandem {

// The ggml tensor types tandem reads (the values are the file's codes).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30,
};

const char* ggml_type_name(GgmlType t);
// Values per block (1 for float types) and bytes per block.
int64_t ggml_block_values(GgmlType t);
int64_t ggml_block_bytes(GgmlType t);

// One metadata value. Integers of every width are held as int64 / uint64
// (u64 values above INT64_MAX stay uint64); arrays hold their elements.
struct GgufValue {
  enum class Type : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
  };
  Type type = Type::U8;
  std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<GgufValue>> v;

  bool is_integer() const;  // any integer type
  bool is_number() const;   // integer or float
  bool is_string() const { return type == Type::String; }
  bool is_array() const { return type == Type::Array; }
  int64_t as_int() const;  // integer (or bool) value; Error for other types
  double as_number() const;
  const std::string& as_string() const;
  const std::vector<GgufValue>& as_array() const;
  Type element_type = Type::U8;  // arrays: the declared element type
};

const char* gguf_value_type_name(GgufValue::Type t);

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;  // innermost first (ggml ne[]): dims[0] is the row length
  uint64_t offset = 0;        // relative to the data section
  uint64_t bytes = 0;

  int64_t cols() const { return dims.empty() ? 1 : dims[0]; }
  int64_t rows() const;  // product of the outer dimensions
};

class GgufFile {
 public:
  static std::shared_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(const std::string& name) const;  // nullptr when absent
  // The tensor's bytes in the mapping.
  const uint8_t* data(const GgufTensor& t) const { return data_ + t.offset; }
  uint64_t file_size() const { return map_size_; }

  // Typed metadata: the value, or `fallback` when absent; Error naming the
  // file and key when it has another type.
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_number(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  int64_t require_int(const std::string& key) const;  // Error when absent

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// True when `path` names a .gguf file.
bool is_gguf_path(const std::string& path);
// The GGUF checkpoint `path` stands for: the file itself, or the one .gguf file
// of a folder that holds no model.safetensors / index (mmproj*.gguf files are
// not counted); "" when it is not a GGUF checkpoint. Error when a folder holds
// several candidate .gguf files.
std::string find_gguf_model(const std::string& path);

}  // namespace tandem
