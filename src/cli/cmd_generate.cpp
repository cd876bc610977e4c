// tandem run / tandem logits: generation and raw logits from token ids.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "catalog/resolve.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "model/decoder.h"
#include "model/image_prompt.h"
#include "server/model_text.h"
#include "text/tokenizer.h"

namespace tandem::cli {

namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  std::string ids;
  int n = 32;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "auto";
  std::string kv_cache_dtype = "auto";
  std::string gemm_precision = "bf16";
  std::string quantize;  // --quantize q4|q8
  std::string mmproj;    // --mmproj FILE: the vision tower for --image
  bool json = false;
  bool ignore_eos = false;
  bool chat = false;
  std::vector<std::string> images;
};

struct LogitsOptions {
  std::string model;
  std::string ids;
  std::vector<std::string> images;
  bool all = false;
  int threads = 0;
  std::string device = "auto";
  std::string kv_cache_dtype = "auto";
  std::string gemm_precision = "bf16";
  std::string quantize;  // --quantize q4|q8
  std::string mmproj;    // --mmproj FILE: the vision tower for --image
};

// The prompt ids of `run`: --ids as given (image placeholders already
// expanded); --prompt as raw text whose image markers are expanded, or with
// --chat as one user message (the images first, then the text) through the
// model's chat template — the images expanded as the server's chat path
// expands them.
std::vector<int32_t> run_prompt(const RunOptions& o, server::ModelText* text,
                                const VisionTower* tower,
                                const std::vector<PreparedImage>& images) {
  if (!o.ids.empty()) return parse_id_list(o.ids, "--ids");
  server::ChatImages expansion;
  if (tower) {
    auto spell = [&](int32_t id) { return text->tokenizer().decode({id}); };
    expansion.marker = spell(tower->ids().marker);
    for (const PreparedImage& img : images)
      expansion.expansions.push_back(tower->expansion_text(img, spell));
  }
  if (!o.chat) {
    const std::string p = tower ? server::expand_image_markers(o.prompt, expansion) : o.prompt;
    return text->tokenizer().encode(p, true);
  }
  if (!text->has_chat_template())
    fail("--chat needs a chat template, and %s has none", o.model.c_str());
  nlohmann::json content = nlohmann::json::array();
  for (size_t k = 0; k < images.size(); ++k)
    content.push_back({{"type", "image_url"}, {"image_url", {{"url", o.images[k]}}}});
  content.push_back({{"type", "text"}, {"text", o.prompt}});
  const nlohmann::json messages = {{{"role", "user"}, {"content", content}}};
  return text->chat_prompt(messages, nullptr, nullptr, tower ? &expansion : nullptr);
}

int run_generate(const RunOptions& o, const DeviceChoice& device) {
  if (o.n < 0) fail("-n must not be negative, got %d", o.n);
  if (o.prompt.empty() && o.ids.empty()) fail("give a prompt with --prompt TEXT or --ids 1,2,3");
  if (o.chat && o.prompt.empty()) fail("--chat needs --prompt TEXT");
  // A text prompt (and text output) needs the folder's tokenizer.
  std::unique_ptr<server::ModelText> model_text = server::ModelText::load(o.model);
  if (!o.prompt.empty() && !model_text)
    fail(
        "--prompt needs a tokenizer, and %s has no tokenizer.json or tekken.json; pass token ids "
        "with --ids 1,2,3 instead",
        o.model.c_str());
  const text::Tokenizer* tok = model_text ? &model_text->tokenizer() : nullptr;
  auto model = load_model_verbose(o.model, load_options(o.quantize, device));
  model->mmproj = o.mmproj;
  std::unique_ptr<VisionTower> tower;
  std::vector<PreparedImage> prepared;
  if (!o.images.empty()) {
    tower = VisionTower::load(*model);
    place_vision_tower(*tower, device);
    prepared = prepare_image_files(*tower, o.images);
  }
  const std::vector<int32_t> prompt = run_prompt(o, model_text.get(), tower.get(), prepared);
  ThreadPool pool(o.threads);
  SequenceRunner seq = make_sequence_runner(device, *model, pool, int64_t(prompt.size()) + o.n,
                                            o.kv_cache_dtype, o.gemm_precision);
  StepRunner& decoder = *seq.runner;
  SequenceKv kv;
  std::vector<float> logits(size_t(model->spec.vocab));
  Sampler sampler(SamplingParams{.temperature = o.temperature, .seed = o.seed});

  const double t0 = now_seconds();
  if (o.images.empty()) {
    run_sequence(decoder, prompt.data(), int64_t(prompt.size()), kv, logits.data(), false);
  } else {
    const ImagePrompt images = encode_image_prompt(*tower, pool, prompt, prepared);
    run_sequence(decoder, prompt.data(), int64_t(prompt.size()), kv, logits.data(), false,
                 images.placement.embeds.data(), images.placement.key_end.data());
  }
  const double t1 = now_seconds();
  std::vector<int32_t> out;
  const auto& eos = model->spec.eos_ids;
  while (int(out.size()) < o.n) {
    int32_t id = sampler.sample(logits.data(), model->spec.vocab);
    out.push_back(id);
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), id) != eos.end()) break;
    if (int(out.size()) == o.n) break;
    run_sequence(decoder, &id, 1, kv, logits.data(), false);
  }
  const double t2 = now_seconds();

  // Text with special tokens skipped, as the server returns it.
  const std::string text = tok ? tok->decode(out, /*skip_special=*/true) : std::string();
  if (o.json) {
    nlohmann::json j;
    j["ids"] = out;
    if (tok) j["text"] = text;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (tok) {
    std::printf("%s\n", text.c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
  }
  const size_t decoded = out.size() > 1 ? out.size() - 1 : 0;
  std::fprintf(
      stderr,
      "prefill %zu tokens in %.3f s (%.1f tok/s); decode %zu tokens in %.3f s (%.2f tok/s)\n",
      prompt.size(), t1 - t0, double(prompt.size()) / (t1 - t0), decoded, t2 - t1,
      decoded ? double(decoded) / (t2 - t1) : 0.0);
  return 0;
}

int run_logits(const LogitsOptions& o, const DeviceChoice& device) {
  std::vector<int32_t> ids = parse_id_list(o.ids, "--ids");
  auto model = load_model_verbose(o.model, load_options(o.quantize, device));
  model->mmproj = o.mmproj;
  ThreadPool pool(o.threads);
  const int64_t n = int64_t(ids.size()), V = model->spec.vocab;
  SequenceRunner seq =
      make_sequence_runner(device, *model, pool, n, o.kv_cache_dtype, o.gemm_precision);
  StepRunner& decoder = *seq.runner;
  SequenceKv kv;
  std::vector<float> logits(size_t(o.all ? n * V : V));
  if (o.images.empty()) {
    run_sequence(decoder, ids.data(), n, kv, logits.data(), o.all);
  } else {
    auto tower = VisionTower::load(*model);
    place_vision_tower(*tower, device);
    const ImagePrompt images =
        encode_image_prompt(*tower, pool, ids, prepare_image_files(*tower, o.images));
    run_sequence(decoder, ids.data(), n, kv, logits.data(), o.all, images.placement.embeds.data(),
                 images.placement.key_end.data());
  }
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < (o.all ? n : 1); ++r)
    rows.push_back(std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V));
  nlohmann::json j;
  j["logits"] = std::move(rows);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

Runner add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt");
  cmd->add_option("model", o->model,
                  "Model: a folder, an alias (tandem models) or org/name[@revision], downloaded "
                  "when missing")
      ->required();
  auto* prompt =
      cmd->add_option("--prompt", o->prompt, "Prompt text (tokenized with the model's tokenizer)");
  auto* ids = cmd->add_option("--ids", o->ids, "Prompt as comma-separated token ids");
  prompt->excludes(ids);
  cmd->add_option("-n,--max-tokens", o->n, "Tokens to generate (stops early at end-of-sequence)")
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed for sampling")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)");
  add_device_option(cmd, o->device);
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_gemm_precision_option(cmd, o->gemm_precision);
  add_quantize_option(cmd, o->quantize);
  add_mmproj_option(cmd, o->mmproj);
  cmd->add_flag("--json", o->json, "Print {\"ids\": [...], \"text\": \"...\"} as JSON");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--chat", o->chat,
                "Send --prompt as one user message through the model's chat template (with the "
                "--image files before the text), as the server does");
  cmd->add_option("--image", o->images,
                  "Image file (repeatable; Gemma 3, Gemma 4, Mistral 3). With --chat it goes "
                  "before the text; with a plain --prompt it replaces the next image marker "
                  "(e.g. <start_of_image>, [IMG]); with --ids the ids must hold its expanded "
                  "placeholders")
      ->check(CLI::ExistingFile);
  return [o] {
    check_mmproj(o->mmproj);
    const DeviceChoice device = resolve_device(o->device);  // before any download
    resolve_kv_dtype(o->kv_cache_dtype, device);
    resolve_gemm_precision(o->gemm_precision);
    o->model = catalog::resolve_model_arg(o->model, /*allow_download=*/true);
    return run_generate(*o, device);
  };
}

Runner add_logits_command(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Print the logits of a sequence of token ids as JSON");
  cmd->add_option("model", o->model,
                  "Model: a folder, or a downloaded alias or org/name[@revision]")
      ->required();
  cmd->add_option("--ids", o->ids, "Comma-separated token ids")->required();
  cmd->add_flag("--all", o->all, "Every position's logits, not only the last");
  cmd->add_option("--image", o->images,
                  "Image file for the next image's expanded placeholder ids in --ids (repeatable; "
                  "Gemma 3, Gemma 4, Mistral 3)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)");
  add_device_option(cmd, o->device);
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_gemm_precision_option(cmd, o->gemm_precision);
  add_quantize_option(cmd, o->quantize);
  add_mmproj_option(cmd, o->mmproj);
  return [o] {
    check_mmproj(o->mmproj);
    const DeviceChoice device = resolve_device(o->device);
    resolve_kv_dtype(o->kv_cache_dtype, device);
    resolve_gemm_precision(o->gemm_precision);
    o->model = catalog::resolve_model_arg(o->model, /*allow_download=*/false);
    return run_logits(*o, device);
  };
}

}  // namespace tandem::cli
