// safetensors reader/writer and checkpoint folders: round trips, sharded
// checkpoints, every validation failure (asserting the message names the file,
// the tensor and the numbers at fault), and the HF-saved parity fixtures.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/safetensors.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the gtest temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::path(testing::TempDir()) / "tandem-st-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A file with a hand-written header (no padding) and `data_size` data bytes.
std::string raw_file(const TempDir& dir, const std::string& name, const std::string& header,
                     size_t data_size) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = char(n >> (8 * i));
  bytes += header;
  bytes += std::string(data_size, '\x5a');
  std::string path = dir.file(name);
  write_bytes(path, bytes);
  return path;
}

// The message of the tandem::Error that `f` throws ("" plus a failure if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected tandem::Error";
  return "";
}

void expect_contains(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
}

template <class T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TensorData f32_tensor(const std::string& name, Shape shape, float start = 0.0f) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + float(i) * 0.5f;
  return TensorData{name, DType::F32, std::move(shape), to_bytes(v)};
}

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

}  // namespace

// ---------------------------------------------------------------------------
// Round trips

TEST(SafetensorsRoundTrip, AllDtypesShapesAndMetadata) {
  TempDir dir;
  std::vector<uint16_t> bf16 = {f32_to_bf16(1.0f), f32_to_bf16(-2.5f), f32_to_bf16(3.0f)};
  std::vector<uint16_t> f16(8);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = f32_to_f16(float(i) - 3.0f);
  std::vector<int64_t> i64 = {-1, 0, int64_t(1) << 40};
  std::vector<TensorData> in = {
      f32_tensor("w.f32", {2, 3}),
      {"b.bf16", DType::BF16, {3}, to_bytes(bf16)},
      {"c.f16", DType::F16, {2, 2, 2}, to_bytes(f16)},
      {"a.i64", DType::I64, {3, 1}, to_bytes(i64)},
      {"empty", DType::F32, {0, 5}, {}},
      f32_tensor("scalar", {}, 7.0f),
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "round trip"}};
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, in, meta);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // The data section starts 8-byte aligned.
  std::string raw = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[i]);
  EXPECT_EQ((8 + n) % 8, 0u);

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), in.size());
  for (size_t i = 1; i < f->tensors().size(); ++i)
    EXPECT_LT(f->tensors()[i - 1].name, f->tensors()[i].name);  // sorted by name
  for (const TensorData& t : in) {
    const TensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
    TensorView v = f->view(*info);
    EXPECT_EQ(v.nbytes(), t.bytes.size()) << t.name;
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), t.bytes.size()), 0) << t.name;
    }
  }
  EXPECT_EQ(f->find("nope"), nullptr);
  TensorView w = f->view(*f->find("w.f32"));
  EXPECT_EQ(load_as_f32(w.data, w.dtype, 5), 2.5f);
  TensorView b = f->view(*f->find("b.bf16"));
  EXPECT_EQ(load_as_f32(b.data, b.dtype, 1), -2.5f);
  TensorView s = f->view(*f->find("scalar"));
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(load_as_f32(s.data, s.dtype, 0), 7.0f);
}

TEST(SafetensorsRoundTrip, NoMetadataAndOverwrite) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {f32_tensor("x", {4})});
  write_safetensors(path, {f32_tensor("y", {2, 2}, 1.0f)});  // replaces the old file
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f->metadata().empty());
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].name, "y");
  EXPECT_EQ(read_bytes(path).find("__metadata__"), std::string::npos);
}

TEST(SafetensorsRoundTrip, UnalignedDataSectionIsReadable) {
  // A 21-byte header puts the F32 data at file offset 29: views are raw
  // pointers and must be read with unaligned loads.
  TempDir dir;
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header += std::string((8 - (8 + header.size()) % 8) % 8 + 1, ' ');  // misalign by one
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = char(uint64_t(header.size()) >> (8 * i));
  float vals[2] = {1.5f, -4.0f};
  bytes += header + std::string(reinterpret_cast<const char*>(vals), 8);
  const std::string path = dir.file("u.safetensors");
  write_bytes(path, bytes);
  auto f = SafetensorsFile::open(path);
  TensorView v = f->view(f->tensors()[0]);
  EXPECT_NE(reinterpret_cast<uintptr_t>(v.data) % 4, 0u);
  float got[2];
  std::memcpy(got, v.data, 8);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -4.0f);
}

TEST(SafetensorsRoundTrip, EmptyFileHasNoTensors) {
  TempDir dir;
  const std::string path = dir.file("e.safetensors");
  write_safetensors(path, {});
  EXPECT_TRUE(SafetensorsFile::open(path)->tensors().empty());
}

// ---------------------------------------------------------------------------
// Reader validation

TEST(SafetensorsOpen, MissingFile) {
  TempDir dir;
  expect_contains(open_error(dir.file("absent.safetensors")),
                  {"absent.safetensors", "No such file"});
  expect_contains(open_error(dir.path()), {dir.path(), "not a regular file"});
}

TEST(SafetensorsOpen, TruncatedFile) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, {f32_tensor("a", {4}), f32_tensor("b", {3})}, {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  const std::string path = dir.file("cut.safetensors");
  const std::string nstr = std::to_string(n);
  // Inside the length prefix.
  for (size_t cut : {size_t(0), size_t(3), size_t(7)}) {
    write_bytes(path, bytes.substr(0, cut));
    expect_contains(open_error(path), {path, std::to_string(cut) + " bytes", "8"});
  }
  // Inside the header: both the header length and the file size are named.
  for (size_t cut : {size_t(8), size_t(8 + n / 2), size_t(8 + n - 1)}) {
    write_bytes(path, bytes.substr(0, cut));
    expect_contains(open_error(path), {path, nstr, std::to_string(cut)});
  }
  // Inside the data section: the last tensor ("b" sorts after "a", so it ends
  // the data) lies beyond the shortened data section.
  // "a" is [0, 16] and "b" is [16, 28]; the first one cut short is named.
  for (size_t cut : {size_t(8 + n), size_t(8 + n + 15), size_t(8 + n + 20), bytes.size() - 1}) {
    write_bytes(path, bytes.substr(0, cut));
    const size_t data_size = cut - 8 - n;
    const bool a_cut = data_size < 16;
    expect_contains(open_error(path),
                    {path, a_cut ? "\"a\"" : "\"b\"", a_cut ? "[0, 16]" : "[16, 28]",
                     strprintf("(%zu bytes)", data_size)});
  }
}

TEST(SafetensorsOpen, HeaderLengthBeyondFile) {
  TempDir dir;
  std::string bytes(8, '\0');
  bytes[0] = char(0xe8);  // 1000
  bytes[1] = char(0x03);
  bytes += std::string(42, ' ');
  const std::string path = dir.file("h.safetensors");
  write_bytes(path, bytes);
  expect_contains(open_error(path), {path, "1000", "50"});
  // A length near 2^64 must not wrap around.
  std::string huge(8, '\xff');
  huge += "{}";
  write_bytes(path, huge);
  expect_contains(open_error(path), {path, "18446744073709551615", "10"});
}

TEST(SafetensorsOpen, BadJson) {
  TempDir dir;
  expect_contains(open_error(raw_file(dir, "a.safetensors", "{\"x\": ", 0)),
                  {"a.safetensors", "not valid JSON"});
  expect_contains(open_error(raw_file(dir, "b.safetensors", "", 0)),
                  {"b.safetensors", "not valid JSON"});
  expect_contains(open_error(raw_file(dir, "c.safetensors", "[1, 2]", 0)),
                  {"c.safetensors", "must be a JSON object", "array"});
  expect_contains(open_error(raw_file(dir, "d.safetensors", "{} trailing", 0)),
                  {"d.safetensors", "not valid JSON"});
}

TEST(SafetensorsOpen, MalformedEntry) {
  TempDir dir;
  struct Case {
    std::string header;
    std::vector<std::string> facts;
  };
  const std::vector<Case> cases = {
      {R"({"t": 5})", {"\"t\"", "must be an object", "number"}},
      {R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", {"\"t\"", "lacks \"dtype\""}},
      {R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", {"\"t\"", "lacks \"shape\""}},
      {R"({"t": {"dtype": "F32", "shape": [1]}})", {"\"t\"", "lacks \"data_offsets\""}},
      {R"({"t": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})",
       {"\"t\"", "dtype must be a string"}},
      {R"({"t": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})",
       {"\"t\"", "shape must be an array"}},
      {R"({"t": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 4]}})",
       {"\"t\"", "non-negative integers", "-1"}},
      {R"({"t": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 4]}})",
       {"\"t\"", "non-negative integers", "2.5"}},
      {R"({"t": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 4]}})",
       {"\"t\"", "non-negative integers"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})",
       {"\"t\"", "data_offsets must be two non-negative integers"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})",
       {"\"t\"", "data_offsets must be two non-negative integers"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})",
       {"\"t\"", "data_offsets must be two non-negative integers", "-4"}},
      {R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}})",
       {"\"t\"", "data_offsets must be two non-negative integers"}},
      {R"({"t": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
       {"\"t\"", "[8, 4]", "begin is after end"}},
      {R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
       {"\"t\"", "too large"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    // strprintf, not "e" + to_string(i): GCC 12 warns falsely (-Wrestrict)
    // about prepending to a temporary string.
    const std::string name = strprintf("e%zu.safetensors", i);
    std::string msg = open_error(raw_file(dir, name, cases[i].header, 64));
    expect_contains(msg, {name});
    for (const std::string& fact : cases[i].facts) expect_contains(msg, {fact});
  }
}

TEST(SafetensorsOpen, UnknownDtype) {
  TempDir dir;
  const std::string path =
      raw_file(dir, "d.safetensors",
               R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  expect_contains(open_error(path), {path, "\"w\"", "unknown dtype \"F64\"", "F32", "BF16", "I64"});
}

TEST(SafetensorsOpen, WrongByteSize) {
  TempDir dir;
  const std::string path =
      raw_file(dir, "s.safetensors",
               R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
  expect_contains(open_error(path), {path, "\"w\"", "[2, 3]", "24 bytes", "span 20"});
}

TEST(SafetensorsOpen, OffsetsBeyondData) {
  TempDir dir;
  const std::string path =
      raw_file(dir, "o.safetensors",
               R"({"w": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]}})", 16);
  expect_contains(open_error(path), {path, "\"w\"", "[0, 24]", "16 bytes"});
}

TEST(SafetensorsOpen, OverlappingTensors) {
  TempDir dir;
  const std::string path =
      raw_file(dir, "ov.safetensors",
               R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
               24);
  expect_contains(open_error(path), {path, "\"a\"", "\"b\"", "[0, 16]", "[8, 24]", "overlap"});
  // Identical ranges overlap too; an empty tensor inside another's range does not.
  const std::string same = raw_file(dir, "same.safetensors",
                                    R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                        "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
                                    4);
  expect_contains(open_error(same), {"\"a\"", "\"b\"", "overlap"});
  const std::string empty = raw_file(dir, "empty.safetensors",
                                     R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                         "z": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})",
                                     4);
  auto f = SafetensorsFile::open(empty);
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->view(*f->find("z")).nbytes(), 0u);
}

TEST(SafetensorsOpen, BadMetadata) {
  TempDir dir;
  expect_contains(open_error(raw_file(dir, "m1.safetensors", R"({"__metadata__": [1]})", 0)),
                  {"m1.safetensors", "__metadata__", "object of strings"});
  expect_contains(
      open_error(raw_file(dir, "m2.safetensors", R"({"__metadata__": {"k": "v", "n": 3}})", 0)),
      {"m2.safetensors", "__metadata__[\"n\"]", "must be a string", "3"});
}

TEST(SafetensorsOpen, DuplicateKeys) {
  TempDir dir;
  const std::string t = R"({"dtype": "U8", "shape": [1], "data_offsets": [0, 1]})";
  expect_contains(
      open_error(raw_file(dir, "d1.safetensors", "{\"w\": " + t + ", \"w\": " + t + "}", 1)),
      {"d1.safetensors", "\"w\" twice"});
  expect_contains(open_error(raw_file(dir, "d2.safetensors",
                                      R"({"w": {"dtype": "U8", "dtype": "F32", "shape": [1],
                                               "data_offsets": [0, 1]}})",
                                      1)),
                  {"d2.safetensors", "\"w\"", "\"dtype\" twice"});
}

// ---------------------------------------------------------------------------
// Writer validation

TEST(SafetensorsWrite, RejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  TensorData bad = f32_tensor("model.bad", {2, 3});
  bad.bytes.resize(20);
  expect_contains(error_of([&] {
                    write_safetensors(path, {f32_tensor("ok", {1}), bad});
                  }),
                  {path, "\"model.bad\"", "24 bytes", "got 20"});
  expect_contains(error_of([&] {
                    write_safetensors(path, {f32_tensor("x", {1}), f32_tensor("x", {1})});
                  }),
                  {path, "\"x\"", "twice"});
  expect_contains(error_of([&] { write_safetensors(path, {f32_tensor("__metadata__", {1})}); }),
                  {path, "reserved"});
  expect_contains(error_of([&] { write_safetensors(path, {f32_tensor("bad\xff", {1})}); }),
                  {path, "header"});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsWrite, ReportsIoErrors) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/w.safetensors");
  expect_contains(error_of([&] { write_safetensors(path, {f32_tensor("x", {1})}); }),
                  {path, "No such file or directory"});
}

// ---------------------------------------------------------------------------
// Checkpoint folders

TEST(CheckpointOpen, SingleFileFolder) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"),
                    {f32_tensor("model.norm.weight", {4}), f32_tensor("lm_head.weight", {3, 4})});
  // model.safetensors wins over other files in the folder.
  write_safetensors(dir.file("other.safetensors"), {f32_tensor("model.norm.weight", {4})});
  Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.dir(), dir.path());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"lm_head.weight", "model.norm.weight"}));
  EXPECT_TRUE(ck.has("lm_head.weight"));
  EXPECT_FALSE(ck.has("model.embed_tokens.weight"));
  EXPECT_EQ(ck.file_of("lm_head.weight"), dir.file("model.safetensors"));
  TensorView v = ck.require("lm_head.weight", {3, 4});
  EXPECT_EQ(load_as_f32(v.data, v.dtype, 11), 5.5f);
  EXPECT_EQ(ck.get("model.norm.weight").shape, Shape{4});

  // A copy stays valid after the original is gone (files are shared).
  Checkpoint copy = ck;
  ck = Checkpoint::open(dir.file("other.safetensors"));
  EXPECT_EQ(load_as_f32(copy.get("lm_head.weight").data, DType::F32, 1), 0.5f);
}

TEST(CheckpointOpen, MissingTensorAndWrongShape) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {f32_tensor("x", {3, 2})});
  Checkpoint ck = Checkpoint::open(dir.path());
  expect_contains(error_of([&] { ck.get("model.norm.weight"); }),
                  {"missing tensor \"model.norm.weight\" in " + dir.path()});
  expect_contains(error_of([&] { ck.file_of("nope"); }), {"missing tensor \"nope\""});
  expect_contains(error_of([&] {
                    ck.require("x", {2, 3});
                  }),
                  {"tensor \"x\" in " + dir.file("model.safetensors") +
                   ": expected shape [2, 3], found [3, 2]"});
}

TEST(CheckpointOpen, FilePathInsteadOfFolder) {
  TempDir dir;
  const std::string path = dir.file("weights.safetensors");
  write_safetensors(path, {f32_tensor("a", {2})});
  Checkpoint ck = Checkpoint::open(path);
  EXPECT_EQ(ck.names(), std::vector<std::string>{"a"});
  EXPECT_EQ(ck.file_of("a"), path);
  write_bytes(dir.file("config.json"), "{}");
  expect_contains(error_of([&] { Checkpoint::open(dir.file("config.json")); }),
                  {"config.json", "neither a folder nor a .safetensors file"});
}

TEST(CheckpointOpen, ShardedViaIndex) {
  TempDir dir;
  write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                    {f32_tensor("model.embed_tokens.weight", {4, 2}), f32_tensor("model.a", {1})});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                    {f32_tensor("lm_head.weight", {4, 2}, 9.0f)});
  write_bytes(dir.file("model.safetensors.index.json"), R"({
    "metadata": {"total_size": 68},
    "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.a": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"
    }})");
  // A stray file that the index does not list is ignored.
  write_safetensors(dir.file("stray.safetensors"), {f32_tensor("lm_head.weight", {1})});
  Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.names(),
            (std::vector<std::string>{"lm_head.weight", "model.a", "model.embed_tokens.weight"}));
  EXPECT_EQ(ck.file_of("lm_head.weight"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ck.file_of("model.a"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(load_as_f32(ck.require("lm_head.weight", {4, 2}).data, DType::F32, 0), 9.0f);
}

TEST(CheckpointOpen, IndexProblems) {
  TempDir dir;
  const std::string index = dir.file("model.safetensors.index.json");
  write_safetensors(dir.file("s1.safetensors"), {f32_tensor("a", {1})});

  write_bytes(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }),
                  {index, "s2.safetensors", "\"b\"", "does not exist"});

  write_bytes(index, R"({"weight_map": {"a": "s1.safetensors", "c": "s1.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }),
                  {index, "\"c\"", dir.file("s1.safetensors"), "does not contain"});

  write_bytes(index, R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }), {index, "../s1.safetensors"});

  write_bytes(index, R"({"weight_map": [1]})");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }), {index, "weight_map"});

  write_bytes(index, R"({"weight_map": )");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }), {index, "not valid JSON"});

  // Two shards holding the same tensor.
  write_safetensors(dir.file("s2.safetensors"), {f32_tensor("a", {1}), f32_tensor("b", {1})});
  write_bytes(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }),
                  {"\"a\"", dir.file("s1.safetensors"), dir.file("s2.safetensors")});
}

TEST(CheckpointOpen, EverySafetensorsFileWithoutIndex) {
  TempDir dir;
  write_safetensors(dir.file("b.safetensors"), {f32_tensor("y", {2})});
  write_safetensors(dir.file("a.safetensors"), {f32_tensor("x", {2})});
  write_bytes(dir.file("notes.txt"), "not a checkpoint");
  Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ck.file_of("y"), dir.file("b.safetensors"));

  // The same tensor in two files names both.
  write_safetensors(dir.file("c.safetensors"), {f32_tensor("x", {2})});
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }),
                  {"\"x\"", dir.file("a.safetensors"), dir.file("c.safetensors")});
}

TEST(CheckpointOpen, EmptyOrMissingFolder) {
  TempDir dir;
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }),
                  {"no .safetensors files in " + dir.path()});
  const std::string missing = dir.file("nowhere");
  expect_contains(error_of([&] { Checkpoint::open(missing); }), {missing, "does not exist"});
}

TEST(CheckpointOpen, BadShardFileNamesTheShard) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), "tiny");
  expect_contains(error_of([&] { Checkpoint::open(dir.path()); }),
                  {dir.file("model.safetensors"), "4 bytes"});
}

// ---------------------------------------------------------------------------
// Fixtures saved by HF transformers

TEST(CheckpointFixture, LlamaF32) {
  Checkpoint ck = Checkpoint::open(TANDEM_SOURCE_DIR "/tests/fixtures/parity/llama-f32");
  EXPECT_EQ(ck.names().size(), 30u);
  TensorView emb = ck.require("model.embed_tokens.weight", {320, 64});
  EXPECT_EQ(emb.dtype, DType::F32);
  TensorView head = ck.require("lm_head.weight", {320, 64});
  EXPECT_EQ(head.dtype, DType::F32);
  ck.require("model.norm.weight", {64});
  ck.require("model.layers.2.self_attn.k_proj.weight", {32, 64});
  ck.require("model.layers.0.mlp.down_proj.weight", {64, 128});
  // Weights are finite and not all zero.
  double sum = 0;
  for (int64_t i = 0; i < emb.numel(); ++i) {
    float x = load_as_f32(emb.data, emb.dtype, i);
    ASSERT_TRUE(std::isfinite(x)) << i;
    sum += std::fabs(x);
  }
  EXPECT_GT(sum, 0.0);
  auto f = SafetensorsFile::open(ck.file_of("lm_head.weight"));
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(CheckpointFixture, Gemma3Bf16) {
  Checkpoint ck = Checkpoint::open(TANDEM_SOURCE_DIR "/tests/fixtures/parity/gemma3-bf16");
  EXPECT_EQ(ck.names().size(), 88u);
  // This multimodal checkpoint uses the language_model.model.* spelling.
  TensorView q = ck.require("language_model.model.layers.0.self_attn.q_proj.weight", {128, 80});
  EXPECT_EQ(q.dtype, DType::BF16);
  EXPECT_EQ(ck.get("language_model.model.embed_tokens.weight").shape, (Shape{320, 80}));
  EXPECT_EQ(ck.get("vision_tower.embeddings.patch_embedding.weight").shape, (Shape{32, 3, 14, 14}));
  for (const std::string& name : ck.names()) EXPECT_EQ(ck.get(name).dtype, DType::BF16) << name;
  double sum = 0;
  for (int64_t i = 0; i < q.numel(); ++i) sum += std::fabs(load_as_f32(q.data, q.dtype, i));
  EXPECT_GT(sum, 0.0);
}
