// Image encodes through a vision tower at a real model's shapes, on the GPU
// (backend/cuda/vision_ops.h) and optionally the CPU:
//
//   bench_cuda_vision [--family gemma3|gemma4|pixtral|all] [--runs 5] [--cpu]
//                     [--threads N]
//
// Writes a random bf16 checkpoint of the tower and projector to a temporary
// folder (kept, reused by later runs): gemma3 is SigLIP-so400m at 896 px
// (gemma-3-4b's tower: 27 layers, 4096 patches, 256 soft tokens, text width
// 2560); gemma4 is gemma-4-e2b's (16 layers of 768; a 1024 x 1024 image
// gives 256 soft tokens: 2304 patches); pixtral is Ministral 3's (24 layers of 1024, a 1540 x 1540
// image: 12100 patches, 3025 soft tokens, text width 3072). Encodes a gray
// image of the family's largest size `runs` times after one warm-up and
// prints one JSON line per device: ms per image, soft tokens/s and
// TFLOP/s (2 · params · patches for the matmuls plus 4 · patches² · width
// for attention). --profile then times one more GPU encode op by op
// (stderr).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/vision_ops.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

using namespace tandem;
using nlohmann::json;

namespace {

struct Tower {
  json config;
  std::vector<std::pair<std::string, Shape>> tensors;
  int image = 0;  // the gray image's side in pixels
  // Per encode of `tokens` soft tokens.
  std::function<double(double tokens)> flops;
  int64_t text_hidden = 0;  // the language model's width
};

void add(Tower& t, const std::string& name, Shape shape) {
  t.tensors.emplace_back(name, std::move(shape));
}

// A layer's q/k/v/o projections [H, H] and gated MLP (gate, up [F, H],
// down [H, F]): names `attn` + "q_proj" + `suffix`, `mlp` + "gate_proj" +
// `suffix`.
void add_projections(Tower& t, const std::string& attn, const std::string& mlp,
                     const std::string& suffix, int64_t H, int64_t F) {
  for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) add(t, attn + n + suffix, {H, H});
  add(t, mlp + "gate_proj" + suffix, {F, H});
  add(t, mlp + "up_proj" + suffix, {F, H});
  add(t, mlp + "down_proj" + suffix, {H, F});
}

// vision_config's sizes every family has.
json vision_sizes(int64_t H, int64_t F, int64_t L, int64_t heads, int64_t P) {
  return {{"hidden_size", H},
          {"intermediate_size", F},
          {"num_hidden_layers", L},
          {"num_attention_heads", heads},
          {"patch_size", P}};
}

// 2 · m · k · n for a [n, k] x [k, m] product.
double mm(double n, double k, double m) {
  return 2 * n * k * m;
}

Tower gemma3() {
  Tower t;
  const int64_t H = 1152, F = 4304, L = 27, D = 2560, P = 14, N = 4096, heads = 16;
  t.text_hidden = D;
  t.image = 896;
  t.config = {{"model_type", "gemma3"},
              {"mm_tokens_per_image", 256},
              {"text_config", {{"hidden_size", D}}},
              {"vision_config", vision_sizes(H, F, L, heads, P)}};
  t.config["vision_config"]["image_size"] = 896;
  const std::string p = "vision_tower.vision_model.";
  add(t, p + "embeddings.patch_embedding.weight", {H, 3, P, P});
  add(t, p + "embeddings.patch_embedding.bias", {H});
  add(t, p + "embeddings.position_embedding.weight", {N, H});
  for (int64_t i = 0; i < L; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    for (const char* n : {"layer_norm1", "layer_norm2"}) {
      add(t, l + n + ".weight", {H});
      add(t, l + n + ".bias", {H});
    }
    for (const char* n : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      add(t, l + "self_attn." + n + ".weight", {H, H});
      add(t, l + "self_attn." + n + ".bias", {H});
    }
    add(t, l + "mlp.fc1.weight", {F, H});
    add(t, l + "mlp.fc1.bias", {F});
    add(t, l + "mlp.fc2.weight", {H, F});
    add(t, l + "mlp.fc2.bias", {H});
  }
  add(t, p + "post_layernorm.weight", {H});
  add(t, p + "post_layernorm.bias", {H});
  add(t, "multi_modal_projector.mm_soft_emb_norm.weight", {H});
  add(t, "multi_modal_projector.mm_input_projection_weight", {H, D});
  t.flops = [=](double T) {
    return mm(N, 3 * P * P, H) + L * (mm(N, H, 4 * H) + mm(N, H, 2 * F) + 4.0 * N * N * H) +
           mm(T, H, D);
  };
  return t;
}

Tower gemma4() {
  Tower t;
  const int64_t H = 768, F = 3072, L = 16, D = 1536, P = 16, heads = 12, Dh = 64;
  t.text_hidden = D;
  t.image = 1024;  // the processor resizes it to 48 x 48 patches: 256 soft tokens
  t.config = {{"model_type", "gemma4"},
              {"text_config", {{"hidden_size", D}}},
              {"vision_config", vision_sizes(H, F, L, heads, P)}};
  json& vc = t.config["vision_config"];
  vc["num_key_value_heads"] = heads;
  vc["head_dim"] = Dh;
  vc["pooling_kernel_size"] = 3;
  vc["position_embedding_size"] = 10240;
  const std::string p = "model.vision_tower.";
  add(t, p + "patch_embedder.input_proj.weight", {H, 3 * P * P});
  add(t, p + "patch_embedder.position_embedding_table", {2, 10240, H});
  for (int64_t i = 0; i < L; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      add(t, l + n + ".weight", {H});
    add(t, l + "self_attn.q_norm.weight", {Dh});
    add(t, l + "self_attn.k_norm.weight", {Dh});
    add_projections(t, l + "self_attn.", l + "mlp.", ".linear.weight", H, F);
  }
  add(t, "model.embed_vision.embedding_projection.weight", {D, H});
  t.flops = [=](double T) {
    const double N = 9 * T;  // 3 x 3 patches pool into one soft token
    return mm(N, 3 * P * P, H) + L * (mm(N, H, 4 * H) + mm(N, H, 3 * F) + 4.0 * N * N * H) +
           mm(T, H, D);
  };
  return t;
}

Tower pixtral() {
  Tower t;
  const int64_t H = 1024, F = 4096, L = 24, D = 3072, P = 14, heads = 16;
  t.text_hidden = D;
  t.image = 1540;
  t.config = {{"model_type", "mistral3"},
              {"spatial_merge_size", 2},
              {"text_config", {{"hidden_size", D}, {"rms_norm_eps", 1e-5}}},
              {"vision_config", vision_sizes(H, F, L, heads, P)}};
  json& vc = t.config["vision_config"];
  vc["head_dim"] = 64;
  vc["image_size"] = 1540;
  vc["rope_theta"] = 10000.0;
  const std::string p = "vision_tower.";
  add(t, p + "patch_conv.weight", {H, 3, P, P});
  add(t, p + "ln_pre.weight", {H});
  for (int64_t i = 0; i < L; ++i) {
    const std::string l = p + "transformer.layers." + std::to_string(i) + ".";
    add(t, l + "attention_norm.weight", {H});
    add(t, l + "ffn_norm.weight", {H});
    add_projections(t, l + "attention.", l + "feed_forward.", ".weight", H, F);
  }
  const std::string m = "multi_modal_projector.";
  add(t, m + "norm.weight", {H});
  add(t, m + "patch_merger.merging_layer.weight", {H, 4 * H});
  add(t, m + "linear_1.weight", {D, H});
  add(t, m + "linear_2.weight", {D, D});
  t.flops = [=](double T) {
    const double N = 4 * T;  // 2 x 2 patches merge into one soft token
    return mm(N, 3 * P * P, H) + L * (mm(N, H, 4 * H) + mm(N, H, 3 * F) + 4.0 * N * N * H) +
           mm(T, 4 * H, H) + mm(T, H, D) + mm(T, D, D);
  };
  return t;
}

// Writes the tower's checkpoint (bf16, normal values of std 0.02; norm
// weights near 1) unless the folder has it already.
std::string write_tower(const std::string& family, const Tower& t) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("tandem-bench-vision-" + family)).string();
  if (std::filesystem::exists(dir + "/model.safetensors")) return dir;
  std::filesystem::create_directories(dir);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<TensorData> tensors;
  for (const auto& [name, shape] : t.tensors) {
    TensorData d{name, DType::BF16, shape, {}};
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    d.bytes.resize(size_t(n) * 2);
    const bool norm = name.find("norm") != std::string::npos && shape.size() == 1;
    auto* out = reinterpret_cast<uint16_t*>(d.bytes.data());
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16((norm ? 1.f : 0.f) + normal(rng));
    tensors.push_back(std::move(d));
  }
  write_safetensors(dir + "/model.safetensors", tensors);
  std::ofstream(dir + "/config.json") << t.config.dump(2);
  return dir;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --profile: forwards every op to `inner` and waits for it (a download of
// nothing synchronizes), summing wall time per op kind. The waits add a few
// microseconds per op, and let the stream-ordered memory pool return its
// memory, so ops that allocate scratch (attention) redo it: their
// synchronized times overstate what they take in an unprofiled encode.
class ProfilingOps : public VisionOps {
 public:
  explicit ProfilingOps(std::unique_ptr<VisionOps> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  VisionBuffer alloc(int64_t n) override { return inner_->alloc(n); }
  void upload(const float* h, int64_t n, float* d) override {
    timed("upload", [&] { inner_->upload(h, n, d); });
  }
  void download(const float* s, int64_t n, float* h) override {
    timed("download", [&] { inner_->download(s, n, h); });
  }
  void copy(const float* s, int64_t n, float* d) override {
    timed("copy", [&] { inner_->copy(s, n, d); });
  }
  const float* param(const std::vector<float>& h) override { return inner_->param(h); }
  void matmul(const float* x, int64_t n, const WeightMatrix& w, const float* b, float* y) override {
    timed("matmul", [&] { inner_->matmul(x, n, w, b, y); });
  }
  void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t d, float e,
                 float* y) override {
    timed("layernorm", [&] { inner_->layernorm(x, w, b, n, d, e, y); });
  }
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t d, float e, float* y) override {
    timed("rmsnorm", [&] { inner_->rmsnorm(x, w, n, d, e, y); });
  }
  void activate(VisionAct a, float* x, const float* up, int64_t n) override {
    timed("activate", [&] { inner_->activate(a, x, up, n); });
  }
  void add(float* y, const float* x, int64_t n) override {
    timed("add", [&] { inner_->add(y, x, n); });
  }
  void clamp(float* x, int64_t n, float lo, float hi) override {
    timed("clamp", [&] { inner_->clamp(x, n, lo, hi); });
  }
  void scale_shift(float* x, int64_t n, int64_t d, float m, const float* s,
                   const float* v) override {
    timed("scale_shift", [&] { inner_->scale_shift(x, n, d, m, s, v); });
  }
  void rope(float* x, int64_t n, int64_t h, int64_t d, int64_t s, const float* c,
            const float* sn) override {
    timed("rope", [&] { inner_->rope(x, n, h, d, s, c, sn); });
  }
  void attention(const float* q, const float* k, const float* v, int64_t n, int64_t h, int64_t kv,
                 int64_t d, float sc, float* o) override {
    timed("attention", [&] { inner_->attention(q, k, v, n, h, kv, d, sc, o); });
  }
  void pool_grid(const float* x, int64_t r, int64_t c, int64_t d, int64_t k, float* y) override {
    timed("pool_grid", [&] { inner_->pool_grid(x, r, c, d, k, y); });
  }
  void merge_grid(const float* x, int64_t r, int64_t c, int64_t d, int64_t m, float* y) override {
    timed("merge_grid", [&] { inner_->merge_grid(x, r, c, d, m, y); });
  }

  void reset() { times_.clear(); }
  // "op ms share calls" per kind, the most time first.
  std::string report() const {
    std::vector<std::pair<std::string, std::pair<double, int>>> v(times_.begin(), times_.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (auto& e : v) total += e.second.first;
    std::string out;
    char line[128];
    for (auto& [op, t] : v) {
      std::snprintf(line, sizeof line, "  %-12s %9.3f ms %5.1f%% %6d calls\n", op.c_str(),
                    t.first * 1e3, 100 * t.first / total, t.second);
      out += line;
    }
    return out;
  }

 private:
  template <class F>
  void timed(const char* op, F&& f) {
    inner_->download(nullptr, 0, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    inner_->download(nullptr, 0, nullptr);
    auto& e = times_[op];
    e.first += seconds_since(t0);
    ++e.second;
  }
  std::unique_ptr<VisionOps> inner_;
  std::map<std::string, std::pair<double, int>> times_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string family = "all";
  int runs = 5, threads = 0;
  bool cpu = false, profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--family" && i + 1 < argc)
      family = argv[++i];
    else if (a == "--runs" && i + 1 < argc)
      runs = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--cpu")
      cpu = true;
    else if (a == "--profile")
      profile = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda_vision [--family gemma3|gemma4|pixtral|all] [--runs N] "
                   "[--cpu] [--threads N] [--profile]\n");
      return 2;
    }
  }
  try {
    ThreadPool pool(threads);
    for (const char* name : {"gemma3", "gemma4", "pixtral"}) {
      if (family != "all" && family != name) continue;
      const Tower t = std::string(name) == "gemma3"   ? gemma3()
                      : std::string(name) == "gemma4" ? gemma4()
                                                      : pixtral();
      const std::string dir = write_tower(name, t);
      // The tower reads only its own tensors and config.json; the model's
      // spec stands in for a text model of the right width.
      Model model;
      model.checkpoint = Checkpoint::open(dir);
      model.spec.hidden = t.text_hidden;
      Image gray;
      gray.width = gray.height = t.image;
      gray.rgb.assign(size_t(3) * size_t(t.image) * size_t(t.image), 128);
      for (bool on_gpu : {true, false}) {
        if (!on_gpu && !cpu) continue;
        auto tower = VisionTower::load(model);
        if (on_gpu) {
          try {
            tower->run_on(cuda::cuda_vision_ops(0));
          } catch (const std::exception& e) {  // no GPU here: the CPU figure alone
            std::fprintf(stderr, "bench_cuda_vision: no GPU run: %s\n", e.what());
            continue;
          }
        }
        const PreparedImage image = tower->prepare(gray);
        std::vector<float> out(size_t(image.tokens * t.text_hidden));
        auto t0 = std::chrono::steady_clock::now();
        tower->encode(pool, image, out.data());  // uploads the weights on the GPU
        const double first = seconds_since(t0);
        const int n = on_gpu ? runs : 1;
        t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < n; ++r) tower->encode(pool, image, out.data());
        const double s = seconds_since(t0) / n;
        std::printf(
            "{\"family\": \"%s\", \"device\": \"%s\", \"image\": %d, \"soft_tokens\": %lld, "
            "\"first_encode_s\": %.3f, \"ms_per_image\": %.2f, \"soft_tokens_per_s\": %.0f, "
            "\"tflops\": %.2f}\n",
            name, tower->device_name(), t.image, (long long)image.tokens, first, s * 1e3,
            double(image.tokens) / s, t.flops(double(image.tokens)) / s / 1e12);
        std::fflush(stdout);
        if (on_gpu && profile) {
          auto timed = std::make_unique<ProfilingOps>(cuda::cuda_vision_ops(0));
          ProfilingOps* p = timed.get();
          tower->run_on(std::move(timed));
          tower->encode(pool, image, out.data());  // uploads the weights: not counted
          p->reset();
          tower->encode(pool, image, out.data());
          std::fprintf(stderr, "profile: %s, one encode, time per op (each synchronized):\n%s",
                       name, p->report().c_str());
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_vision: %s\n", e.what());
    return 1;
  }
  return 0;
}
