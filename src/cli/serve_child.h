// `tandem serve MODEL` as a child process of this one, for commands that
// test a model through the real HTTP path (tandem coherence).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tandem::cli {

class ServeChild {
 public:
  // Starts this executable as `serve MODEL --host 127.0.0.1 --port 0 ARGS...`
  // (a free port chosen by the child), its stdout and stderr going to a
  // temporary log file. The child gets SIGTERM if this process dies.
  ServeChild(const std::string& model, const std::vector<std::string>& serve_args);
  // Stops the child (stop()) and removes the log.
  ~ServeChild();
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  // Waits until the child prints its ready line (true; url() is then set),
  // exits, or `timeout_s` passes (false; error() says which, with the end of
  // the child's log).
  bool wait_ready(double timeout_s);

  // SIGTERM, then SIGKILL if the child has not exited within `grace_s`;
  // reaps it. Idempotent.
  void stop(double grace_s = 15.0);

  const std::string& url() const { return url_; }  // http://127.0.0.1:PORT
  const std::string& error() const { return error_; }
  std::string log_tail(size_t max_lines = 20) const;

 private:
  bool reap(bool block);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_status_ = 0;  // waitpid status once reaped
  std::string log_path_;
  std::string url_;
  std::string error_;
};

}  // namespace tandem::cli
