#include "cli/serve_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace tandem::cli {

namespace {

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("cannot find this program's path (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

ServeChild::ServeChild(const std::string& model, const std::vector<std::string>& serve_args) {
  std::vector<std::string> argv = {self_exe(),  "serve",  model, "--host",
                                   "127.0.0.1", "--port", "0"};
  argv.insert(argv.end(), serve_args.begin(), serve_args.end());
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/tandem-coherence-serve-XXXXXX";
  const int log_fd = mkstemp(templ.data());
  if (log_fd < 0) fail("cannot create a log file for the server (%s)", templ.c_str());
  log_path_ = templ;
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    close(log_fd);
    fail("cannot start tandem serve: fork failed");
  }
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(log_fd);
}

ServeChild::~ServeChild() {
  stop();
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

bool ServeChild::reap(bool block) {
  if (reaped_) return true;
  if (waitpid(pid_, &exit_status_, block ? 0 : WNOHANG) == pid_) reaped_ = true;
  return reaped_;
}

bool ServeChild::wait_ready(double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < until) {
    const std::string log = read_all(log_path_);
    if (log.find("tandem serve: ready:") != std::string::npos) {
      const std::string prefix = "listening on http://127.0.0.1:";
      const size_t at = log.find(prefix);
      const int port = at == std::string::npos ? 0 : std::atoi(log.c_str() + at + prefix.size());
      if (port > 0) {
        url_ = "http://127.0.0.1:" + std::to_string(port);
        return true;
      }
      error_ = "tandem serve printed its ready line but no port";
      return false;
    }
    if (reap(false)) {
      error_ = WIFEXITED(exit_status_)
                   ? strprintf("tandem serve exited with status %d before it was ready",
                               WEXITSTATUS(exit_status_))
                   : strprintf("tandem serve was killed by signal %d before it was ready",
                               WTERMSIG(exit_status_));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  error_ = strprintf("tandem serve was not ready after %.0f s", timeout_s);
  return false;
}

void ServeChild::stop(double grace_s) {
  if (pid_ <= 0 || reaped_) return;
  kill(pid_, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (std::chrono::steady_clock::now() < until) {
    if (reap(false)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  reap(true);
}

std::string ServeChild::log_tail(size_t max_lines) const {
  const std::string log = read_all(log_path_);
  size_t start = log.size();
  if (start > 0 && log[start - 1] == '\n') --start;  // the last line's newline
  for (size_t lines = 0; start > 0; --start)
    if (log[start - 1] == '\n' && ++lines == max_lines) break;
  return log.substr(start);
}

}  // namespace tandem::cli
