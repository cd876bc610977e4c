#include "model/quantized.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "core/quant.h"

namespace tandem {

namespace {

// Runs fn(r0, r1) over [0, rows) on the hardware threads.
template <typename Fn>
void parallel_rows(int64_t rows, Fn fn) {
  const int64_t hw = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t n = std::min<int64_t>(hw, std::max<int64_t>(1, rows / 64));
  if (n <= 1) return fn(int64_t(0), rows);
  std::vector<std::thread> threads;
  const int64_t per = (rows + n - 1) / n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r0 = std::min(rows, i * per), r1 = std::min(rows, r0 + per);
    threads.emplace_back([=] { fn(r0, r1); });
  }
  for (auto& t : threads) t.join();
}

int json_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return 0;
  if (!j[key].is_number_integer())
    fail("%s: \"%s\" must be an integer, found %s", where.c_str(), key, j[key].dump().c_str());
  return j[key].get<int>();
}

std::string shape_of(const TensorView& t) {
  return shape_str(t.shape);
}

bool float_dtype(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

std::string module_of(const std::string& name) {
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return name.substr(0, name.size() - suffix.size());
  return name;
}

QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& source) {
  QuantConfig q;
  const nlohmann::json* j = nullptr;
  std::string key;
  for (const char* k : {"quantization", "quantization_config"})
    if (config.contains(k) && !config[k].is_null()) {
      j = &config[k];
      key = k;
      break;
    }
  if (!j) return q;
  const std::string where = source + ": \"" + key + "\"";
  if (!j->is_object()) fail("%s must be an object, found %s", where.c_str(), j->dump().c_str());
  if (j->contains("quant_method")) {
    const std::string method =
        (*j)["quant_method"].is_string() ? (*j)["quant_method"].get<std::string>() : "";
    if (method == "fp8") {
      q.fp8 = true;
      if (j->contains("weight_block_size") && !(*j)["weight_block_size"].is_null()) {
        const auto& b = (*j)["weight_block_size"];
        if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
            !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0)
          fail("%s: weight_block_size must be two positive integers, found %s", where.c_str(),
               b.dump().c_str());
        q.fp8_block[0] = b[0].get<int64_t>();
        q.fp8_block[1] = b[1].get<int64_t>();
      }
      if (j->contains("fmt") && (*j)["fmt"].is_string() && (*j)["fmt"] != "e4m3")
        fail("%s: FP8 format \"%s\" is not supported (e4m3)", where.c_str(),
             (*j)["fmt"].get<std::string>().c_str());
      return q;
    }
    if (!j->contains("bits"))
      fail(
          "%s: quantization method %s is not supported (tandem reads MLX affine and FP8 "
          "checkpoints, and quantizes bf16 ones with --quantize)",
          where.c_str(), (*j)["quant_method"].dump().c_str());
  }
  if (!j->contains("bits") || !j->contains("group_size"))
    fail("%s has no \"bits\" and \"group_size\" (MLX) nor \"quant_method\": \"fp8\"",
         where.c_str());
  if (j->contains("mode") && (*j)["mode"] != "affine")
    fail("%s: mode %s is not supported (MLX \"affine\" quantization only)", where.c_str(),
         (*j)["mode"].dump().c_str());
  q.mlx = true;
  q.bits = json_int(*j, "bits", where);
  q.group_size = json_int(*j, "group_size", where);
  for (const auto& [k, v] : j->items()) {
    if (v.is_boolean() && !v.get<bool>()) {
      q.modules[k] = QuantConfig::Module{false, 0, 0};
    } else if (v.is_object() && (v.contains("bits") || v.contains("group_size"))) {
      const std::string w = where + "[\"" + k + "\"]";
      q.modules[k] =
          QuantConfig::Module{true, json_int(v, "bits", w), json_int(v, "group_size", w)};
    }
  }
  return q;
}

QuantConfig read_quant_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream f(path);
  if (!f) fail("cannot read %s", path.c_str());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON: %s", path.c_str(), e.what());
  }
  return parse_quant_config(j, path);
}

MatrixLoader::MatrixLoader(const Checkpoint& ckpt, QuantConfig config, int quantize_bits,
                           int group_size, OwnedBuffers& owned, uint64_t& owned_bytes)
    : ckpt_(ckpt),
      config_(std::move(config)),
      quantize_bits_(quantize_bits),
      group_size_(group_size),
      owned_(owned),
      owned_bytes_(owned_bytes) {
  if (quantize_bits != 0 && quantize_bits != 4 && quantize_bits != 8)
    fail("quantize: bits must be 4 or 8, got %d", quantize_bits);
  if (quantize_bits != 0 && group_size != 32 && group_size != 64 && group_size != 128)
    fail("quantize: group size must be 32, 64 or 128, got %d", group_size);
}

uint8_t* MatrixLoader::allocate(size_t bytes) {
  owned_.push_back(allocate_owned(bytes));
  owned_bytes_ += bytes;
  return owned_.back().get();
}

WeightMatrix view_affine(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                         int64_t cols) {
  const std::string module = module_of(name);
  const std::string file = ckpt.file_of(module + ".scales");
  if (!ckpt.has(name))
    fail("%s: %s.scales exists but the quantized weight %s is missing", file.c_str(),
         module.c_str(), name.c_str());
  if (!ckpt.has(module + ".biases"))
    fail(
        "%s: %s.scales has no %s.biases beside it: only MLX affine quantization (scales and "
        "biases) is supported",
        file.c_str(), module.c_str(), module.c_str());
  const TensorView wt = ckpt.get(name), sc = ckpt.get(module + ".scales"),
                   bi = ckpt.get(module + ".biases");
  if (wt.dtype != DType::U32)
    fail("tensor \"%s\" in %s: a quantized weight must be U32 (packed codes), found %s",
         name.c_str(), file.c_str(), std::string(dtype_name(wt.dtype)).c_str());
  if (wt.shape.size() != 2 || wt.shape[0] != rows || wt.shape[1] <= 0 ||
      (wt.shape[1] * 32) % cols != 0)
    fail(
        "tensor \"%s\" in %s: expected packed codes of shape [%lld, %lld·bits/32] for a [%lld, "
        "%lld] matrix, found %s",
        name.c_str(), file.c_str(), (long long)rows, (long long)cols, (long long)rows,
        (long long)cols, shape_of(wt).c_str());
  const int bits = int(wt.shape[1] * 32 / cols);
  if (sc.shape.size() != 2 || sc.shape[0] != rows || sc.shape[1] <= 0 || cols % sc.shape[1] != 0)
    fail("tensor \"%s.scales\" in %s: expected shape [%lld, %lld/group_size], found %s",
         module.c_str(), file.c_str(), (long long)rows, (long long)cols, shape_of(sc).c_str());
  if (bi.shape != sc.shape || bi.dtype != sc.dtype)
    fail("tensor \"%s.biases\" in %s: expected %s %s like the scales, found %s %s", module.c_str(),
         ckpt.file_of(module + ".biases").c_str(), std::string(dtype_name(sc.dtype)).c_str(),
         shape_of(sc).c_str(), std::string(dtype_name(bi.dtype)).c_str(), shape_of(bi).c_str());
  const int group = int(cols / sc.shape[1]);
  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = sc.dtype;
  w.data = wt.data;
  w.rows = rows;
  w.cols = cols;
  w.bits = bits;
  w.group_size = group;
  w.scales = sc.data;
  w.biases = bi.data;
  check_affine(w, ("tensor \"" + name + "\" in " + file).c_str());
  return w;
}

WeightMatrix MatrixLoader::affine(const std::string& name, const std::string& module, int64_t rows,
                                  int64_t cols) {
  const WeightMatrix w = view_affine(ckpt_, name, rows, cols);
  const int bits = w.bits, group = w.group_size;
  const std::string file = ckpt_.file_of(name);
  // The config must agree where it speaks.
  auto it = config_.modules.find(module);
  if (it != config_.modules.end() && !it->second.quantized)
    fail("%s: config.json says module %s is not quantized, but %s.scales exists", file.c_str(),
         module.c_str(), module.c_str());
  const int want_bits =
      it != config_.modules.end() && it->second.bits ? it->second.bits : config_.bits;
  const int want_group = it != config_.modules.end() && it->second.group_size
                             ? it->second.group_size
                             : config_.group_size;
  if (config_.mlx && (want_bits != bits || want_group != group))
    fail(
        "tensor \"%s\" in %s: its shapes say %d bits, group size %d, but config.json's "
        "quantization says %d bits, group size %d for %s",
        name.c_str(), file.c_str(), bits, group, want_bits, want_group, module.c_str());
  return w;
}

void dequantize_fp8(const TensorView& weight, const TensorView& scale_inv, const int64_t block[2],
                    const std::string& name, uint16_t* dst) {
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  if (!float_dtype(scale_inv.dtype))
    fail("tensor \"%s_scale_inv\": dtype %s (expected F32, F16 or BF16)", name.c_str(),
         std::string(dtype_name(scale_inv.dtype)).c_str());
  int64_t b0 = block[0] ? block[0] : 128, b1 = block[1] ? block[1] : 128;
  const bool per_tensor = scale_inv.numel() == 1;
  if (!per_tensor) {
    const int64_t want0 = (rows + b0 - 1) / b0, want1 = (cols + b1 - 1) / b1;
    if (scale_inv.shape != Shape{want0, want1})
      fail(
          "tensor \"%s_scale_inv\": expected one scale ([] or [1]) or one per %lldx%lld block "
          "([%lld, %lld]) for a [%lld, %lld] weight, found %s",
          name.c_str(), (long long)b0, (long long)b1, (long long)want0, (long long)want1,
          (long long)rows, (long long)cols, shape_str(scale_inv.shape).c_str());
  }
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = fp8_e4m3_to_f32(uint8_t(i));
  const auto* src = static_cast<const uint8_t*>(weight.data);
  const int64_t scols = per_tensor ? 1 : (cols + b1 - 1) / b1;
  parallel_rows(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s =
            per_tensor ? load_as_f32(scale_inv.data, scale_inv.dtype, 0)
                       : load_as_f32(scale_inv.data, scale_inv.dtype, (r / b0) * scols + c / b1);
        dst[r * cols + c] = f32_to_bf16(lut[src[r * cols + c]] * s);
      }
  });
}

WeightMatrix MatrixLoader::fp8(const std::string& name, const std::string& module, int64_t rows,
                               int64_t cols) {
  const TensorView wt = ckpt_.get(name);
  std::string scale_name;
  for (const char* suffix : {".weight_scale_inv", ".weight_scale"})
    if (ckpt_.has(module + suffix)) {
      scale_name = module + suffix;
      break;
    }
  if (scale_name.empty())
    fail("tensor \"%s\" in %s is FP8 (F8_E4M3) but %s.weight_scale_inv is missing", name.c_str(),
         ckpt_.file_of(name).c_str(), module.c_str());
  const TensorView sc = ckpt_.get(scale_name);
  auto* dst = reinterpret_cast<uint16_t*>(allocate(size_t(rows * cols) * 2));
  dequantize_fp8(wt, sc, config_.fp8_block, name, dst);
  release_pages(wt.data, wt.nbytes());
  return WeightMatrix{DType::BF16, dst, rows, cols};
}

WeightMatrix MatrixLoader::load(const std::string& name, int64_t rows, int64_t cols,
                                bool packable) {
  WeightMatrix w = convert(name, rows, cols, packable);
  if (progress_) progress_(ckpt_.has(name) ? ckpt_.get(name).nbytes() : w.nbytes());
  return w;
}

WeightMatrix MatrixLoader::convert(const std::string& name, int64_t rows, int64_t cols,
                                   bool packable) {
  const std::string module = module_of(name);
  WeightMatrix w;
  bool mapped = false;  // dense, viewing the checkpoint
  if (ckpt_.has(module + ".scales")) {
    w = affine(name, module, rows, cols);
  } else {
    const TensorView t = ckpt_.require(name, {rows, cols});
    if (t.dtype == DType::F8_E4M3) {
      w = fp8(name, module, rows, cols);
    } else if (float_dtype(t.dtype)) {
      w = WeightMatrix{t.dtype, t.data, rows, cols};
      mapped = true;
    } else {
      fail(
          "tensor \"%s\" in %s: dtype %s is not supported (F32, F16, BF16, F8_E4M3 with "
          "weight_scale_inv, or MLX-quantized U32 with .scales and .biases)",
          name.c_str(), ckpt_.file_of(name).c_str(), std::string(dtype_name(t.dtype)).c_str());
    }
  }
  if (quantize_bits_ > 0 && !w.quantized() && cols % group_size_ == 0) {
    // On-load quantization: scales in the weight's own dtype (bf16 for FP8).
    const WeightMatrix q =
        quantize_matrix(w, quantize_bits_, group_size_, w.dtype, owned_, &owned_bytes_, mapped);
    drop_source(w, owned_, owned_bytes_);
    w = q;
  }
  return pack_ && packable ? pack_for_cpu(w, owned_, owned_bytes_) : w;
}

void drop_source(const WeightMatrix& src, OwnedBuffers& owned, uint64_t& owned_bytes) {
  // Frees the owned buffer that starts at p, else releases the mapped range.
  auto drop = [&](const void* p, size_t bytes) {
    for (auto it = owned.begin(); it != owned.end(); ++it)
      if (it->get() == p) {
        owned_bytes -= bytes;
        owned.erase(it);
        return;
      }
    release_pages(p, bytes);
  };
  if (!src.quantized()) return drop(src.data, src.nbytes());
  const size_t codes = src.row_bytes() * size_t(src.stored_rows());
  const size_t scales = size_t(src.stored_rows() * src.groups()) * dtype_size(src.dtype);
  const auto* base = static_cast<const uint8_t*>(src.data);
  if (src.scales == base + codes && src.biases == base + codes + scales)
    return drop(base, codes + 2 * scales);  // one buffer (quantize_matrix's, a packed copy)
  drop(src.data, codes);  // separate buffers (GGUF's), or tensors of a mapped checkpoint
  drop(src.scales, scales);
  drop(src.biases, scales);
}

WeightMatrix pack_matrix(const WeightMatrix& dense, OwnedBuffers& owned, uint64_t& owned_bytes) {
  WeightMatrix p = cpu::packed_bf16_view(dense, nullptr);
  owned.push_back(allocate_owned(p.nbytes()));
  owned_bytes += p.nbytes();
  p.data = owned.back().get();
  const int64_t blocks = p.stored_rows() / 16;
  parallel_rows(blocks, [&](int64_t b0, int64_t b1) {
    cpu::pack_bf16_rows16(dense, const_cast<void*>(p.data), b0, b1);
  });
  return p;
}

void keep_head_resident(WeightMatrix& head, WeightMatrix& embed, OwnedBuffers& owned,
                        uint64_t& owned_bytes) {
  if (head.format != WeightFormat::Dense || head.data == nullptr) return;
  for (const OwnedBuffer& b : owned)
    if (b.get() == head.data) return;  // converted at load: already on huge pages
  const bool tied = embed.data == head.data;
  WeightMatrix copy = head;
  owned.push_back(allocate_owned(head.nbytes()));
  owned_bytes += head.nbytes();
  copy.data = owned.back().get();
  const size_t row = head.row_bytes();
  parallel_rows(head.rows, [&](int64_t r0, int64_t r1) {
    std::memcpy(owned.back().get() + size_t(r0) * row,
                static_cast<const uint8_t*>(head.data) + size_t(r0) * row, size_t(r1 - r0) * row);
  });
  release_pages(head.data, head.nbytes());
  head = copy;
  if (tied) embed = copy;
}

WeightMatrix pack_affine_matrix(const WeightMatrix& affine, OwnedBuffers& owned,
                                uint64_t& owned_bytes) {
  WeightMatrix p = cpu::packed_affine_view(affine, nullptr);
  owned.push_back(allocate_owned(p.nbytes()));
  owned_bytes += p.nbytes();
  p = cpu::packed_affine_view(affine, owned.back().get());
  parallel_rows(p.stored_rows() / 16,
                [&](int64_t b0, int64_t b1) { cpu::pack_affine_rows16(affine, p, b0, b1); });
  return p;
}

WeightMatrix pack_for_cpu(const WeightMatrix& w, OwnedBuffers& owned, uint64_t& owned_bytes) {
  WeightMatrix p;
  if (w.format == WeightFormat::Dense && w.dtype == DType::BF16 && w.cols % 2 == 0)
    p = pack_matrix(w, owned, owned_bytes);
  else if (w.format == WeightFormat::Affine && cpu::packed_affine_preferred(w.bits))
    p = pack_affine_matrix(w, owned, owned_bytes);
  else
    return w;
  drop_source(w, owned, owned_bytes);
  return p;
}

WeightMatrix quantize_matrix(const WeightMatrix& src, int bits, int group_size, DType scale_dtype,
                             OwnedBuffers& owned, uint64_t* owned_bytes, bool release_source) {
  if (src.cols % group_size != 0)
    fail("quantize: group size %d does not divide the row length %lld", group_size,
         (long long)src.cols);
  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = scale_dtype;
  w.rows = src.rows;
  w.cols = src.cols;
  w.bits = bits;
  w.group_size = group_size;
  check_affine(w, "quantize");
  const size_t code_bytes = w.row_bytes() * size_t(w.rows);
  const size_t scale_bytes = size_t(w.rows * w.groups()) * dtype_size(scale_dtype);
  owned.push_back(allocate_owned(code_bytes + 2 * scale_bytes));
  uint8_t* base = owned.back().get();
  if (owned_bytes) *owned_bytes += code_bytes + 2 * scale_bytes;
  w.data = base;
  w.scales = base + code_bytes;
  w.biases = base + code_bytes + scale_bytes;
  const size_t sb = dtype_size(scale_dtype);
  // A dense source (a mapped checkpoint tensor) is handed back every 256
  // rows, so a large table is never resident in full beside its codes.
  const bool release = release_source && src.format == WeightFormat::Dense;
  const size_t src_row = src.row_bytes();
  parallel_rows(w.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = r0; r < r1; ++r) {
      if (release && r > r0 && (r - r0) % 256 == 0)
        release_pages(static_cast<const uint8_t*>(src.data) + size_t(r - 256) * src_row,
                      256 * src_row);
      dequantize_row(src, r, row.data());
      affine_quantize_row(row.data(), w.cols, bits, group_size, scale_dtype,
                          reinterpret_cast<uint32_t*>(base + size_t(r) * w.row_bytes()),
                          base + code_bytes + size_t(r * w.groups()) * sb,
                          base + code_bytes + scale_bytes + size_t(r * w.groups()) * sb);
    }
  });
  return w;
}

WeightMatrix read_conv_weight(const Checkpoint& ckpt, const std::string& name, int64_t out,
                              int64_t in, int64_t k, std::vector<uint8_t>& owned) {
  const TensorView t = ckpt.get(name);
  if (!float_dtype(t.dtype))
    fail("tensor \"%s\" in %s: dtype %s is not supported (F32, F16, BF16)", name.c_str(),
         ckpt.file_of(name).c_str(), std::string(dtype_name(t.dtype)).c_str());
  if (t.shape == Shape{out, in, k, k}) return WeightMatrix{t.dtype, t.data, out, in * k * k};
  if (t.shape != Shape{out, k, k, in})
    fail("tensor \"%s\" in %s: expected shape %s (OIHW) or %s (OHWI), found %s", name.c_str(),
         ckpt.file_of(name).c_str(), shape_str({out, in, k, k}).c_str(),
         shape_str({out, k, k, in}).c_str(), shape_str(t.shape).c_str());
  const size_t es = dtype_size(t.dtype);
  owned.resize(size_t(t.numel()) * es);
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t y = 0; y < k; ++y)
      for (int64_t x = 0; x < k; ++x)
        for (int64_t c = 0; c < in; ++c)
          std::memcpy(owned.data() + size_t(((o * in + c) * k + y) * k + x) * es,
                      src + size_t(((o * k + y) * k + x) * in + c) * es, es);
  return WeightMatrix{t.dtype, owned.data(), out, in * k * k};
}

void release_pages(const void* data, size_t bytes) {
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace tandem
