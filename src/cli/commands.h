// Each `tandem <command>` registers its flags on a CLI11 subcommand and
// returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tandem::cli {

using Runner = std::function<int()>;

Runner add_run_command(CLI::App& app);
Runner add_logits_command(CLI::App& app);
Runner add_synth_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_serve_command(CLI::App& app);
Runner add_tokenize_command(CLI::App& app);
Runner add_detokenize_command(CLI::App& app);
Runner add_template_command(CLI::App& app);
Runner add_quantize_command(CLI::App& app);
Runner add_models_command(CLI::App& app);
Runner add_info_command(CLI::App& app);
Runner add_pull_command(CLI::App& app);
Runner add_rm_command(CLI::App& app);
Runner add_alias_command(CLI::App& app);
Runner add_chat_command(CLI::App& app);
Runner add_doctor_command(CLI::App& app);
Runner add_coherence_command(CLI::App& app);

}  // namespace tandem::cli
