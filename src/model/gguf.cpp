// GGUF v3 parsing over a read-only mapping; every read is bounds-checked
// before it happens, so a truncated or hostile file fails with a message
// instead of reading past the mapping.
#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tandem {

namespace fs = std::filesystem;

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::Q4_K: return "Q4_K";
    case GgmlType::Q6_K: return "Q6_K";
    case GgmlType::BF16: return "BF16";
  }
  return "?";
}

int64_t ggml_block_values(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q8_0: return 32;
    case GgmlType::Q4_K:
    case GgmlType::Q6_K: return 256;
    default: return 1;
  }
}

int64_t ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16:
    case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: return 18;
    case GgmlType::Q8_0: return 34;
    case GgmlType::Q4_K: return 144;
    case GgmlType::Q6_K: return 210;
  }
  return 0;
}

namespace {

// Names of ggml types tandem does not read, for the error message.
std::string other_ggml_type_name(uint32_t code) {
  static const char* const kNames[] = {
      "F32",      "F16",      "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
      "Q8_0",     "Q8_1",     "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS",  "IQ2_XS",   "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",       "I16",      "I32",     "I64",   "F64",    "IQ1_M", "BF16",  "Q4_0_4_4",
      "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",   "TQ2_0"};
  if (code < sizeof(kNames) / sizeof(kNames[0]))
    return std::string(kNames[code]) + " (" + std::to_string(code) + ")";
  return "code " + std::to_string(code);
}

bool known_ggml_type(uint32_t code) {
  switch (code) {
    case 0:
    case 1:
    case 2:
    case 8:
    case 12:
    case 14:
    case 30: return true;
    default: return false;
  }
}

// Bounds-checked little-endian reads over [p, end).
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* begin, const uint8_t* end)
      : path_(path), begin_(begin), p_(begin), end_(end) {}

  uint64_t pos() const { return uint64_t(p_ - begin_); }
  uint64_t left() const { return uint64_t(end_ - p_); }

  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail("%s: truncated GGUF file: %s needs %llu bytes at offset %llu, only %llu left",
           path_.c_str(), what, (unsigned long long)n, (unsigned long long)pos(),
           (unsigned long long)left());
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_), size_t(n));
    p_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
};

// The smallest encoding of one value of type t (for array count checks).
uint64_t min_value_bytes(GgufValue::Type t) {
  switch (t) {
    case GgufValue::Type::U8:
    case GgufValue::Type::I8:
    case GgufValue::Type::Bool: return 1;
    case GgufValue::Type::U16:
    case GgufValue::Type::I16: return 2;
    case GgufValue::Type::U32:
    case GgufValue::Type::I32:
    case GgufValue::Type::F32: return 4;
    case GgufValue::Type::String:
    case GgufValue::Type::U64:
    case GgufValue::Type::I64:
    case GgufValue::Type::F64: return 8;
    case GgufValue::Type::Array: return 12;
  }
  return 1;
}

GgufValue read_value(Cursor& c, uint32_t type_code, const std::string& key, const std::string& path,
                     int depth) {
  if (type_code > uint32_t(GgufValue::Type::F64))
    fail("%s: metadata \"%s\": unknown value type %u", path.c_str(), key.c_str(), type_code);
  GgufValue v;
  v.type = GgufValue::Type(type_code);
  const char* what = "a metadata value";
  switch (v.type) {
    case GgufValue::Type::U8: v.v = int64_t(c.read<uint8_t>(what)); break;
    case GgufValue::Type::I8: v.v = int64_t(c.read<int8_t>(what)); break;
    case GgufValue::Type::U16: v.v = int64_t(c.read<uint16_t>(what)); break;
    case GgufValue::Type::I16: v.v = int64_t(c.read<int16_t>(what)); break;
    case GgufValue::Type::U32: v.v = int64_t(c.read<uint32_t>(what)); break;
    case GgufValue::Type::I32: v.v = int64_t(c.read<int32_t>(what)); break;
    case GgufValue::Type::F32: v.v = double(c.read<float>(what)); break;
    case GgufValue::Type::Bool: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1)
        fail("%s: metadata \"%s\": bool value %u is neither 0 nor 1", path.c_str(), key.c_str(),
             unsigned(b));
      v.v = b == 1;
      break;
    }
    case GgufValue::Type::String: v.v = c.string("a metadata string"); break;
    case GgufValue::Type::U64: {
      const uint64_t x = c.read<uint64_t>(what);
      if (x <= uint64_t(INT64_MAX))
        v.v = int64_t(x);
      else
        v.v = x;
      break;
    }
    case GgufValue::Type::I64: v.v = c.read<int64_t>(what); break;
    case GgufValue::Type::F64: v.v = c.read<double>(what); break;
    case GgufValue::Type::Array: {
      if (depth > 2)
        fail("%s: metadata \"%s\": arrays nested deeper than 2 levels", path.c_str(), key.c_str());
      const uint32_t et = c.read<uint32_t>("an array element type");
      if (et > uint32_t(GgufValue::Type::F64))
        fail("%s: metadata \"%s\": unknown array element type %u", path.c_str(), key.c_str(), et);
      const uint64_t n = c.read<uint64_t>("an array length");
      const uint64_t min = min_value_bytes(GgufValue::Type(et));
      if (n > c.left() / min)
        fail("%s: metadata \"%s\": array of %llu %s values cannot fit in the %llu bytes left",
             path.c_str(), key.c_str(), (unsigned long long)n,
             gguf_value_type_name(GgufValue::Type(et)), (unsigned long long)c.left());
      std::vector<GgufValue> items;
      items.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) items.push_back(read_value(c, et, key, path, depth + 1));
      v.element_type = GgufValue::Type(et);
      v.v = std::move(items);
      break;
    }
  }
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

const char* gguf_value_type_name(GgufValue::Type t) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) <= 12 ? kNames[uint32_t(t)] : "?";
}

bool GgufValue::is_integer() const {
  return std::holds_alternative<int64_t>(v) || std::holds_alternative<uint64_t>(v);
}
bool GgufValue::is_number() const {
  return is_integer() || std::holds_alternative<double>(v);
}

int64_t GgufValue::as_int() const {
  if (auto* x = std::get_if<int64_t>(&v)) return *x;
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  throw Error(std::string("GGUF value of type ") + gguf_value_type_name(type) +
              " is not an integer that fits int64");
}
double GgufValue::as_number() const {
  if (auto* x = std::get_if<double>(&v)) return *x;
  if (auto* u = std::get_if<uint64_t>(&v)) return double(*u);
  return double(as_int());
}
const std::string& GgufValue::as_string() const {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  throw Error(std::string("GGUF value of type ") + gguf_value_type_name(type) + " is not a string");
}
const std::vector<GgufValue>& GgufValue::as_array() const {
  if (auto* a = std::get_if<std::vector<GgufValue>>(&v)) return *a;
  throw Error(std::string("GGUF value of type ") + gguf_value_type_name(type) + " is not an array");
}

int64_t GgufTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
  return r;
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open %s: %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot stat %s: %s", path.c_str(), std::strerror(e));
  }
  const size_t size = size_t(st.st_size);
  if (size < 24) {
    ::close(fd);
    fail("%s: not a GGUF file: %zu bytes, shorter than the 24-byte header", path.c_str(), size);
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail("cannot mmap %s: %s", path.c_str(), std::strerror(map_err));
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = static_cast<const uint8_t*>(m);
  f->map_size_ = size;

  Cursor c(path, f->map_, f->map_ + size);
  const uint32_t magic = c.read<uint32_t>("the magic");
  if (std::memcmp(f->map_, "GGUF", 4) != 0)
    fail("%s: not a GGUF file: magic is %02x %02x %02x %02x, expected \"GGUF\"", path.c_str(),
         f->map_[0], f->map_[1], f->map_[2], f->map_[3]);
  (void)magic;
  f->version_ = c.read<uint32_t>("the version");
  if (f->version_ != 3)
    fail("%s: GGUF version %u is not supported (only version 3)", path.c_str(), f->version_);
  const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
  const uint64_t n_kv = c.read<uint64_t>("the metadata count");
  // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes;
  // each tensor info at least 8 + 4 + 4 + 8.
  if (n_kv > c.left() / 13)
    fail("%s: metadata count %llu cannot fit in a %zu-byte file", path.c_str(),
         (unsigned long long)n_kv, size);
  if (n_tensors > c.left() / 24)
    fail("%s: tensor count %llu cannot fit in a %zu-byte file", path.c_str(),
         (unsigned long long)n_tensors, size);

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("a metadata key");
    const uint32_t type = c.read<uint32_t>("a metadata value type");
    GgufValue v = read_value(c, type, key, path, 0);
    if (!f->kv_.emplace(key, std::move(v)).second)
      fail("%s: metadata key \"%s\" appears twice", path.c_str(), key.c_str());
  }
  if (const GgufValue* a = f->find("general.alignment")) {
    if (!a->is_integer() || a->as_number() <= 0 || a->as_number() > 65536 ||
        (a->as_int() & (a->as_int() - 1)) != 0)
      fail("%s: general.alignment must be a power of two up to 65536", path.c_str());
    f->alignment_ = uint64_t(a->as_int());
  }

  f->tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("a tensor name");
    const uint32_t n_dims = c.read<uint32_t>("a tensor's dimension count");
    if (n_dims == 0 || n_dims > 4)
      fail("%s: tensor \"%s\": %u dimensions (expected 1 to 4)", path.c_str(), t.name.c_str(),
           n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.read<uint64_t>("a tensor dimension");
      if (n > uint64_t(INT64_MAX) || mul_overflows(numel, n, &numel) || numel > (uint64_t(1) << 50))
        fail("%s: tensor \"%s\": absurd dimensions", path.c_str(), t.name.c_str());
      t.dims.push_back(int64_t(n));
    }
    const uint32_t type = c.read<uint32_t>("a tensor type");
    if (!known_ggml_type(type))
      fail(
          "%s: tensor \"%s\": tensor type %s is not supported (F32, F16, BF16, Q8_0, Q4_0, "
          "Q4_K, Q6_K)",
          path.c_str(), t.name.c_str(), other_ggml_type_name(type).c_str());
    t.type = GgmlType(type);
    t.offset = c.read<uint64_t>("a tensor offset");
    const int64_t bv = ggml_block_values(t.type);
    if (t.dims[0] % bv != 0)
      fail("%s: tensor \"%s\": row length %lld is not a multiple of the %s block size %lld",
           path.c_str(), t.name.c_str(), (long long)t.dims[0], ggml_type_name(t.type),
           (long long)bv);
    t.bytes = numel / uint64_t(bv) * uint64_t(ggml_block_bytes(t.type));
    if (t.offset % f->alignment_ != 0)
      fail("%s: tensor \"%s\": offset %llu is not a multiple of the alignment %llu", path.c_str(),
           t.name.c_str(), (unsigned long long)t.offset, (unsigned long long)f->alignment_);
    if (!f->index_.emplace(t.name, f->tensors_.size()).second)
      fail("%s: tensor \"%s\" appears twice", path.c_str(), t.name.c_str());
    f->tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (c.pos() + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  const uint64_t data_size = data_start <= size ? size - data_start : 0;
  f->data_ = f->map_ + std::min<uint64_t>(data_start, size);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const GgufTensor& t : f->tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      fail(
          "%s: tensor \"%s\" (%s, %llu bytes at data offset %llu) runs past the end of the "
          "file (data section of %llu bytes): the file is truncated",
          path.c_str(), t.name.c_str(), ggml_type_name(t.type), (unsigned long long)t.bytes,
          (unsigned long long)t.offset, (unsigned long long)data_size);
    ranges.push_back({t.offset, t.offset + t.bytes});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      fail("%s: two tensors overlap at data offset %llu", path.c_str(),
           (unsigned long long)ranges[i].first);
  return f;
}

GgufFile::~GgufFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!std::holds_alternative<int64_t>(v->v))
    fail("%s: metadata \"%s\" must be an integer, found %s", path_.c_str(), key.c_str(),
         gguf_value_type_name(v->type));
  return v->as_int();
}

int64_t GgufFile::require_int(const std::string& key) const {
  if (!find(key)) fail("%s: missing metadata \"%s\"", path_.c_str(), key.c_str());
  return get_int(key, 0);
}

double GgufFile::get_number(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_number())
    fail("%s: metadata \"%s\" must be a number, found %s", path_.c_str(), key.c_str(),
         gguf_value_type_name(v->type));
  return v->as_number();
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_string())
    fail("%s: metadata \"%s\" must be a string, found %s", path_.c_str(), key.c_str(),
         gguf_value_type_name(v->type));
  return v->as_string();
}

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && fs::path(path).extension() == ".gguf";
}

std::string find_gguf_model(const std::string& path) {
  std::error_code ec;
  if (is_gguf_path(path)) return path;
  if (!fs::is_directory(path, ec)) return "";
  const fs::path dir(path);
  if (fs::exists(dir / "model.safetensors", ec) ||
      fs::exists(dir / "model.safetensors.index.json", ec))
    return "";
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".gguf" || name.rfind("mmproj", 0) == 0) continue;
    found.push_back(e.path().string());
  }
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    fail("%s holds %zu GGUF files (%s, %s, ...): give the path of the one to load", path.c_str(),
         found.size(), found[0].c_str(), found[1].c_str());
  }
  return found.empty() ? "" : found[0];
}

}  // namespace tandem
