// tandem template PATH: renders chat-template requests read as JSON lines.
//   in:  {"messages": [...], "tools": [...], "add_generation_prompt": true, "kwargs": {...}}
//   out: {"prompt": "..."}  or  {"error": "..."}
// PATH is a model folder (tokenizer_config.json / chat_template.jinja) or a
// template file. One output line per input line; a bad line yields an error
// line, never a stop.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace tandem::cli {

namespace {

struct TemplateOptions {
  std::string path;
  std::string bos, eos;
};

std::string render_line(const ChatTemplate& tpl, const std::string& line) {
  nlohmann::ordered_json out;
  try {
    nlohmann::ordered_json req = nlohmann::ordered_json::parse(line);
    if (!req.is_object()) fail("each input line must be a JSON object");
    nlohmann::ordered_json messages = req.value("messages", nlohmann::ordered_json::array());
    nlohmann::ordered_json tools = req.contains("tools") ? req["tools"] : nlohmann::ordered_json();
    const bool agp =
        req.contains("add_generation_prompt") && req["add_generation_prompt"].is_boolean()
            ? req["add_generation_prompt"].get<bool>()
            : false;
    nlohmann::ordered_json kwargs =
        req.contains("kwargs") ? req["kwargs"] : nlohmann::ordered_json();
    out["prompt"] = tpl.render(messages, tools, agp, kwargs);
  } catch (const std::exception& e) {
    out = nlohmann::ordered_json::object();
    out["error"] = e.what();
  }
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

int run_template(const TemplateOptions& o) {
  std::map<std::string, std::string> special;
  if (!o.bos.empty()) special["bos_token"] = o.bos;
  if (!o.eos.empty()) special["eos_token"] = o.eos;
  ChatTemplate tpl = [&] {
    if (std::filesystem::is_directory(o.path)) return ChatTemplate::from_folder(o.path);
    std::ifstream f(o.path, std::ios::binary);
    if (!f) fail("cannot read %s", o.path.c_str());
    std::stringstream ss;
    ss << f.rdbuf();
    return ChatTemplate::from_string(ss.str(), special);
  }();
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::cout << render_line(tpl, line) << "\n" << std::flush;
  }
  return 0;
}

}  // namespace

Runner add_template_command(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  auto* cmd = app.add_subcommand(
      "template", "Render chat-template requests (JSON lines on stdin) as transformers would");
  cmd->add_option("path", o->path, "Model folder, or a .jinja template file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--bos", o->bos, "bos_token for a template file");
  cmd->add_option("--eos", o->eos, "eos_token for a template file");
  return [o] { return run_template(*o); };
}

}  // namespace tandem::cli
