// Tells whether the client of a request has gone away, while the request is
// still being generated.
//
// Why this exists: cpp-httplib 0.11.4 (Debian 12) has no
// Request::is_connection_closed, and a stream only notices a closed socket
// when a write fails, which can be a long prefill or queue wait later. So the
// probe finds the request's own socket — the one whose local port and peer
// address/port equal the request's (httplib fills those from the same socket)
// — among this process's descriptors, once, and then asks the kernel about
// it: poll() for hang-up / RDHUP / error, and a non-blocking MSG_PEEK read
// that returns 0 at the peer's FIN. Linux only (/proc/self/fd); elsewhere,
// or when the socket is not found, peer_closed() is always false and streams
// still notice a failed write.
//
// Safety: the socket is the connection's, which httplib keeps open until the
// handler (or the stream's content provider) returns, and the probe is only
// used from there. It only polls and peeks; it never reads, writes or closes.
#pragma once

#include <string>

namespace tandem::server {

class ConnectionProbe {
 public:
  ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port);

  // True once the peer closed or reset the connection.
  bool peer_closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace tandem::server
