#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace tandem::server {

namespace {

// Address and port of a socket address, as httplib reports them
// (numeric host, e.g. "127.0.0.1" or "::1").
bool address_of(const sockaddr_storage& ss, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (!inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) return false;
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (!inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf)) return false;
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

bool matches(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  sockaddr_storage peer{}, local{};
  socklen_t plen = sizeof peer, llen = sizeof local;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) return false;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return false;
  std::string paddr, laddr;
  int pport = -1, lport = -1;
  if (!address_of(peer, paddr, pport) || !address_of(local, laddr, lport)) return false;
  return pport == remote_port && lport == local_port && paddr == remote_addr;
}

}  // namespace

ConnectionProbe::ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port) {
  if (remote_port < 0 || local_port < 0) return;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  const int own = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (matches(int(fd), remote_addr, remote_port, local_port)) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(dir);
}

bool ConnectionProbe::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;                                            // FIN
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return true;  // reset
  }
  return false;  // open (bytes pending are the client's next request)
}

}  // namespace tandem::server
