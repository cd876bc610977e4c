// tandem: a local inference server for language and small multimodal models.
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: local inference for language and small multimodal models"};
  app.set_version_flag("--version", "tandem 0.1.0");
  app.require_subcommand(1);
  std::map<CLI::App*, tandem::cli::Runner> runners;
  auto add = [&](tandem::cli::Runner (*fn)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    tandem::cli::Runner r = fn(app);
    runners[app.get_subcommands({}).at(before)] = std::move(r);
  };
  add(tandem::cli::add_run_command);
  add(tandem::cli::add_logits_command);
  add(tandem::cli::add_synth_command);
  add(tandem::cli::add_bench_command);
  add(tandem::cli::add_serve_command);
  add(tandem::cli::add_tokenize_command);
  add(tandem::cli::add_detokenize_command);
  add(tandem::cli::add_template_command);
  add(tandem::cli::add_quantize_command);
  add(tandem::cli::add_models_command);
  add(tandem::cli::add_info_command);
  add(tandem::cli::add_pull_command);
  add(tandem::cli::add_rm_command);
  add(tandem::cli::add_alias_command);
  add(tandem::cli::add_chat_command);
  add(tandem::cli::add_doctor_command);
  add(tandem::cli::add_coherence_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
