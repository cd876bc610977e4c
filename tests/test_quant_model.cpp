// Quantized checkpoints end to end: `tandem quantize` then load, for every
// architecture fixture, against the same model with the dequantized weights
// in f32; MLX per-module overrides; on-load quantization; FP8 checkpoints;
// malformed input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/quantize_checkpoint.h"
#include "model/quantized.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;
namespace fs = std::filesystem;

namespace {

const std::vector<int32_t> kIds = {144, 31,  102, 78,  270, 261, 176,
                                   226, 125, 65,  159, 141, 19,  179};

// Every position's logits of `ids`.
std::vector<float> all_logits(const std::string& dir, const LoadOptions& options = {}) {
  auto m = load_model(dir, options);
  ThreadPool pool(2);
  const int64_t n = int64_t(kIds.size());
  KvPool kv = single_sequence_pool(m->spec, n, Decoder::kDefaultStepTokens);
  Decoder d(*m, pool, kv);
  SequenceKv s;
  std::vector<float> out(size_t(n * m->spec.vocab));
  run_sequence(d, kIds.data(), n, s, out.data(), true);
  return out;
}

void copy_file(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

// OUT = the model at QDIR with every quantized matrix dequantized to f32 (the
// shapes taken from ORIGINAL), no quantization in config.json.
void write_dequantized_copy(const std::string& qdir, const std::string& original,
                            const std::string& out) {
  const Checkpoint q = Checkpoint::open(qdir), o = Checkpoint::open(original);
  OwnedBuffers owned;
  uint64_t owned_bytes = 0;
  MatrixLoader loader(q, read_quant_config(qdir), 0, 64, owned, owned_bytes);
  std::vector<TensorData> tensors;
  for (const std::string& name : q.names()) {
    auto ends_with = [&](const char* suffix) {
      return name.size() > std::strlen(suffix) &&
             name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0;
    };
    if (ends_with(".scales") || ends_with(".biases")) continue;
    const std::string module = module_of(name);
    if (!q.has(module + ".scales")) {
      const TensorView t = q.get(name);
      TensorData d{name, t.dtype, t.shape, {}};
      d.bytes.assign(static_cast<const uint8_t*>(t.data),
                     static_cast<const uint8_t*>(t.data) + t.nbytes());
      tensors.push_back(std::move(d));
      continue;
    }
    const Shape shape = o.get(name).shape;
    const WeightMatrix w = loader.load(name, shape[0], shape[1]);
    TensorData d{name, DType::F32, shape, {}};
    d.bytes.resize(size_t(shape[0] * shape[1]) * 4);
    for (int64_t r = 0; r < shape[0]; ++r)
      dequantize_row(w, r, reinterpret_cast<float*>(d.bytes.data()) + r * shape[1]);
    tensors.push_back(std::move(d));
  }
  fs::create_directories(out);
  write_safetensors(out + "/model.safetensors", tensors);
  copy_file(original + "/config.json", out + "/config.json");
}

// ---- Every architecture: tandem quantize, then load ------------------------------

class QuantizedFixture : public ::testing::TestWithParam<std::string> {};

double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::fabs(a[i] - b[i]);
  return d / double(a.size());
}

struct ReferenceGuard {
  ReferenceGuard() { cpu::set_quant_reference_for_testing(true); }
  ~ReferenceGuard() { cpu::set_quant_reference_for_testing(false); }
};

// `tandem quantize --bits 4|8 --group-size 32`, loaded, against the same
// model with every quantized matrix dequantized to f32:
//  - with exact f32 activations (the reference hook) the logits agree to
//    1e-3 of their spread (the parity tests' bound; measured ≤ 1e-4 but on
//    Gemma 4's fixtures): every code, scale, bias, embedding row and the tied
//    head are read as written;
//  - with the int8 kernels the only difference is the activations' int8
//    rounding (per block of 32), a perturbation of the size of rounding the
//    weights to 8 bits. These random fixtures amplify perturbations very
//    differently (Gemma 4's: 8-bit weights alone move the logits by 0.5-1.0),
//    so the stated tolerance is relative to each fixture's own sensitivity
//    S, the change that 8-bit group-32 weights cause with exact activations:
//    max |Δ| ≤ 2·S_max + 0.05·std, mean |Δ| ≤ 2·S_mean + 0.005·std.
//    (Measured on the non-Gemma-4 fixtures: mean |Δ| 1.0-2.0% of std, max
//    5-14%.)
TEST_P(QuantizedFixture, LogitsMatchTheDequantizedModel) {
  const std::string fixture = test::fixture_dir(GetParam());
  const std::vector<float> original = all_logits(fixture);
  const double spread = stddev(original);
  double s_max, s_mean;
  {
    ReferenceGuard exact;
    LoadOptions o;
    o.quantize_bits = 8;
    o.quantize_group_size = 32;
    const std::vector<float> w8 = all_logits(fixture, o);
    s_max = max_abs_diff(w8, original);
    s_mean = mean_abs_diff(w8, original);
  }
  for (int bits : {4, 8}) {
    test::TempDir tmp;
    const std::string qdir = tmp.path() + "/q", ddir = tmp.path() + "/deq";
    const test::CommandResult r = test::run_tandem("quantize " + fixture + " " + qdir + " --bits " +
                                                   std::to_string(bits) + " --group-size 32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto model = load_model(qdir);
    // Matrices whose row length 32 divides are quantized (gemma3's hidden 80 is not).
    EXPECT_TRUE(model->weights.layers[0].o.quantized()) << GetParam();
    EXPECT_EQ(model->weights.layers[0].o.bits, bits);
    if (model->spec.hidden % 32 == 0) {
      EXPECT_TRUE(model->weights.embed.quantized());
      EXPECT_TRUE(model->weights.layers[0].q.quantized());
    }
    if (model->spec.tied_embeddings) {
      EXPECT_EQ(model->weights.head.data, model->weights.embed.data);
    }
    write_dequantized_copy(qdir, fixture, ddir);
    const std::vector<float> deq = all_logits(ddir), q = all_logits(qdir);
    std::vector<float> exact;
    {
      ReferenceGuard guard;
      exact = all_logits(qdir);
    }
    EXPECT_LE(max_abs_diff(exact, deq), 1e-3 * spread) << GetParam() << " " << bits << "-bit";
    // Packed for the CPU's outer-product kernels where they run here. With
    // exact activations (the reference hook) the packed model is the
    // unpacked one exactly (the same dequantized rows). On the int8 kernels
    // the integer sums are the same but scaled and added in another order, so
    // now and then an activation's rounding to int8 tips the other way in a
    // later layer, and these random fixtures amplify that one step (measured:
    // ~1e-6 of std at most positions; Gemma 4 up to 15% of std from the tipped
    // position on, Mistral 3 4%): bounded by the fixture's sensitivity to
    // 8-bit weights, s_max.
    LoadOptions packed;
    packed.pack_for_cpu = true;
    if (cpu::packed_affine_preferred(bits)) {
      EXPECT_EQ(load_model(qdir, packed)->weights.layers[0].o.format, WeightFormat::PackedAffine)
          << GetParam();
    }
    {
      ReferenceGuard guard;
      EXPECT_EQ(all_logits(qdir, packed), exact) << GetParam() << " " << bits << "-bit packed";
    }
    EXPECT_LE(max_abs_diff(all_logits(qdir, packed), q), s_max)
        << GetParam() << " " << bits << "-bit packed";
    const double d = max_abs_diff(q, deq), m = mean_abs_diff(q, deq);
    EXPECT_LE(d, 2 * s_max + 0.05 * spread) << GetParam() << " " << bits << "-bit";
    EXPECT_LE(m, 2 * s_mean + 0.005 * spread) << GetParam() << " " << bits << "-bit";
    std::printf(
        "[ %s %d-bit g32 ] int8 kernels vs dequantized f32: max %.4f, mean %.4f (%.1f%%, %.2f%% "
        "of std %.3f); sensitivity S_max %.4f S_mean %.4f; vs the original f32: max %.4f\n",
        GetParam().c_str(), bits, d, m, 100.0 * d / spread, 100.0 * m / spread, spread, s_max,
        s_mean, max_abs_diff(q, original));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedFixture,
                         ::testing::Values("llama-f32", "qwen2-f32", "qwen3-f32", "gemma3_text-f32",
                                           "gemma3-f32", "gemma4_text-f32", "gemma4-f32",
                                           "ministral3-f32", "mistral3-f32"),
                         [](const auto& info) { return test::fixture_param_name(info.param); });

// On-load quantization (--quantize) produces the same codes as tandem quantize.
TEST(QuantizedModel, OnLoadQuantizationEqualsTandemQuantize) {
  for (const char* name : {"llama-f32", "gemma4_text-f32"}) {
    const std::string fixture = test::fixture_dir(name);
    test::TempDir tmp;
    const std::string qdir = tmp.path() + "/q8";
    ASSERT_EQ(quantize_checkpoint(fixture, qdir, 8, 64).quantized > 0, true);
    LoadOptions o;
    o.quantize_bits = 8;
    o.quantize_group_size = 64;
    auto on_load = load_model(fixture, o);
    EXPECT_TRUE(on_load->weights.layers[0].gate.quantized());
    EXPECT_GT(on_load->owned_bytes, 0u);
    const std::vector<float> want = all_logits(qdir);
    EXPECT_EQ(all_logits(fixture, o), want) << name;
    // Quantized, then packed for the CPU: only the packed copy is kept.
    o.pack_for_cpu = true;
    auto packed = load_model(fixture, o);
    if (cpu::packed_affine_preferred(8)) {
      EXPECT_EQ(packed->weights.layers[0].gate.format, WeightFormat::PackedAffine) << name;
      EXPECT_EQ(packed->owned_bytes, on_load->owned_bytes + test::packed_affine_padding(*packed))
          << name << ": a converted copy was kept";
    }
    // The int8 kernels add the same sums in another order (see
    // LogitsMatchTheDequantizedModel); the dequantized rows are the same.
    EXPECT_LE(max_abs_diff(all_logits(fixture, o), want), 0.25 * stddev(want)) << name;
    ReferenceGuard exact;
    EXPECT_EQ(all_logits(fixture, o), all_logits(qdir)) << name;
  }
}

TEST(QuantizedModel, CliQuantizeFlagRunsEveryCommand) {
  const std::string fixture = test::fixture_dir("qwen3-f32");
  for (const char* q : {"q4", "q8"}) {
    test::CommandResult r =
        test::run_tandem("logits " + fixture + " --ids 1,2,3 --quantize " + std::string(q));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"logits\""), std::string::npos);
    r = test::run_tandem("run " + fixture + " --ids 1,2,3 -n 4 --json --quantize " +
                         std::string(q));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"ids\""), std::string::npos);
  }
  const test::CommandResult bad = test::run_tandem("logits " + fixture + " --ids 1 --quantize q3");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--quantize: \"q3\" is not q4 or q8"), std::string::npos) << bad.err;
}

// ---- MLX per-module overrides --------------------------------------------------

// llama-f32 with layer 0's down_proj at 8 bits (group 64), layer 1's
// gate_proj left in f32 (override false), the rest 4-bit group 32.
std::string write_mixed_checkpoint(const std::string& dir) {
  const std::string fixture = test::fixture_dir("llama-f32");
  const Checkpoint c = Checkpoint::open(fixture);
  const std::string down0 = "model.layers.0.mlp.down_proj", gate1 = "model.layers.1.mlp.gate_proj";
  std::vector<TensorData> tensors;
  for (const std::string& name : c.names()) {
    const TensorView t = c.get(name);
    const std::string module = module_of(name);
    const bool matrix =
        t.shape.size() == 2 && name != module && name.find("norm") == std::string::npos;
    if (!matrix || module == gate1) {
      TensorData d{name, t.dtype, t.shape, {}};
      d.bytes.assign(static_cast<const uint8_t*>(t.data),
                     static_cast<const uint8_t*>(t.data) + t.nbytes());
      tensors.push_back(std::move(d));
      continue;
    }
    const int bits = module == down0 ? 8 : 4, group = module == down0 ? 64 : 32;
    OwnedBuffers owned;
    const WeightMatrix q = quantize_matrix(WeightMatrix{t.dtype, t.data, t.shape[0], t.shape[1]},
                                           bits, group, DType::F32, owned);
    const size_t cb = q.row_bytes() * size_t(q.rows), sb = size_t(q.rows * q.groups()) * 4;
    auto bytes = [](const void* p, size_t n) {
      return std::vector<uint8_t>(static_cast<const uint8_t*>(p),
                                  static_cast<const uint8_t*>(p) + n);
    };
    tensors.push_back({name, DType::U32, {q.rows, q.cols * bits / 32}, bytes(q.data, cb)});
    tensors.push_back({module + ".scales", DType::F32, {q.rows, q.groups()}, bytes(q.scales, sb)});
    tensors.push_back({module + ".biases", DType::F32, {q.rows, q.groups()}, bytes(q.biases, sb)});
  }
  fs::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", tensors);
  std::ifstream f(fixture + "/config.json");
  nlohmann::json config = nlohmann::json::parse(f);
  config["quantization"] = {
      {"group_size", 32}, {"bits", 4}, {down0, {{"group_size", 64}, {"bits", 8}}}, {gate1, false}};
  config["quantization_config"] = config["quantization"];
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

TEST(QuantizedModel, PerModuleOverridesAreHonoured) {
  test::TempDir tmp;
  const std::string dir = write_mixed_checkpoint(tmp.path() + "/mixed");
  auto m = load_model(dir);
  const LayerWeights& l0 = m->weights.layers[0];
  const LayerWeights& l1 = m->weights.layers[1];
  EXPECT_EQ(l0.down.bits, 8);
  EXPECT_EQ(l0.down.group_size, 64);
  EXPECT_EQ(l0.gate.bits, 4);
  EXPECT_EQ(l0.gate.group_size, 32);
  EXPECT_FALSE(l1.gate.quantized());
  EXPECT_EQ(l1.gate.dtype, DType::F32);
  EXPECT_TRUE(m->weights.head.quantized());
  // Against its dequantized copy.
  const std::string deq = tmp.path() + "/deq";
  write_dequantized_copy(dir, test::fixture_dir("llama-f32"), deq);
  const std::vector<float> b = all_logits(deq);
  {
    ReferenceGuard exact;
    EXPECT_LE(max_abs_diff(all_logits(dir), b), 1e-3 * stddev(b));
  }
  EXPECT_LE(mean_abs_diff(all_logits(dir), b), 0.03 * stddev(b));
}

// ---- Malformed input --------------------------------------------------------------

// Rewrites one tensor (or the config) of the mixed checkpoint and returns the
// load error.
std::string load_error_after(
    const std::function<void(std::vector<TensorData>&, nlohmann::json&)>& edit) {
  test::TempDir tmp;
  const std::string src = write_mixed_checkpoint(tmp.path() + "/src");
  const Checkpoint c = Checkpoint::open(src);
  std::vector<TensorData> tensors;
  for (const std::string& name : c.names()) {
    const TensorView t = c.get(name);
    tensors.push_back({name, t.dtype, t.shape,
                       std::vector<uint8_t>(static_cast<const uint8_t*>(t.data),
                                            static_cast<const uint8_t*>(t.data) + t.nbytes())});
  }
  std::ifstream f(src + "/config.json");
  nlohmann::json config = nlohmann::json::parse(f);
  edit(tensors, config);
  const std::string dir = tmp.path() + "/bad";
  fs::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", tensors);
  std::ofstream(dir + "/config.json") << config.dump();
  return error_of([&] { load_model(dir); });
}

TensorData& find(std::vector<TensorData>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

TEST(QuantizedModel, MalformedCheckpointsGetClearErrors) {
  const std::string q0 = "model.layers.0.self_attn.q_proj";
  struct Case {
    const char* what;
    std::function<void(std::vector<TensorData>&, nlohmann::json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"scales of the wrong shape",
       [&](auto& ts, auto&) {
         auto& s = find(ts, q0 + ".scales");
         s.shape = {s.shape[0] / 2, s.shape[1] * 2};
       },
       {q0 + ".scales", "expected shape [64, 64/group_size]"}},
      {"codes not U32",
       [&](auto& ts, auto&) { find(ts, q0 + ".weight").dtype = DType::I32; },
       {q0 + ".weight", "must be U32", "I32"}},
      {"biases missing",
       [&](auto& ts, auto&) {
         ts.erase(std::find_if(ts.begin(), ts.end(),
                               [&](const TensorData& t) { return t.name == q0 + ".biases"; }));
       },
       {q0 + ".biases", "only MLX affine"}},
      {"config disagrees with the shapes",
       [&](auto&, auto& c) { c["quantization"]["bits"] = 8; },
       {"its shapes say 4 bits, group size 32", "config.json's quantization says 8 bits"}},
      {"override false on a quantized module",
       [&](auto&, auto& c) { c["quantization"][q0] = false; },
       {"says module " + q0 + " is not quantized"}},
      {"group size 16",
       [&](auto& ts, auto&) {
         auto& s = find(ts, q0 + ".scales");
         auto& b = find(ts, q0 + ".biases");
         s.shape[1] *= 2;
         b.shape[1] *= 2;
         s.bytes.resize(s.bytes.size() * 2);
         b.bytes.resize(b.bytes.size() * 2);
       },
       {"group size 16 is not supported"}},
      {"unsupported mode",
       [&](auto&, auto& c) { c["quantization"]["mode"] = "mxfp4"; },
       {"mode \"mxfp4\" is not supported"}},
      {"unsupported method",
       [&](auto&, auto& c) {
         c.erase("quantization");
         c["quantization_config"] = {{"quant_method", "gptq"}};
       },
       {"quantization method \"gptq\" is not supported"}},
  };
  for (const Case& c : cases) {
    const std::string err = load_error_after(c.edit);
    ASSERT_FALSE(err.empty()) << c.what << ": loaded without error";
    for (const std::string& e : c.expect)
      EXPECT_NE(err.find(e), std::string::npos) << c.what << ": " << err;
  }
}

TEST(QuantizedModel, QuantizeCommandRejectsBadInput) {
  const std::string fixture = test::fixture_dir("llama-f32");
  test::TempDir tmp;
  auto r = test::run_tandem("quantize " + fixture + " " + tmp.path() + "/a --bits 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--bits must be 4 or 8, got 3"), std::string::npos) << r.err;
  r = test::run_tandem("quantize " + fixture + " " + tmp.path() + "/a --group-size 48");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--group-size must be 32, 64 or 128, got 48"), std::string::npos) << r.err;
  ASSERT_EQ(test::run_tandem("quantize " + fixture + " " + tmp.path() + "/q").exit_code, 0);
  r = test::run_tandem("quantize " + tmp.path() + "/q " + tmp.path() + "/qq");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is already quantized"), std::string::npos) << r.err;
  r = test::run_tandem("quantize " + fixture + " " + fixture);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is the input folder"), std::string::npos) << r.err;
}

// ---- FP8 ----------------------------------------------------------------------------

// The e4m3 value nearest to v (ties to the even code), by search.
uint8_t to_e4m3(float v) {
  uint8_t best = 0;
  float err = INFINITY;
  for (int i = 0; i < 256; ++i) {
    const float f = fp8_e4m3_to_f32(uint8_t(i));
    if (std::isnan(f)) continue;
    const float e = std::fabs(f - v);
    if (e < err || (e == err && (i & 1) == 0)) {
      err = e;
      best = uint8_t(i);
    }
  }
  return best;
}

// llama-f32 with every matrix in FP8 e4m3: weight_scale_inv per block of
// block x block (0: one per tensor). Also writes the expected bf16 checkpoint.
void write_fp8_checkpoint(const std::string& dir, const std::string& bf16_dir, int64_t block) {
  const std::string fixture = test::fixture_dir("llama-f32");
  const Checkpoint c = Checkpoint::open(fixture);
  std::vector<TensorData> fp8, bf16;
  for (const std::string& name : c.names()) {
    const TensorView t = c.get(name);
    const std::string module = module_of(name);
    const auto* v = static_cast<const float*>(t.data);
    if (t.shape.size() != 2 || name == module || name.find("norm") != std::string::npos) {
      TensorData d{name, t.dtype, t.shape,
                   std::vector<uint8_t>(static_cast<const uint8_t*>(t.data),
                                        static_cast<const uint8_t*>(t.data) + t.nbytes())};
      fp8.push_back(d);
      bf16.push_back(d);
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int64_t b0 = block ? block : rows, b1 = block ? block : cols;
    const int64_t sr = (rows + b0 - 1) / b0, sc = (cols + b1 - 1) / b1;
    std::vector<float> scale(size_t(sr * sc));
    for (int64_t i = 0; i < sr; ++i)
      for (int64_t j = 0; j < sc; ++j) {
        float amax = 0;
        for (int64_t r = i * b0; r < std::min(rows, (i + 1) * b0); ++r)
          for (int64_t k = j * b1; k < std::min(cols, (j + 1) * b1); ++k)
            amax = std::max(amax, std::fabs(v[r * cols + k]));
        scale[size_t(i * sc + j)] = amax / 448.0f;
      }
    TensorData w{name, DType::F8_E4M3, t.shape, std::vector<uint8_t>(size_t(rows * cols))};
    TensorData wb{name, DType::BF16, t.shape, std::vector<uint8_t>(size_t(rows * cols) * 2)};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const float s = scale[size_t((r / b0) * sc + k / b1)];
        const uint8_t code = to_e4m3(v[r * cols + k] / s);
        w.bytes[size_t(r * cols + k)] = code;
        const uint16_t h = f32_to_bf16(fp8_e4m3_to_f32(code) * s);
        std::memcpy(wb.bytes.data() + (r * cols + k) * 2, &h, 2);
      }
    fp8.push_back(w);
    bf16.push_back(wb);
    TensorData st{module + ".weight_scale_inv", DType::F32, block ? Shape{sr, sc} : Shape{},
                  std::vector<uint8_t>(scale.size() * 4)};
    std::memcpy(st.bytes.data(), scale.data(), st.bytes.size());
    fp8.push_back(st);
  }
  std::ifstream f(fixture + "/config.json");
  nlohmann::json config = nlohmann::json::parse(f);
  fs::create_directories(bf16_dir);
  write_safetensors(bf16_dir + "/model.safetensors", bf16);
  std::ofstream(bf16_dir + "/config.json") << config.dump(2);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  config["quantization_config"]["weight_block_size"] =
      block ? nlohmann::json::array({block, block}) : nlohmann::json(nullptr);
  fs::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", fp8);
  std::ofstream(dir + "/config.json") << config.dump(2);
}

TEST(QuantizedModel, Fp8CheckpointDequantizesToBf16) {
  for (int64_t block : {int64_t(32), int64_t(0)}) {  // 32x32 blocks; one scale per tensor
    test::TempDir tmp;
    const std::string fp8 = tmp.path() + "/fp8", bf16 = tmp.path() + "/bf16";
    write_fp8_checkpoint(fp8, bf16, block);
    auto m = load_model(fp8);
    EXPECT_EQ(m->weights.layers[0].q.dtype, DType::BF16);
    EXPECT_FALSE(m->weights.layers[0].q.quantized());
    EXPECT_GT(m->owned_bytes, 0u);
    // Bit-identical to the bf16 checkpoint of fp8 · scale_inv.
    EXPECT_EQ(all_logits(fp8), all_logits(bf16)) << "block " << block;
    // And quantizable further, on load or by tandem quantize.
    LoadOptions o;
    o.quantize_bits = 4;
    EXPECT_TRUE(load_model(fp8, o)->weights.layers[0].q.quantized());
    const std::string q = tmp.path() + "/q4";
    EXPECT_GT(quantize_checkpoint(fp8, q, 4, 32).quantized, 0);
    auto mq = load_model(q);
    EXPECT_TRUE(mq->weights.layers[0].q.quantized());
    EXPECT_EQ(mq->weights.layers[0].q.dtype, DType::BF16);  // scales of FP8 sources: bf16
    // And packed for the CPU: a layer matrix's dequantized bf16 copy is
    // dropped once packed (the embedding's stays: it is not packed), same
    // logits up to the summation order.
    LoadOptions packed;
    packed.pack_for_cpu = true;
    auto mp = load_model(fp8, packed);
    EXPECT_EQ(mp->weights.layers[0].q.format, WeightFormat::PackedBf16);
    uint64_t expected = m->owned_bytes;
    for (const LayerWeights& l : mp->weights.layers)
      for (const WeightMatrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
        if (w->format == WeightFormat::PackedBf16)
          expected += w->nbytes() - size_t(w->rows * w->cols) * 2;
    EXPECT_EQ(mp->owned_bytes, expected);
    const std::vector<float> want = all_logits(bf16), got = all_logits(fp8, packed);
    EXPECT_LE(max_abs_diff(want, got), 1e-5 * stddev(want)) << "block " << block;
  }
}

TEST(QuantizedModel, Fp8ScaleOfTheWrongShapeIsAnError) {
  test::TempDir tmp;
  const std::string fp8 = tmp.path() + "/fp8", bf16 = tmp.path() + "/bf16";
  write_fp8_checkpoint(fp8, bf16, 32);
  // Say the blocks are 16x16: the 32x32 scales no longer fit.
  std::ifstream f(fp8 + "/config.json");
  nlohmann::json config = nlohmann::json::parse(f);
  f.close();
  config["quantization_config"]["weight_block_size"] = {16, 16};
  std::ofstream(fp8 + "/config.json") << config.dump();
  const std::string err = error_of([&] { load_model(fp8); });
  EXPECT_NE(err.find("weight_scale_inv\": expected one scale ([] or [1]) or one per 16x16 block"),
            std::string::npos)
      << err;
}

}  // namespace

namespace {

// MLX stores conv weights OHWI; the towers take them as OIHW matrices.
TEST(QuantizedModel, OhwiConvWeightsArePermutedToOihw) {
  const int64_t O = 5, C = 3, K = 4;
  std::vector<float> oihw(size_t(O * C * K * K)), ohwi(oihw.size());
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < K; ++y)
        for (int64_t x = 0; x < K; ++x) {
          const float v = float(o * 1000 + c * 100 + y * 10 + x);
          oihw[size_t(((o * C + c) * K + y) * K + x)] = v;
          ohwi[size_t(((o * K + y) * K + x) * C + c)] = v;
        }
  auto bytes = [](const std::vector<float>& v) {
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                reinterpret_cast<const uint8_t*>(v.data() + v.size()));
  };
  test::TempDir tmp;
  write_safetensors(tmp.path() + "/model.safetensors",
                    {{"a.weight", DType::F32, {O, C, K, K}, bytes(oihw)},
                     {"b.weight", DType::F32, {O, K, K, C}, bytes(ohwi)},
                     {"c.weight", DType::F32, {O, K, C, K}, bytes(ohwi)}});
  const Checkpoint ckpt = Checkpoint::open(tmp.path());
  std::vector<uint8_t> owned_a, owned_b, owned_c;
  const WeightMatrix a = read_conv_weight(ckpt, "a.weight", O, C, K, owned_a);
  const WeightMatrix b = read_conv_weight(ckpt, "b.weight", O, C, K, owned_b);
  EXPECT_TRUE(owned_a.empty());  // OIHW is viewed in place
  ASSERT_EQ(b.rows, O);
  ASSERT_EQ(b.cols, C * K * K);
  EXPECT_EQ(std::memcmp(a.data, b.data, oihw.size() * 4), 0);
  const std::string err = error_of([&] { read_conv_weight(ckpt, "c.weight", O, C, K, owned_c); });
  EXPECT_NE(
      err.find("expected shape [5, 3, 4, 4] (OIHW) or [5, 4, 4, 3] (OHWI), found [5, 4, 3, 4]"),
      std::string::npos)
      << err;
}

}  // namespace
