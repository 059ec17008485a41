// braid/host/rendezvous/rendezvous.hpp — how the processes of a host communicator find each other.
//
// Rank 0 listens on an abstract-namespace Unix socket named from the unique id (no file is created, so
// nothing is left behind whatever happens to the processes); the others connect, retrying until the
// deadline, and send a hello carrying the id's secret. Rank 0 checks each hello (secret, rank, size, and
// that the peer runs as the same user, via SO_PEERCRED), creates the shared segment as a memfd (it has
// no name in /dev/shm at all and disappears when the last process unmaps it, also after SIGKILL), and
// passes its file descriptor to every rank with SCM_RIGHTS. The listening socket is closed as soon as
// everyone has joined.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../core/error.hpp"
#include "../memory.hpp"
#include "unique_id.hpp"
#include "wire.hpp"

namespace braid::host {

class socket_fd {
public:
  socket_fd() = default;
  explicit socket_fd(int fd) : fd_(fd) {}
  socket_fd(socket_fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  socket_fd& operator=(socket_fd&& o) noexcept { if (this != &o) { close(); fd_ = o.fd_; o.fd_ = -1; } return *this; }
  ~socket_fd() { close(); }
  int get() const { return fd_; }
  void close() { if (fd_ >= 0) ::close(fd_); fd_ = -1; }
private:
  int fd_ = -1;
};

namespace detail {

using clock = std::chrono::steady_clock;

inline int ms_left(clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left > 1000 ? 1000 : left);
}

inline sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// The socket helpers below take `who`: this rank, the call ("rendezvous" for join, "alloc" with its
// sequence number) and the peer at the other end of the socket (-1 where not known yet: rank 0 before
// a hello). Their errors carry it.

[[noreturn]] inline void rendezvous_timeout(const error_context& who, const std::string& what) {
  error_context c = who;
  c.collective = "rendezvous";
  c.seq = 0;
  raise(errc::timeout, what + " before the deadline (BRAID_TIMEOUT / options::timeout)", c);
}

// errno values with which a stream socket says that the other end is gone: it closed its end or its
// process died (with data unread on either side, Linux reports ECONNRESET on receive and EPIPE on send
// instead of end of file).
constexpr bool peer_gone_errno(int e) noexcept { return e == ECONNRESET || e == EPIPE || e == ECONNABORTED || e == ENOTCONN; }

// What raise_peer_closed throws: a protocol_error that alloc's exchange can tell apart from the other
// protocol errors, to find out which rank died before it reports (comm/communicator.hpp,
// exchange_registration). Callers see a protocol_error.
class peer_closed_error : public protocol_error {
public:
  using protocol_error::protocol_error;
};

// A connection the peer closed, or lost with its process (e = its errno; 0 = end of file): the
// documented kind for that, protocol_error, whatever the socket said, naming the peer where known.
[[noreturn]] inline void raise_peer_closed(const error_context& who, int e, const char* call = "", const char* file = nullptr,
                                           int line = 0) {
  std::string m = (who.peer >= 0 ? "rank " + std::to_string(who.peer) : std::string("the peer")) + " closed the connection";
  m += who.collective && std::string_view(who.collective) == "rendezvous" ? " (it refused this rank, or it died)"
                                                                          : " (it closed its communicator, or it died)";
  if (e != 0) m += ": " + std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
  throw peer_closed_error(m, who, call, file, line, e);
}

// A failed socket call: the peer's end gone is raise_peer_closed, anything else system_error; both
// with `who`.
[[noreturn]] inline void raise_socket_errno(const char* call, const char* file, int line, int e, const error_context& who) {
  if (peer_gone_errno(e)) raise_peer_closed(who, e, call, file, line);
  braid::detail::raise_errno(call, file, line, e, who);
}

// Sends all bytes and, with the first byte, the descriptors in `fds` (at most 250).
inline void send_all(int fd, const std::vector<std::byte>& buf, const std::vector<int>& fds, clock::time_point deadline,
                     const error_context& who) {
  std::size_t off = 0;
  while (off < buf.size()) {
    msghdr mh{};
    iovec iov{const_cast<std::byte*>(buf.data() + off), buf.size() - off};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    std::vector<char> ctrl;
    if (!fds.empty() && off == 0) {
      ctrl.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
      mh.msg_control = ctrl.data();
      mh.msg_controllen = ctrl.size();
      cmsghdr* cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, ms_left(deadline)) == 0 && clock::now() > deadline) rendezvous_timeout(who, "could not send");
        continue;
      }
      raise_socket_errno("sendmsg", __FILE__, __LINE__, errno, who);
    }
    off += static_cast<std::size_t>(n);
  }
}

// Receives exactly n bytes; appends passed descriptors to *got (closes them if got is null).
inline void recv_all(int fd, std::byte* buf, std::size_t n, std::vector<int>* fds_out, clock::time_point deadline,
                     const error_context& who) {
  std::size_t off = 0;
  while (off < n) {
    pollfd p{fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, ms_left(deadline));
    if (pr == 0) {
      if (clock::now() > deadline) rendezvous_timeout(who, "a rendezvous message did not arrive");
      continue;
    }
    if (pr < 0) {
      if (errno == EINTR) continue;
      braid::detail::raise_errno("poll", __FILE__, __LINE__, errno, who);
    }
    msghdr mh{};
    iovec iov{buf + off, n - off};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 256)];
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    const ssize_t got = ::recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      raise_socket_errno("recvmsg", __FILE__, __LINE__, errno, who);
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < k; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (fds_out) fds_out->push_back(f);
        else ::close(f); // unexpected descriptors are dropped
      }
    }
    if (got == 0) raise_peer_closed(who, 0);
    off += static_cast<std::size_t>(got);
  }
}

template <class Parse>
auto recv_message(int fd, wire::msg_type t, std::vector<int>* got, clock::time_point deadline, const error_context& who,
                  Parse parse) {
  std::byte hb[sizeof(wire::header)];
  recv_all(fd, hb, sizeof hb, got, deadline, who);
  const std::uint32_t len = wire::parse_header(hb, sizeof hb, t);
  std::vector<std::byte> payload(len);
  recv_all(fd, payload.data(), len, got, deadline, who);
  return parse(payload.data(), payload.size());
}

} // namespace detail

// The wire format and the segment carry process ids as int32_t (pid_t on Linux).
static_assert(sizeof(pid_t) == sizeof(std::int32_t) && std::is_signed_v<pid_t>, "braid needs a 32-bit signed pid_t");

struct rendezvous_result {
  mapped_memory segment;
  std::vector<std::int32_t> pids;
  std::uint64_t half_bytes = 0, p2p_bytes = 0;
  bool created = false; // this rank created (and must initialise) the segment
  // Kept open for buffer registration: rank 0 holds one socket per peer, the others one to rank 0.
  std::vector<socket_fd> sockets;
};

// Joins the processes of one communicator. `layout_bytes(nranks)` gives the segment size rank 0
// creates; half_bytes/p2p_bytes are rank 0's choice and are handed to everyone.
// `init(base)` prepares the fresh segment on rank 0 before anyone else can see it.
template <class LayoutFn, class InitFn>
rendezvous_result rendezvous(const unique_id& id, int rank, int nranks, std::uint64_t half_bytes,
                             std::uint64_t p2p_bytes, LayoutFn layout_bytes, InitFn init, std::chrono::nanoseconds timeout) {
  using namespace detail;
  const auto deadline = clock::now() + timeout;
  socklen_t alen = 0;
  const sockaddr_un addr = abstract_address(id.socket_name(), alen);
  rendezvous_result res;
  res.pids.assign(static_cast<std::size_t>(nranks), 0);
  res.pids[static_cast<std::size_t>(rank)] = ::getpid();

  if (rank == 0) {
    socket_fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listener.get() < 0) braid::detail::raise_errno("socket", __FILE__, __LINE__, errno);
    if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), alen) != 0) {
      if (errno == EADDRINUSE)
        raise(errc::invalid_usage, "another rank 0 is already using this unique id on this host");
      braid::detail::raise_errno("bind", __FILE__, __LINE__, errno);
    }
    if (::listen(listener.get(), 128) != 0) braid::detail::raise_errno("listen", __FILE__, __LINE__, errno);
    std::vector<socket_fd> peers(static_cast<std::size_t>(nranks));
    int joined = 1;
    while (joined < nranks) {
      pollfd p{listener.get(), POLLIN, 0};
      const int pr = ::poll(&p, 1, ms_left(deadline));
      if (pr <= 0) {
        if (pr < 0 && errno != EINTR) braid::detail::raise_errno("poll", __FILE__, __LINE__, errno);
        if (clock::now() > deadline)
          rendezvous_timeout(error_context{0, "rendezvous", 0, -1}, "only " + std::to_string(joined) + " of " + std::to_string(nranks) + " ranks joined");
        continue;
      }
      socket_fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conn.get() < 0) continue;
      ucred cred{};
      socklen_t cl = sizeof cred;
      if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != ::getuid()) continue;
      wire::hello h{};
      try {
        // A connection that sends nothing useful must not stall the others for long.
        const auto d = std::min(deadline, clock::now() + std::chrono::seconds(5));
        h = recv_message(conn.get(), wire::msg_type::hello, nullptr, d, error_context{0, "rendezvous", 0, -1}, wire::parse_hello);
      } catch (const error&) {
        continue; // foreign or corrupt: drop that connection, keep waiting for real ranks
      }
      if (std::memcmp(h.secret, id.secret.data(), 16) != 0 || h.nranks != nranks || h.rank == 0 ||
          peers[static_cast<std::size_t>(h.rank)].get() >= 0)
        continue;
      res.pids[static_cast<std::size_t>(h.rank)] = h.pid;
      peers[static_cast<std::size_t>(h.rank)] = std::move(conn);
      ++joined;
    }
    listener.close(); // the name disappears now
    res.segment = mapped_memory::create_shared(layout_bytes(nranks), "braid-segment");
    res.created = true;
    init(res.segment.data());
    wire::welcome w;
    w.fixed = wire::welcome_fixed{res.segment.size(), half_bytes, p2p_bytes, nranks, 0};
    w.pids = res.pids;
    const auto msg = wire::encode_welcome(w);
    for (int r = 1; r < nranks; ++r)
      send_all(peers[static_cast<std::size_t>(r)].get(), msg, {res.segment.fd()}, deadline, error_context{0, "rendezvous", 0, r});
    res.sockets = std::move(peers);
    res.half_bytes = half_bytes;
    res.p2p_bytes = p2p_bytes;
    return res;
  }

  socket_fd conn;
  for (;;) {
    conn = socket_fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (conn.get() < 0) braid::detail::raise_errno("socket", __FILE__, __LINE__, errno);
    if (::connect(conn.get(), reinterpret_cast<const sockaddr*>(&addr), alen) == 0) break;
    if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR)
      braid::detail::raise_errno("connect", __FILE__, __LINE__, errno);
    if (clock::now() > deadline) rendezvous_timeout(error_context{rank, "rendezvous", 0, 0}, "rank 0 did not open the rendezvous");
    ::usleep(2000);
  }
  wire::hello h{};
  std::memcpy(h.secret, id.secret.data(), 16);
  h.rank = rank;
  h.nranks = nranks;
  h.pid = ::getpid();
  const error_context to_root{rank, "rendezvous", 0, 0};
  send_all(conn.get(), wire::encode_hello(h), {}, deadline, to_root);
  std::vector<int> fds;
  wire::welcome w;
  try {
    w = recv_message(conn.get(), wire::msg_type::welcome, &fds, deadline, to_root, wire::parse_welcome);
  } catch (...) {
    for (int f : fds) ::close(f);
    throw;
  }
  if (fds.size() != 1) {
    for (int f : fds) ::close(f);
    raise(errc::protocol, "rank 0's welcome must carry exactly one shared-memory descriptor");
  }
  const int fd = fds[0];
  if (w.fixed.nranks != nranks) {
    ::close(fd);
    raise(errc::protocol, "rank 0 expects " + std::to_string(w.fixed.nranks) + " ranks, this rank " + std::to_string(nranks));
  }
  res.segment = mapped_memory::map_shared(fd, w.fixed.total_bytes);
  res.sockets.resize(1);
  res.sockets[0] = std::move(conn);
  res.pids = w.pids;
  res.half_bytes = w.fixed.half_bytes;
  res.p2p_bytes = w.fixed.p2p_bytes;
  return res;
}

} // namespace braid::host
