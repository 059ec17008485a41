// braid/core/error.hpp — the error model: one exception hierarchy, every error carries its context.
//
// Every failure braid reports is a braid::error (derived from std::runtime_error). Its code() says what
// kind of failure it is; a derived class exists for each code so callers can catch just what they
// handle. Context: the rank that raised it, the collective and its sequence number on that
// communicator (1-based; 0 = not inside a call), the peer rank implicated (-1 = none) and, for a failed
// system or CUDA call, the call's text and file:line. The library never calls exit() or abort().
#pragma once

#include "config.hpp"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <cerrno>

namespace braid {

enum class errc : int {
  invalid_argument = 1, // bad pointer, count, root, peer, aliasing: nothing was touched
  invalid_usage,        // closed, moved-from or failed communicator, call from a second thread
  unsupported,          // algorithm/collective or type/operator combination not available
  timeout,              // a wait passed its deadline (BRAID_TIMEOUT / options::timeout)
  peer_failed,          // a peer died, left the communicator, or reported its own error
  aborted,              // communicator::abort() was called
  mismatch,             // ranks called different collectives (debug mode) or sizes disagree
  system,               // an operating-system call failed (errno in sys_errno())
  cuda,                 // a CUDA runtime call failed
  protocol,             // a malformed or foreign message during rendezvous
  internal,             // a broken invariant inside braid: please report
};

constexpr const char* to_string(errc c) noexcept {
  switch (c) {
  case errc::invalid_argument: return "invalid argument";
  case errc::invalid_usage: return "invalid usage";
  case errc::unsupported: return "unsupported";
  case errc::timeout: return "timeout";
  case errc::peer_failed: return "peer failed";
  case errc::aborted: return "aborted";
  case errc::mismatch: return "mismatch";
  case errc::system: return "system error";
  case errc::cuda: return "CUDA error";
  case errc::protocol: return "protocol error";
  case errc::internal: return "internal error";
  }
  return "unknown error";
}

// Where an error happened. Filled by the communicator for errors raised inside a call.
struct error_context {
  int rank = -1;
  const char* collective = nullptr; // static string, e.g. "all_reduce"
  std::uint64_t seq = 0;
  int peer = -1;
};

class error : public std::runtime_error {
public:
  error(errc code, const std::string& message, const error_context& ctx = {}, std::string call = {},
        const char* file = nullptr, int line = 0, int sys_errno = 0)
      : std::runtime_error(format(code, message, ctx, call, file, line)), code_(code), ctx_(ctx),
        message_(message), call_(std::move(call)), file_(file), line_(line), errno_(sys_errno) {}

  errc code() const noexcept { return code_; }
  int rank() const noexcept { return ctx_.rank; }
  int peer() const noexcept { return ctx_.peer; }
  std::string_view collective() const noexcept {
    return ctx_.collective ? std::string_view(ctx_.collective) : std::string_view();
  }
  std::uint64_t sequence() const noexcept { return ctx_.seq; }
  const std::string& message() const noexcept { return message_; } // without the context prefix
  const std::string& call() const noexcept { return call_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  int sys_errno() const noexcept { return errno_; }
  const error_context& context() const noexcept { return ctx_; }

private:
  static std::string format(errc code, const std::string& message, const error_context& ctx,
                            const std::string& call, const char* file, int line) {
    std::string s = "braid: ";
    s += to_string(code);
    if (ctx.rank >= 0 || ctx.collective) {
      s += " [";
      bool sep = false;
      if (ctx.rank >= 0) { s += "rank " + std::to_string(ctx.rank); sep = true; }
      if (ctx.collective) {
        if (sep) s += ", ";
        s += ctx.collective;
        if (ctx.seq) s += " #" + std::to_string(ctx.seq);
        sep = true;
      }
      if (ctx.peer >= 0) {
        if (sep) s += ", ";
        s += "peer " + std::to_string(ctx.peer);
      }
      s += "]";
    }
    s += ": ";
    s += message;
    if (!call.empty()) {
      s += " (in " + call;
      if (file) s += " at " + std::string(file) + ":" + std::to_string(line);
      s += ")";
    }
    return s;
  }

  errc code_;
  error_context ctx_;
  std::string message_, call_;
  const char* file_;
  int line_;
  int errno_;
};

#define BRAID_DEFINE_ERROR(name, code_value)                                                        \
  class name : public error {                                                                      \
  public:                                                                                          \
    explicit name(const std::string& message, const error_context& ctx = {}, std::string call = {},\
                  const char* file = nullptr, int line = 0, int sys_errno = 0)                     \
        : error(code_value, message, ctx, std::move(call), file, line, sys_errno) {}               \
  };
BRAID_DEFINE_ERROR(invalid_argument, errc::invalid_argument)
BRAID_DEFINE_ERROR(usage_error, errc::invalid_usage)
BRAID_DEFINE_ERROR(unsupported_error, errc::unsupported)
BRAID_DEFINE_ERROR(timeout_error, errc::timeout)
BRAID_DEFINE_ERROR(peer_error, errc::peer_failed)
BRAID_DEFINE_ERROR(aborted_error, errc::aborted)
BRAID_DEFINE_ERROR(mismatch_error, errc::mismatch)
BRAID_DEFINE_ERROR(system_error, errc::system)
BRAID_DEFINE_ERROR(cuda_error, errc::cuda)
BRAID_DEFINE_ERROR(protocol_error, errc::protocol)
BRAID_DEFINE_ERROR(internal_error, errc::internal)
#undef BRAID_DEFINE_ERROR

// Throws the exception class that matches `code`.
[[noreturn]] inline void raise(errc code, const std::string& message, const error_context& ctx = {},
                               std::string call = {}, const char* file = nullptr, int line = 0,
                               int sys_errno = 0) {
  switch (code) {
  case errc::invalid_argument: throw invalid_argument(message, ctx, std::move(call), file, line, sys_errno);
  case errc::invalid_usage: throw usage_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::unsupported: throw unsupported_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::timeout: throw timeout_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::peer_failed: throw peer_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::aborted: throw aborted_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::mismatch: throw mismatch_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::system: throw system_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::cuda: throw cuda_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::protocol: throw protocol_error(message, ctx, std::move(call), file, line, sys_errno);
  case errc::internal: break;
  }
  throw internal_error(message, ctx, std::move(call), file, line, sys_errno);
}

namespace detail {
// Raises `e` again with its context completed from `c`: the rank, the collective (with its sequence
// number) and the peer that `e` leaves unknown; what `e` knows stays. With `replace_collective`,
// `c`'s collective and sequence number replace `e`'s (an internal call reported as its caller).
[[noreturn]] inline void raise_in_context(const error& e, const error_context& c, bool replace_collective = false) {
  error_context x = e.context();
  if (x.rank < 0) x.rank = c.rank;
  if (!x.collective || replace_collective) {
    x.collective = c.collective;
    x.seq = c.seq;
  }
  if (x.peer < 0) x.peer = c.peer;
  raise(e.code(), e.message(), x, e.call(), e.file(), e.line(), e.sys_errno());
}
inline bool lacks_context(const error& e) noexcept { return e.rank() < 0 || e.collective().empty(); }

[[noreturn]] inline void raise_errno(const char* call, const char* file, int line, int e,
                                     const error_context& ctx = {}) {
  raise(errc::system, std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")", ctx, call,
        file, line, e);
}
} // namespace detail
} // namespace braid

// Evaluates a POSIX-style call that returns -1 and sets errno on failure; throws braid::system_error.
#define BRAID_SYSCALL(expr)                                                                         \
  ([&]() {                                                                                          \
    auto braid_rc_ = (expr);                                                                        \
    if (braid_rc_ == -1) ::braid::detail::raise_errno(#expr, __FILE__, __LINE__, errno);            \
    return braid_rc_;                                                                               \
  }())
