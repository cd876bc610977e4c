#include "model/quantize_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/quant.h"
#include "model/quantized.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool float_dtype(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// The FP8 companions of module M (dropped: the weight is converted).
bool fp8_companion(const std::string& name) {
  for (const char* s : {".weight_scale_inv", ".weight_scale", ".activation_scale", ".input_scale"})
    if (ends_with(name, s)) return true;
  return false;
}

TensorData copy_of(const std::string& name, const TensorView& t) {
  TensorData d{name, t.dtype, t.shape, {}};
  d.bytes.resize(t.nbytes());
  if (t.nbytes()) std::memcpy(d.bytes.data(), t.data, t.nbytes());
  return d;
}

}  // namespace

QuantizeStats quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, int bits,
                                  int group_size) {
  if (bits != 4 && bits != 8) fail("--bits must be 4 or 8, got %d", bits);
  if (group_size != 32 && group_size != 64 && group_size != 128)
    fail("--group-size must be 32, 64 or 128, got %d", group_size);
  std::error_code ec;
  if (fs::exists(out_dir) && fs::equivalent(in_dir, out_dir, ec))
    fail("the output folder %s is the input folder", out_dir.c_str());

  const std::string config_path = in_dir + "/config.json";
  std::ifstream cf(config_path);
  if (!cf) fail("cannot read %s", config_path.c_str());
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(cf);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON: %s", config_path.c_str(), e.what());
  }
  const QuantConfig qc = parse_quant_config(nlohmann::json::parse(config.dump()), config_path);
  if (qc.mlx)
    fail("%s is already quantized (config.json has MLX \"quantization\": %d bits, group %d)",
         in_dir.c_str(), qc.bits, qc.group_size);

  const Checkpoint ckpt = Checkpoint::open(in_dir);
  QuantizeStats st;
  std::vector<TensorData> out;
  for (const std::string& name : ckpt.names()) {
    if (ends_with(name, ".scales"))
      fail("%s is already quantized (tensor %s)", in_dir.c_str(), name.c_str());
    if (fp8_companion(name)) continue;
    const TensorView t = ckpt.get(name);
    st.bytes_in += t.nbytes();
    const bool fp8 = t.dtype == DType::F8_E4M3;
    const bool matrix = t.shape.size() == 2 && ends_with(name, ".weight") &&
                        (float_dtype(t.dtype) || fp8) && !is_vision_tensor(name) &&
                        name.find("norm") == std::string::npos;
    const std::string module = module_of(name);
    WeightMatrix src{t.dtype, t.data, matrix || fp8 ? t.shape[0] : 0,
                     matrix || fp8 ? t.shape[1] : 0};
    std::vector<uint16_t> bf16;
    if (fp8) {
      if (t.shape.size() != 2) fail("tensor \"%s\": an FP8 tensor must be 2-D", name.c_str());
      std::string scale = module + ".weight_scale_inv";
      if (!ckpt.has(scale)) scale = module + ".weight_scale";
      if (!ckpt.has(scale))
        fail("tensor \"%s\" is FP8 (F8_E4M3) but %s.weight_scale_inv is missing", name.c_str(),
             module.c_str());
      bf16.resize(size_t(t.numel()));
      dequantize_fp8(t, ckpt.get(scale), qc.fp8_block, name, bf16.data());
      src = WeightMatrix{DType::BF16, bf16.data(), t.shape[0], t.shape[1]};
    }
    if (!matrix || t.shape[1] % group_size != 0) {
      if (fp8) {
        TensorView v{DType::BF16, t.shape, bf16.data()};
        out.push_back(copy_of(name, v));
      } else {
        out.push_back(copy_of(name, t));
      }
      ++st.kept;
      st.bytes_out += out.back().bytes.size();
      continue;
    }
    OwnedBuffers owned;
    const WeightMatrix q = quantize_matrix(src, bits, group_size, src.dtype, owned);
    const size_t code_bytes = q.row_bytes() * size_t(q.rows);
    const size_t scale_bytes = size_t(q.rows * q.groups()) * dtype_size(q.dtype);
    TensorData codes{name, DType::U32, {q.rows, q.cols * bits / 32}, {}};
    codes.bytes.assign(static_cast<const uint8_t*>(q.data),
                       static_cast<const uint8_t*>(q.data) + code_bytes);
    TensorData scales{module + ".scales", q.dtype, {q.rows, q.groups()}, {}};
    scales.bytes.assign(static_cast<const uint8_t*>(q.scales),
                        static_cast<const uint8_t*>(q.scales) + scale_bytes);
    TensorData biases{module + ".biases", q.dtype, {q.rows, q.groups()}, {}};
    biases.bytes.assign(static_cast<const uint8_t*>(q.biases),
                        static_cast<const uint8_t*>(q.biases) + scale_bytes);
    st.bytes_out += code_bytes + 2 * scale_bytes;
    out.push_back(std::move(codes));
    out.push_back(std::move(scales));
    out.push_back(std::move(biases));
    ++st.quantized;
  }

  fs::create_directories(out_dir);
  write_safetensors(out_dir + "/model.safetensors", out, {{"format", "mlx"}});
  out.clear();

  const nlohmann::ordered_json quant = {
      {"group_size", group_size}, {"bits", bits}, {"mode", "affine"}};
  config.erase("quantization_config");
  config["quantization"] = quant;
  config["quantization_config"] = quant;
  {
    std::ofstream f(out_dir + "/config.json");
    f << config.dump(2) << "\n";
    if (!f) fail("cannot write %s/config.json", out_dir.c_str());
  }
  for (const auto& e : fs::directory_iterator(in_dir)) {
    const std::string file = e.path().filename().string();
    if (!e.is_regular_file() || file == "config.json" || ends_with(file, ".safetensors") ||
        file == "model.safetensors.index.json")
      continue;
    fs::copy_file(e.path(), fs::path(out_dir) / file, fs::copy_options::overwrite_existing, ec);
    if (ec)
      fail("cannot copy %s to %s: %s", e.path().c_str(), out_dir.c_str(), ec.message().c_str());
  }
  return st;
}

}  // namespace tandem
