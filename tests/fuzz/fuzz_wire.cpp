// libFuzzer target over everything braid parses from outside the process: the rendezvous wire
// messages (header, hello, welcome, reg_offer, reg_table), the same messages arriving over a real
// socket (host::detail::recv_message: truncation, a peer that closes early), unique ids
// (BRAID_UNIQUE_ID) and the option strings (BRAID_TIMEOUT, BRAID_STAGING_BYTES, BRAID_ALGO).
//
// Contract checked: a parser either returns a value or throws braid::error; never another exception,
// never a read outside the input (ASan), never undefined behaviour (UBSan). A message that parses is
// re-encoded and must give back the very bytes that were parsed.
//
// Input layout: byte 0 picks the target, the rest is its input. Build: clang++ -fsanitize=fuzzer,...
// (tests/CMakeLists.txt does it where clang with libFuzzer is present).
#include <braid/host/rendezvous/rendezvous.hpp>
#include <braid/host/rendezvous/unique_id.hpp>
#include <braid/host/rendezvous/wire.hpp>
#include <braid/comm/options.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace braid;

[[noreturn]] void broken(const char*) { __builtin_trap(); }

void same_bytes(const std::vector<std::byte>& encoded, const std::byte* hdr, const std::byte* payload, std::size_t len) {
  if (encoded.size() != sizeof(wire::header) + len) broken("length");
  if (std::memcmp(encoded.data(), hdr, sizeof(wire::header)) != 0) broken("header");
  if (len && std::memcmp(encoded.data() + sizeof(wire::header), payload, len) != 0) broken("payload");
}

// Parses one message of type t from a header followed by its payload, as recv_message does.
void message(wire::msg_type t, const std::byte* d, std::size_t n) {
  const std::uint32_t len = wire::parse_header(d, n, t);
  if (n - sizeof(wire::header) < len) return; // a socket read would wait for the rest
  const std::byte* p = d + sizeof(wire::header);
  switch (t) {
  case wire::msg_type::hello: same_bytes(wire::encode_hello(wire::parse_hello(p, len)), d, p, len); break;
  case wire::msg_type::welcome: same_bytes(wire::encode_welcome(wire::parse_welcome(p, len)), d, p, len); break;
  case wire::msg_type::reg_offer: same_bytes(wire::encode_reg_offer(wire::parse_reg_offer(p, len)), d, p, len); break;
  case wire::msg_type::reg_table: same_bytes(wire::encode_reg_table(wire::parse_reg_table(p, len)), d, p, len); break;
  }
}

// The same, through a socket: the input is what a peer wrote before it closed the connection.
void over_socket(wire::msg_type t, const std::byte* d, std::size_t n) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
  const ssize_t w = n ? ::send(sv[1], d, n, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
  ::close(sv[1]);
  if (w == static_cast<ssize_t>(n)) {
    const auto deadline = host::detail::clock::now() + std::chrono::milliseconds(200);
    std::vector<int> fds;
    try {
      switch (t) {
      case wire::msg_type::hello: host::detail::recv_message(sv[0], t, &fds, deadline, braid::error_context{}, wire::parse_hello); break;
      case wire::msg_type::welcome: host::detail::recv_message(sv[0], t, &fds, deadline, braid::error_context{}, wire::parse_welcome); break;
      case wire::msg_type::reg_offer: host::detail::recv_message(sv[0], t, &fds, deadline, braid::error_context{}, wire::parse_reg_offer); break;
      case wire::msg_type::reg_table: host::detail::recv_message(sv[0], t, &fds, deadline, braid::error_context{}, wire::parse_reg_table); break;
      }
    } catch (const error&) {
    }
    if (!fds.empty()) broken("descriptors from nowhere");
  }
  ::close(sv[0]);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto* d = reinterpret_cast<const std::byte*>(data + 1);
  const std::size_t n = size - 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), n);
  const unsigned sel = data[0] % 12;
  try {
    switch (sel) {
    case 0: case 1: case 2: case 3: message(static_cast<wire::msg_type>(sel + 1), d, n); break;
    case 4: case 5: case 6: case 7:
      if ((data[0] / 12) % 4 == 0) over_socket(static_cast<wire::msg_type>(sel - 3), d, n); // sockets are slow: 1 in 4
      else message(static_cast<wire::msg_type>(sel - 3), d, n);
      break;
    case 8: {
      const unique_id id = unique_id::parse(text);
      if (unique_id::parse(id.to_string()) != id) broken("unique id round trip");
      if (id.socket_name().size() != 6 + 32) broken("socket name");
      break;
    }
    case 9: (void)options::parse_duration(text); break;
    case 10: (void)options::parse_size(text, "BRAID_STAGING_BYTES"); break;
    case 11: {
      options o;
      o.apply_algo_spec(text);
      break;
    }
    }
  } catch (const error&) {
    // rejected with braid's error: the contract
  }
  return 0;
}
