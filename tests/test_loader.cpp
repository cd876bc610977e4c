// Model loading: every tensor the spec needs is checked, and a bad checkpoint
// is an error that names the tensor, the file and the expected shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace tandem;

namespace {

// Copies a fixture into `dir`, letting `edit` change its tensor list.
void copy_fixture(const std::string& name, const std::string& dir,
                  const std::function<void(std::vector<TensorData>&)>& edit) {
  auto src = SafetensorsFile::open(test::fixture_dir(name) + "/model.safetensors");
  std::vector<TensorData> tensors;
  for (const auto& info : src->tensors()) {
    TensorView v = src->view(info);
    const auto* p = static_cast<const uint8_t*>(v.data);
    tensors.push_back({info.name, info.dtype, info.shape, std::vector<uint8_t>(p, p + v.nbytes())});
  }
  edit(tensors);
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", tensors);
  std::filesystem::copy_file(test::fixture_dir(name) + "/config.json", dir + "/config.json");
}

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Loader, LoadsEveryFixtureLayout) {
  for (const char* name :
       {"llama-f32", "qwen2-bf16", "qwen3-f16", "gemma3_text-f32", "gemma3-bf16"}) {
    auto m = load_model(test::fixture_dir(name));
    EXPECT_EQ(int64_t(m->weights.layers.size()), m->spec.layers) << name;
  }
}

// For the CPU (pack_for_cpu) a head viewing the checkpoint is copied into
// owned memory (huge pages), byte for byte; a tied embedding table follows
// it, and the quantized heads of --quantize are left alone.
TEST(Loader, CpuLoadCopiesTheHeadIntoOwnedMemory) {
  for (const char* name : {"qwen2-bf16", "llama-bf16", "qwen3-f16"}) {
    auto mapped = load_model(test::fixture_dir(name));
    LoadOptions o;
    o.pack_for_cpu = true;
    auto m = load_model(test::fixture_dir(name), o);
    const WeightMatrix& head = m->weights.head;
    bool owned = false;
    for (const OwnedBuffer& b : m->owned) owned = owned || b.get() == head.data;
    EXPECT_TRUE(owned) << name;
    ASSERT_EQ(head.nbytes(), mapped->weights.head.nbytes()) << name;
    EXPECT_EQ(std::memcmp(head.data, mapped->weights.head.data, head.nbytes()), 0) << name;
    EXPECT_EQ(m->weights.embed.data == head.data, m->spec.tied_embeddings) << name;
    o.quantize_bits = 8;
    auto q = load_model(test::fixture_dir(name), o);
    EXPECT_EQ(q->weights.head.format, WeightFormat::Affine) << name;
  }
}

TEST(Loader, MissingTensorIsNamed) {
  test::TempDir tmp;
  copy_fixture("llama-f32", tmp.path(), [](auto& t) {
    std::erase_if(
        t, [](const TensorData& d) { return d.name == "model.layers.1.mlp.up_proj.weight"; });
  });
  std::string err = load_error(tmp.path());
  EXPECT_NE(err.find("missing tensor \"model.layers.1.mlp.up_proj.weight\""), std::string::npos)
      << err;
}

TEST(Loader, WrongShapeNamesTensorAndBothShapes) {
  test::TempDir tmp;
  copy_fixture("qwen3-f32", tmp.path(), [](auto& t) {
    for (auto& d : t)
      if (d.name == "model.layers.0.self_attn.k_proj.weight") d.shape = {32, 128};  // was [64, 64]
  });
  std::string err = load_error(tmp.path());
  EXPECT_NE(err.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("expected shape [64, 64], found [32, 128]"), std::string::npos) << err;
}

TEST(Loader, UnsupportedDtypeIsNamed) {
  test::TempDir tmp;
  copy_fixture("llama-f32", tmp.path(), [](auto& t) {
    for (auto& d : t)
      if (d.name == "model.norm.weight") d.dtype = DType::I32;  // same byte size as F32
  });
  std::string err = load_error(tmp.path());
  EXPECT_NE(err.find("\"model.norm.weight\""), std::string::npos) << err;
  EXPECT_NE(err.find("dtype I32 is not supported"), std::string::npos) << err;
}

TEST(Loader, UntiedModelWithoutHeadSaysSo) {
  test::TempDir tmp;
  copy_fixture("llama-f32", tmp.path(), [](auto& t) {
    std::erase_if(t, [](const TensorData& d) { return d.name == "lm_head.weight"; });
  });
  std::string err = load_error(tmp.path());
  EXPECT_NE(err.find("no lm_head.weight"), std::string::npos) << err;
}

TEST(Loader, FolderWithoutConfigSaysWhatIsNeeded) {
  test::TempDir tmp;
  std::string err = load_error(tmp.path());
  EXPECT_NE(err.find("no config.json"), std::string::npos) << err;
}

TEST(Loader, GemmaNormsGetPlusOneAndEmbeddingScaleIsRounded) {
  auto m = load_model(test::fixture_dir("gemma3_text-bf16"));
  Checkpoint ckpt = Checkpoint::open(test::fixture_dir("gemma3_text-bf16"));
  TensorView raw = ckpt.get("model.norm.weight");
  EXPECT_FLOAT_EQ(m->weights.final_norm[0], 1.0f + load_as_f32(raw.data, raw.dtype, 0));
  EXPECT_EQ(m->weights.embed_scale, 8.9375f);  // sqrt(80) in bf16
  auto f32 = load_model(test::fixture_dir("gemma3_text-f32"));
  EXPECT_FLOAT_EQ(f32->weights.embed_scale, std::sqrt(80.0f));
}

}  // namespace
