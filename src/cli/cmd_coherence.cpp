// tandem coherence: the coherence gate (issue #9). Runs a golden set through
// a server's POST /v1/chat/completions — a running one (--url) or
// `tandem serve MODEL` started as a child on a free port — and fails on wrong
// answers, garbage (coherence/garbage_detector.h), reasoning leaks and hangs.
//
// Exit status: 0 every case passed; 1 a case failed (or a usage error);
// 2 the server could not be reached, or the child server did not start.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/serve_child.h"
#include "coherence/client.h"
#include "coherence/evaluate.h"
#include "coherence/golden_set.h"
#include "coherence/report.h"
#include "core/error.h"

namespace tandem::cli {

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUnreachable = 2;

struct CoherenceOptions {
  std::string model, url, set = "seed", api_key;
  std::vector<std::string> serve_args;
  bool json = false;
  double timeout_s = 60;
  double start_timeout_s = 600;
};

// Exit 2 with `message` (stderr, and a JSON document with --json).
int unreachable(const CoherenceOptions& o, const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  if (o.json)
    std::printf("%s\n", nlohmann::json({{"ok", false}, {"error", message}}).dump(2).c_str());
  return kExitUnreachable;
}

int run_coherence(const CoherenceOptions& o) {
  if (o.model.empty() == o.url.empty())
    fail("give a MODEL to serve (folder, alias or repo) or --url of a running server");
  if (!o.url.empty() && !o.serve_args.empty())
    fail("arguments after -- are for `tandem serve MODEL`; --url takes none");
  for (const std::string& a : o.serve_args)
    if (a == "--host" || a == "--port" || a.rfind("--host=", 0) == 0 || a.rfind("--port=", 0) == 0)
      fail("tandem coherence chooses the server's --host and --port itself; remove %s", a.c_str());
  if (!(o.timeout_s > 0)) fail("--timeout must be positive (seconds), got %g", o.timeout_s);
  if (!(o.start_timeout_s > 0)) fail("--start-timeout must be positive (seconds)");

  const coherence::GoldenSet set = coherence::load_golden_set(o.set);

  std::unique_ptr<ServeChild> child;
  std::string url = o.url;
  if (!o.model.empty()) {
    std::fprintf(stderr, "coherence: starting tandem serve %s\n", o.model.c_str());
    child = std::make_unique<ServeChild>(o.model, o.serve_args);
    if (!child->wait_ready(o.start_timeout_s)) {
      std::fprintf(stderr, "coherence: the server's log ends with:\n%s\n",
                   child->log_tail().c_str());
      return unreachable(o, child->error());
    }
    url = child->url();
  }

  const coherence::Client client(url, o.api_key, o.timeout_s);
  const coherence::ProbeResult probe = client.probe(o.timeout_s);
  if (probe.status != coherence::ProbeResult::Status::Ready) return unreachable(o, probe.detail);

  const coherence::RunInfo info{set.name, set.source, client.base_url(), probe.model_id};
  std::vector<coherence::CaseResult> results;
  for (const coherence::GoldenCase& c : set.cases) {
    results.push_back(coherence::evaluate_case(c, client.ask(c, probe.model_id)));
    if (!o.json) {
      std::printf("%s\n", coherence::case_line(results.back()).c_str());
      std::fflush(stdout);
    }
  }
  if (child) child->stop();

  bool all_pass = true;
  for (const coherence::CaseResult& r : results) all_pass &= r.pass;
  if (o.json)
    std::printf("%s\n", coherence::json_report(info, results).dump(2).c_str());
  else
    std::printf("%s\n", coherence::summary_line(info, results).c_str());
  return all_pass ? 0 : kExitFailed;
}

}  // namespace

Runner add_coherence_command(CLI::App& app) {
  auto o = std::make_shared<CoherenceOptions>();
  auto* cmd = app.add_subcommand(
      "coherence",
      "Run a golden set of questions through a server's chat API; fail on wrong answers, "
      "garbage and hangs (exit 0 all pass, 1 a failure, 2 server unreachable)");
  cmd->add_option("model", o->model,
                  "Model to serve for the run (folder, alias or org/name); arguments after -- go "
                  "to `tandem serve`, e.g. -- --text-only --threads 4");
  cmd->add_option("serve_args", o->serve_args, "Arguments for `tandem serve`, after --");
  cmd->add_option("--url", o->url,
                  "A running OpenAI-compatible server, e.g. http://127.0.0.1:8000");
  cmd->add_option("--set", o->set,
                  "Golden set: a built-in name (seed) or a JSON file (a path with '/' or .json)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print a JSON report instead of lines");
  cmd->add_option("--timeout", o->timeout_s, "Seconds each request may take (a hang fails)")
      ->capture_default_str();
  cmd->add_option("--start-timeout", o->start_timeout_s,
                  "Seconds the served MODEL may take to download and load")
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Bearer key for the server (default: the TANDEM_API_KEY environment variable)");
  return [o] {
    if (o->api_key.empty())
      if (const char* env = std::getenv("TANDEM_API_KEY")) o->api_key = env;
    return run_coherence(*o);
  };
}

}  // namespace tandem::cli
