#include "cli/common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/kernels.h"
#include "core/clock.h"
#include "core/error.h"
#include "model/decoder.h"

namespace tandem::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos)
      fail("%s: empty entry in \"%s\" (expected comma-separated token ids)", flag, text.c_str());
    item = item.substr(a, b - a + 1);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX)
      fail("%s: \"%s\" is not a token id (expected a non-negative integer)", flag, item.c_str());
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) fail("%s: no token ids given", flag);
  return ids;
}

double now_seconds() {
  return monotonic_seconds();
}

void add_quantize_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--quantize", value,
                  "Quantize the weights at load: q4 or q8 (MLX affine, group size 64; matmuls "
                  "then run on int8 activations)");
}

void add_device_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--device", value,
                  "Where the model runs: auto (the first CUDA device when one is usable, else "
                  "the CPU), cpu, cuda or cuda:N")
      ->capture_default_str();
}

void add_kv_cache_dtype_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--kv-cache-dtype", value,
                  "Type of the KV cache rows: auto (bf16 on CUDA, f32 on the CPU), f32 or bf16 "
                  "(CUDA only: half the bytes, so twice the tokens and faster attention)")
      ->capture_default_str();
}

void add_gemm_precision_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--gemm-precision", value,
                  "Inputs of the matrix products of prefill and batched decode (and the GPU's "
                  "prefill attention) over bf16 weights: bf16 (as vLLM and llama.cpp; ~1.6x "
                  "faster prefill on a GPU, ~1.8x on a CPU with AVX-512 BF16) or f32 (exact "
                  "products: f32-level on a GPU, f32 on the CPU)")
      ->capture_default_str();
}

SequenceRunner make_sequence_runner(const DeviceChoice& device, const Model& model,
                                    ThreadPool& pool, int64_t capacity,
                                    const std::string& kv_cache_dtype,
                                    const std::string& gemm_precision) {
  SequenceRunner r;
  r.kv_pool = std::make_unique<KvPool>(
      single_sequence_pool(model.spec, capacity, Decoder::kDefaultStepTokens,
                           kv_host_storage(device), resolve_kv_dtype(kv_cache_dtype, device)));
  r.runner = make_step_runner(device, model, pool, *r.kv_pool, Decoder::kDefaultStepTokens,
                              resolve_gemm_precision(gemm_precision));
  return r;
}

void add_mmproj_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--mmproj", value,
                  "Vision tower from a llama.cpp mmproj GGUF (projector type gemma3 or pixtral), "
                  "used for images instead of the model's own");
}

void check_mmproj(const std::string& value) {
  if (value.empty()) return;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(value, ec))
    fail("--mmproj %s: no such file (expected a llama.cpp mmproj .gguf)", value.c_str());
}

LoadOptions load_options(const std::string& value, const DeviceChoice& device) {
  LoadOptions o;
  const char* repack = std::getenv("TANDEM_CPU_REPACK");
  o.pack_for_cpu =
      !device.cuda && cpu::packed_weights_preferred() && !(repack && std::string(repack) == "0");
  if (value.empty() || value == "none") return o;
  if (value == "q4")
    o.quantize_bits = 4;
  else if (value == "q8")
    o.quantize_bits = 8;
  else
    fail("--quantize: \"%s\" is not q4 or q8", value.c_str());
  return o;
}

namespace {

// Every matrix and embedding of the model (the tied head once).
std::vector<const WeightMatrix*> all_matrices(const Model& m) {
  const Weights& w = m.weights;
  std::vector<const WeightMatrix*> out = {&w.embed, &w.ple_embed, &w.ple_model_proj};
  if (w.head.data != w.embed.data) out.push_back(&w.head);
  for (const LayerWeights& l : w.layers)
    for (const WeightMatrix* x :
         {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj})
      out.push_back(x);
  return out;
}

}  // namespace

uint64_t model_weight_bytes(const Model& model) {
  uint64_t bytes = 0;
  for (const WeightMatrix* x : all_matrices(model))
    if (x->data) bytes += x->nbytes();
  return bytes;
}

std::string weight_format_name(const Model& model) {
  std::string name;
  for (const WeightMatrix* x : all_matrices(model)) {
    if (!x->data) continue;
    std::string n = std::string(dtype_name(x->dtype));
    if (x->quantized())  // MLX's layout or PackedAffine: the same codes
      n = "affine " + std::to_string(x->bits) + "-bit, group " + std::to_string(x->group_size) +
          ", " + n + " scales";
    if (name.empty())
      name = n;
    else if (name != n && name.find("mixed") == std::string::npos)
      name = "mixed: " + name + " + " + n;
  }
  return name;
}

namespace {

// "loaded DIR: ARCH…, N GB <what> in T s" for a model with buffers converted at load.
void print_converted(const std::string& dir, const Model& model, const char* kind, const char* what,
                     double t0) {
  const ModelSpec& s = model.spec;
  std::fprintf(stderr,
               "loaded %s: %s%s, %lld layers, hidden %lld, vocab %lld, %.2f GB %s in %.1f s\n",
               dir.c_str(), s.arch.c_str(), kind, (long long)s.layers, (long long)s.hidden,
               (long long)s.vocab, double(model.owned_bytes) / 1e9, what, now_seconds() - t0);
}

}  // namespace

std::unique_ptr<Model> load_model_verbose(const std::string& dir, const LoadOptions& options) {
  const double t0 = now_seconds();
  // Converting at load (packing, quantizing) reads every matrix: on a
  // terminal, a percentage of the checkpoint's bytes as they go by.
  LoadOptions o = options;
  uint64_t convert_total = 0, converted = 0;
  int shown = -1;
  std::error_code ec;
  if (isatty(STDERR_FILENO) && (o.pack_for_cpu || o.quantize_bits) &&
      std::filesystem::is_directory(dir, ec))
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") convert_total += e.file_size(ec);
  if (convert_total > 0)
    o.on_matrix = [&](uint64_t bytes) {
      converted += bytes;
      const int pct = int(std::min<uint64_t>(100, converted * 100 / convert_total));
      if (pct != shown)
        std::fprintf(stderr, "\rloading %s: %3d%% of %.2f GB", dir.c_str(), pct,
                     double(convert_total) / 1e9);
      shown = pct;
    };
  auto model = load_model(dir, o);
  if (shown >= 0) std::fprintf(stderr, "\r\033[K");
  const Checkpoint& ckpt = model->checkpoint;
  if (options.quantize_bits) {
    // Quantizing read every weight it replaced, and the rest were converted;
    // touching the mapping again would only make the replaced pages resident.
    std::fprintf(stderr, "loaded %s: %s, quantized at load to %d-bit (%.2f GB) in %.1f s\n",
                 dir.c_str(), model->spec.arch.c_str(), options.quantize_bits,
                 double(model->owned_bytes) / 1e9, now_seconds() - t0);
    return model;
  }
  if (options.pack_for_cpu && model->owned_bytes > 0 && !model->source) {
    // The layers' matrices were read and packed (their mapped pages handed
    // back); embeddings stay mapped. The head is read every step: make it
    // resident now rather than during the first request.
    const WeightMatrix& head = model->weights.head;
    volatile uint8_t sink = 0;
    const auto* p = static_cast<const uint8_t*>(head.data);
    const size_t data_bytes = head.row_bytes() * size_t(head.stored_rows());  // not the scales
    for (size_t off = 0; p && off < data_bytes; off += 4096) sink = sink + p[off];
    print_converted(dir, *model, "", "packed for the CPU kernels", t0);
    return model;
  }
  if (model->source) {  // GGUF: block types were converted at load, the rest stays mapped
    print_converted(dir, *model, " (GGUF)", "converted at load", t0);
    return model;
  }
  const auto names = ckpt.names();
  uint64_t total = 0;
  for (const auto& n : names) total += ckpt.get(n).nbytes();
  const bool tty = isatty(STDERR_FILENO);
  uint64_t done = 0;
  int last_pct = -1;
  volatile uint8_t sink = 0;
  for (const auto& n : names) {
    TensorView t = ckpt.get(n);
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (size_t off = 0; off < t.nbytes(); off += 4096) sink = sink + p[off];
    done += t.nbytes();
    int pct = total ? int(done * 100 / total) : 100;
    if (tty && pct != last_pct) {
      std::fprintf(stderr, "\rloading %s: %3d%% of %.2f GB", dir.c_str(), pct, double(total) / 1e9);
      last_pct = pct;
    }
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  const ModelSpec& s = model->spec;
  std::fprintf(stderr, "loaded %s: %s, %lld layers, hidden %lld, vocab %lld, %.2f GB in %.1f s\n",
               dir.c_str(), s.arch.c_str(), (long long)s.layers, (long long)s.hidden,
               (long long)s.vocab, double(total) / 1e9, now_seconds() - t0);
  return model;
}

uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

}  // namespace tandem::cli
