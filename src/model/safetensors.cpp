// safetensors reading (mmap, validated up front) and writing (atomic rename).
//
// Every check in open() runs before a single view is handed out, so code that
// holds a SafetensorsFile may trust that each TensorInfo's byte range lies
// inside the mapping and holds exactly numel * dtype_size bytes.
//
// Alignment: the data section starts at 8 + N, and N is whatever the writer
// chose; files from other writers need not pad it, so a F32 view may sit at an
// address that is not a multiple of 4. Views are raw byte pointers and every
// kernel that reads them must use unaligned loads (memcpy, _mm256_loadu_ps),
// never a dereference of a cast float* that assumes alignment.
//
// The mapping is MAP_PRIVATE + PROT_READ: weights are never copied, and pages
// are read in on first touch. Replacing a file with write_safetensors (rename)
// is safe for readers that hold the old mapping; truncating a mapped file in
// place is not (touching the lost pages raises SIGBUS).
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tandem {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kMetadataKey = "__metadata__";
// The reference implementation refuses headers above 100 MB; a real header
// for a model with tens of thousands of tensors is a few MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// "F32, F16, BF16, ..." from the DType enum itself, so a new dtype shows up in
// the message without editing this file. Relies on dtype_name() answering "?"
// past the last enumerator (the enum has a fixed underlying type, so casting
// any uint8_t to it is well defined).
std::string known_dtype_names() {
  std::string out;
  for (unsigned i = 0; i < 64; ++i) {
    std::string_view n = dtype_name(static_cast<DType>(i));
    if (n == "?") break;
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// A JSON integer >= 0 that fits in int64 (shape dims are int64). nlohmann
// stores non-negative literals as number_unsigned, negative ones as
// number_integer, and anything with a fraction or exponent as number_float.
bool json_to_nonneg_int(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = v;
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = uint64_t(v);
    return true;
  }
  return false;
}

// Parses the header, rejecting duplicate keys at any depth (nlohmann would
// silently keep the last one, which would hide e.g. two entries for one
// tensor). Uses the parse callback, which sees every key before it is stored.
json parse_header(const std::string& path, const char* begin, const char* end) {
  struct Level {
    std::set<std::string> keys;
  };
  std::vector<Level> stack;
  std::string top_key;     // the current top-level key (tensor name)
  std::string dup;         // first duplicate found
  std::string dup_parent;  // its enclosing top-level key, empty at top level
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: stack.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        if (stack.empty()) break;
        const std::string& k = parsed.get_ref<const std::string&>();
        if (stack.size() == 1) top_key = k;
        if (!stack.back().keys.insert(k).second && dup.empty()) {
          dup = k;
          dup_parent = stack.size() == 1 ? std::string() : top_key;
        }
        break;
      }
      default: break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(begin, end, callback);
  } catch (const json::exception& e) {
    fail("%s: header is not valid JSON: %s", path.c_str(), e.what());
  }
  if (!header.is_object())
    fail("%s: header must be a JSON object, found %s", path.c_str(), header.type_name());
  if (!dup.empty()) {
    if (dup_parent.empty()) fail("%s: header lists \"%s\" twice", path.c_str(), dup.c_str());
    fail("%s: entry \"%s\" has the key \"%s\" twice", path.c_str(), dup_parent.c_str(),
         dup.c_str());
  }
  return header;
}

// Validates one tensor entry against the data section size.
TensorInfo parse_entry(const std::string& path, const std::string& name, const json& e,
                       uint64_t data_size) {
  const char* p = path.c_str();
  const char* n = name.c_str();
  if (!e.is_object())
    fail("%s: tensor \"%s\": entry must be an object, found %s", p, n, e.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) fail("%s: tensor \"%s\": entry lacks \"%s\"", p, n, key);

  TensorInfo info;
  info.name = name;

  const json& jd = e.at("dtype");
  if (!jd.is_string())
    fail("%s: tensor \"%s\": dtype must be a string, found %s", p, n, jd.dump().c_str());
  const std::string& dname = jd.get_ref<const std::string&>();
  if (!parse_dtype(dname, &info.dtype))
    fail("%s: tensor \"%s\": unknown dtype \"%s\" (known: %s)", p, n, dname.c_str(),
         known_dtype_names().c_str());

  const json& js = e.at("shape");
  if (!js.is_array())
    fail("%s: tensor \"%s\": shape must be an array, found %s", p, n, js.dump().c_str());
  // numel with overflow checks; a zero dim makes the tensor empty (valid) no
  // matter how large the other dims are.
  uint64_t numel = 1;
  bool overflow = false, empty = false;
  for (const json& d : js) {
    uint64_t v;
    if (!json_to_nonneg_int(d, &v))
      fail("%s: tensor \"%s\": shape %s: dims must be non-negative integers, found %s", p, n,
           js.dump().c_str(), d.dump().c_str());
    info.shape.push_back(int64_t(v));
    if (v == 0) empty = true;
    if (__builtin_mul_overflow(numel, v, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (empty) {
    numel = 0;
  } else if (overflow || __builtin_mul_overflow(numel, uint64_t(dtype_size(info.dtype)), &nbytes)) {
    fail("%s: tensor \"%s\": shape %s is too large", p, n, js.dump().c_str());
  }

  const json& jo = e.at("data_offsets");
  uint64_t b, en;
  if (!jo.is_array() || jo.size() != 2 || !json_to_nonneg_int(jo[0], &b) ||
      !json_to_nonneg_int(jo[1], &en))
    fail("%s: tensor \"%s\": data_offsets must be two non-negative integers, found %s", p, n,
         jo.dump().c_str());
  if (b > en)
    fail("%s: tensor \"%s\": data_offsets [%llu, %llu]: begin is after end", p, n,
         (unsigned long long)b, (unsigned long long)en);
  if (en - b != nbytes)
    fail("%s: tensor \"%s\": %s %s needs %llu bytes, data_offsets [%llu, %llu] span %llu", p, n,
         dname.c_str(), shape_str(info.shape).c_str(), (unsigned long long)nbytes,
         (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b));
  if (en > data_size)
    fail("%s: tensor \"%s\": data_offsets [%llu, %llu] ends beyond the data section (%llu bytes)",
         p, n, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
  info.begin = b;
  info.end = en;
  return info;
}

// Rejects two tensors sharing a byte. Empty tensors own no bytes and are
// skipped, so [8, 8] next to [0, 16] is fine.
void check_overlaps(const std::string& path, const std::vector<TensorInfo>& tensors) {
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  // Sorted by begin, the ranges seen so far are disjoint, so the previous one
  // has the largest end.
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* a = by_offset[i - 1];
    const TensorInfo* b = by_offset[i];
    if (b->begin < a->end)
      fail("%s: tensors \"%s\" [%llu, %llu] and \"%s\" [%llu, %llu] overlap", path.c_str(),
           a->name.c_str(), (unsigned long long)a->begin, (unsigned long long)a->end,
           b->name.c_str(), (unsigned long long)b->begin, (unsigned long long)b->end);
  }
}

std::string errno_str(int err) {
  return std::strerror(err);
}

}  // namespace

// ---------------------------------------------------------------------------
// SafetensorsFile

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const char* p = path.c_str();
  int fd = ::open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open %s: %s", p, errno_str(errno).c_str());
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat %s: %s", p, errno_str(err).c_str());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("%s is not a regular file", p);
  }
  uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("%s: file is %llu bytes, shorter than the 8-byte header length", p,
         (unsigned long long)size);
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) fail("cannot mmap %s: %s", p, errno_str(map_err).c_str());
  madvise(m, size, MADV_WILLNEED);  // a hint; failure is harmless

  // From here on the destructor unmaps if validation throws.
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = static_cast<const uint8_t*>(m);
  f->map_size_ = size;

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f->map_[i];  // little-endian
  if (n > size - 8)
    fail("%s: header length %llu + 8 exceeds the file size %llu", p, (unsigned long long)n,
         (unsigned long long)size);
  if (n > kMaxHeaderBytes)
    fail("%s: header length %llu exceeds the limit of %llu bytes", p, (unsigned long long)n,
         (unsigned long long)kMaxHeaderBytes);
  const char* hbegin = reinterpret_cast<const char*>(f->map_ + 8);
  json header = parse_header(path, hbegin, hbegin + n);
  f->data_ = f->map_ + 8 + n;
  uint64_t data_size = size - 8 - n;

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      const json& md = it.value();
      if (!md.is_object())
        fail("%s: %s must be an object of strings, found %s", p, kMetadataKey, md.type_name());
      for (auto m2 = md.begin(); m2 != md.end(); ++m2) {
        if (!m2.value().is_string())
          fail("%s: %s[\"%s\"] must be a string, found %s", p, kMetadataKey, m2.key().c_str(),
               m2.value().dump().c_str());
        f->metadata_[m2.key()] = m2.value().get<std::string>();
      }
      continue;
    }
    f->tensors_.push_back(parse_entry(path, it.key(), it.value(), data_size));
  }
  check_overlaps(path, f->tensors_);
  // nlohmann's object is a std::map, so tensors_ is sorted by name.
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// `info` must come from this file's tensors() (its range was validated there).
TensorView SafetensorsFile::view(const TensorInfo& info) const {
  TensorView v;
  v.dtype = info.dtype;
  v.shape = info.shape;
  v.data = memory_.empty() ? data_ + info.begin  // possibly unaligned; see the top of this file
                           : memory_[size_t(&info - tensors_.data())];
  return v;
}

// ---------------------------------------------------------------------------
// Checkpoint

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json read_json_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail("cannot read %s: not a regular file", path.c_str());
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) fail("cannot open %s: %s", path.c_str(), errno_str(errno).c_str());
  std::string text;
  char buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, fp)) > 0) text.append(buf, got);
  bool err = std::ferror(fp);
  std::fclose(fp);
  if (err) fail("cannot read %s", path.c_str());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("%s: not valid JSON: %s", path.c_str(), e.what());
  }
}

// A shard name from an index must stay inside the checkpoint folder.
bool is_safe_relative(const std::string& name) {
  fs::path rel(name);
  if (name.empty() || rel.is_absolute()) return false;
  for (const fs::path& part : rel)
    if (part == "..") return false;
  return true;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  const char* d = dir.c_str();

  std::error_code ec;
  fs::file_status st = fs::status(dir, ec);  // follows symlinks (HF cache)
  if (st.type() == fs::file_type::not_found) fail("checkpoint %s does not exist", d);
  if (ec) fail("cannot access checkpoint %s: %s", d, ec.message().c_str());

  // Add one file's tensors; a name already held by another file is an error.
  auto add_file = [&ck](std::shared_ptr<SafetensorsFile> f) {
    for (const TensorInfo& t : f->tensors()) {
      auto [it, inserted] = ck.tensors_.emplace(t.name, std::make_pair(f.get(), &t));
      if (!inserted)
        fail("tensor \"%s\" is in both %s and %s", t.name.c_str(), it->second.first->path().c_str(),
             f->path().c_str());
    }
    ck.files_.push_back(std::move(f));
  };

  if (fs::is_regular_file(st)) {
    if (!ends_with(dir, ".safetensors"))
      fail("checkpoint %s is neither a folder nor a .safetensors file", d);
    add_file(SafetensorsFile::open(dir));
    return ck;
  }
  if (!fs::is_directory(st)) fail("checkpoint %s is neither a folder nor a .safetensors file", d);

  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();

  if (fs::exists(index_path, ec)) {
    const char* ip = index_path.c_str();
    json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("%s: expected an object with a \"weight_map\" object", ip);
    const json& wm = index["weight_map"];
    if (wm.empty()) fail("%s: weight_map is empty", ip);
    // Open each distinct shard once, in sorted order.
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      if (!it.value().is_string())
        fail("%s: weight_map[\"%s\"] must be a file name, found %s", ip, it.key().c_str(),
             it.value().dump().c_str());
      const std::string& shard = it.value().get_ref<const std::string&>();
      if (!is_safe_relative(shard))
        fail("%s: weight_map[\"%s\"] = \"%s\" is not a file inside %s", ip, it.key().c_str(),
             shard.c_str(), d);
      if (shards.count(shard)) continue;
      std::string shard_path = (fs::path(dir) / shard).string();
      if (!fs::is_regular_file(shard_path, ec))
        fail("%s lists shard %s (for tensor \"%s\"), but %s does not exist", ip, shard.c_str(),
             it.key().c_str(), shard_path.c_str());
      shards[shard] = SafetensorsFile::open(shard_path);
    }
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      const auto& f = shards.at(it.value().get<std::string>());
      if (!f->find(it.key()))
        fail("%s maps tensor \"%s\" to %s, but that shard does not contain it", ip,
             it.key().c_str(), f->path().c_str());
    }
    for (auto& [name, f] : shards) add_file(f);
    return ck;
  }

  if (fs::is_regular_file(single_path, ec)) {
    add_file(SafetensorsFile::open(single_path));
    return ck;
  }

  std::vector<std::string> paths;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (ends_with(name, ".safetensors") && fs::is_regular_file(it->path(), ec))
      paths.push_back(it->path().string());
  }
  if (ec) fail("cannot list %s: %s", d, ec.message().c_str());
  if (paths.empty()) fail("no .safetensors files in %s", d);
  std::sort(paths.begin(), paths.end());
  for (const std::string& p : paths) add_file(SafetensorsFile::open(p));
  return ck;
}

Checkpoint Checkpoint::from_memory(const std::string& label, std::vector<MemoryTensor> tensors,
                                   std::shared_ptr<const void> owner) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = label;
  f->owner_ = std::move(owner);
  for (MemoryTensor& t : tensors) {
    const uint64_t bytes = uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (!f->index_.emplace(t.name, f->tensors_.size()).second)
      fail("%s: tensor \"%s\" appears twice", label.c_str(), t.name.c_str());
    f->tensors_.push_back(TensorInfo{std::move(t.name), t.dtype, std::move(t.shape), 0, bytes});
    f->memory_.push_back(t.data);
  }
  Checkpoint ck;
  ck.dir_ = label;
  for (const TensorInfo& t : f->tensors_) ck.tensors_.emplace(t.name, std::make_pair(f.get(), &t));
  ck.files_.push_back(std::move(f));
  return ck;
}

bool Checkpoint::has(const std::string& name) const {
  return tensors_.count(name) != 0;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) out.push_back(name);
  return out;  // std::map keeps them sorted
}

TensorView Checkpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor \"%s\" in %s", name.c_str(), dir_.c_str());
  {
    std::lock_guard<std::mutex> lock(viewed_->mu);
    viewed_->names.insert(name);
  }
  return it->second.first->view(*it->second.second);
}

size_t Checkpoint::tensor_bytes(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor \"%s\" in %s", name.c_str(), dir_.c_str());
  return size_t(it->second.second->end - it->second.second->begin);
}

std::vector<std::string> Checkpoint::viewed() const {
  std::lock_guard<std::mutex> lock(viewed_->mu);
  return {viewed_->names.begin(), viewed_->names.end()};
}

TensorView Checkpoint::require(const std::string& name, const Shape& shape) const {
  TensorView v = get(name);
  if (v.shape != shape)
    fail("tensor \"%s\" in %s: expected shape %s, found %s", name.c_str(), file_of(name).c_str(),
         shape_str(shape).c_str(), shape_str(v.shape).c_str());
  return v;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor \"%s\" in %s", name.c_str(), dir_.c_str());
  return it->second.first->path();
}

// ---------------------------------------------------------------------------
// Writing

namespace {

// Writes all of `n` bytes, retrying short writes and EINTR; false on error.
bool write_all(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const char* p = path.c_str();
  // Validate everything before touching the disk.
  std::vector<const TensorData*> order;
  for (const TensorData& t : tensors) {
    if (t.name == kMetadataKey)
      fail("write %s: \"%s\" is reserved and cannot name a tensor", p, kMetadataKey);
    for (int64_t dim : t.shape)
      if (dim < 0)
        fail("write %s: tensor \"%s\": shape %s has a negative dim", p, t.name.c_str(),
             shape_str(t.shape).c_str());
    uint64_t want = uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (t.bytes.size() != want)
      fail("write %s: tensor \"%s\": %s %s needs %llu bytes, got %zu", p, t.name.c_str(),
           std::string(dtype_name(t.dtype)).c_str(), shape_str(t.shape).c_str(),
           (unsigned long long)want, t.bytes.size());
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const TensorData* a, const TensorData* b) { return a->name < b->name; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->name == order[i - 1]->name)
      fail("write %s: tensor \"%s\" appears twice", p, order[i]->name.c_str());

  json header = json::object();
  uint64_t offset = 0;
  for (const TensorData* t : order) {
    json e = json::object();
    e["dtype"] = std::string(dtype_name(t->dtype));
    e["shape"] = t->shape;
    e["data_offsets"] = json::array({offset, offset + t->bytes.size()});
    header[t->name] = std::move(e);
    offset += t->bytes.size();
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // e.g. a name that is not valid UTF-8
    fail("write %s: cannot encode the header: %s", p, e.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data section starts at a
  // multiple of 8, as the reference implementation does.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  // Write a sibling temp file, then rename over `path`, so readers never see
  // a half-written file.
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create %s: %s", tmp.c_str(), errno_str(errno).c_str());
  bool ok = write_all(fd, len, 8) && write_all(fd, text.data(), text.size());
  for (size_t i = 0; ok && i < order.size(); ++i)
    ok = write_all(fd, order[i]->bytes.data(), order[i]->bytes.size());
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    fail("cannot write %s: %s", tmp.c_str(), errno_str(err).c_str());
  }
  if (std::rename(tmp.c_str(), p) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename %s to %s: %s", tmp.c_str(), p, errno_str(err).c_str());
  }
}

}  // namespace tandem
