// braid/host/rendezvous/wire.hpp — the messages ranks exchange while they rendezvous, and their parsers.
//
// Every message starts with a fixed header: magic "BRDZ", protocol version, message type and payload
// length. Parsers check every field and the exact payload length against what the type allows before
// reading the payload, and reject anything else with protocol_error: a foreign or corrupt message
// can never make a rank read past what it received.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../core/error.hpp"

namespace braid::wire {

inline constexpr std::uint32_t magic = 0x5a445242; // "BRDZ" little-endian
inline constexpr std::uint16_t version = 2; // 2: reg_offer and reg_table carry freed ids
inline constexpr std::uint32_t max_ranks = 4096;

enum class msg_type : std::uint16_t { hello = 1, welcome = 2, reg_offer = 3, reg_table = 4 };

struct header {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t type;
  std::uint32_t length; // payload bytes after the header
  std::uint32_t reserved;
};
static_assert(sizeof(header) == 16);

// A joining rank introduces itself to rank 0.
struct hello {
  std::uint8_t secret[16];
  std::int32_t rank;
  std::int32_t nranks;
  std::int32_t pid;
  std::uint32_t reserved;
};
static_assert(sizeof(hello) == 32);

// Rank 0's answer, sent with the segment's file descriptor: sizes, then every rank's pid.
struct welcome_fixed {
  std::uint64_t total_bytes;
  std::uint64_t half_bytes;
  std::uint64_t p2p_bytes;
  std::int32_t nranks;
  std::int32_t reserved;
};
static_assert(sizeof(welcome_fixed) == 32);

struct welcome {
  welcome_fixed fixed;
  std::vector<std::int32_t> pids;
};

// Registration of a buffer allocated through the communicator: each rank offers its allocation's
// descriptor to rank 0 (reg_offer, with the fd); rank 0 answers every rank with the table of all
// sizes (reg_table, with the other ranks' fds in rank order, the receiver's own omitted).
// Both also carry the ids of buffers freed since the sender's previous alloc (at most max_freed per
// rank and message, in increasing order, each below alloc_id), so that the peers unmap them.
// reg_offer: alloc_id, bytes, count, then `count` ids.
// reg_table: alloc_id, nranks, bytes[nranks], count[nranks], then each rank's ids in rank order.
inline constexpr std::uint32_t max_freed = 256;

struct reg_offer {
  std::uint64_t alloc_id;
  std::uint64_t bytes;
  std::vector<std::uint64_t> freed; // this rank's freed allocation ids
};

struct reg_table {
  std::uint64_t alloc_id;
  std::vector<std::uint64_t> bytes;              // per rank
  std::vector<std::vector<std::uint64_t>> freed; // per rank
};

inline std::vector<std::byte> encode(msg_type t, const void* payload, std::size_t n) {
  header h{magic, version, static_cast<std::uint16_t>(t), static_cast<std::uint32_t>(n), 0};
  std::vector<std::byte> out(sizeof h + n);
  std::memcpy(out.data(), &h, sizeof h);
  if (n) std::memcpy(out.data() + sizeof h, payload, n);
  return out;
}

inline std::vector<std::byte> encode_hello(const hello& m) { return encode(msg_type::hello, &m, sizeof m); }

inline std::vector<std::byte> encode_welcome(const welcome& m) {
  std::vector<std::byte> p(sizeof(welcome_fixed) + m.pids.size() * sizeof(std::int32_t));
  std::memcpy(p.data(), &m.fixed, sizeof m.fixed);
  if (!m.pids.empty()) std::memcpy(p.data() + sizeof m.fixed, m.pids.data(), m.pids.size() * sizeof(std::int32_t));
  return encode(msg_type::welcome, p.data(), p.size());
}

namespace detail {
inline void put_u64(std::vector<std::byte>& p, std::uint64_t v) {
  const std::size_t at = p.size();
  p.resize(at + 8);
  std::memcpy(p.data() + at, &v, 8);
}
inline std::uint64_t get_u64(const std::byte* p, std::size_t i) { // the i-th 64-bit word
  std::uint64_t v;
  std::memcpy(&v, p + i * 8, 8);
  return v;
}
} // namespace detail

inline std::vector<std::byte> encode_reg_offer(const reg_offer& m) {
  std::vector<std::byte> p;
  detail::put_u64(p, m.alloc_id);
  detail::put_u64(p, m.bytes);
  detail::put_u64(p, m.freed.size());
  for (std::uint64_t id : m.freed) detail::put_u64(p, id);
  return encode(msg_type::reg_offer, p.data(), p.size());
}

inline std::vector<std::byte> encode_reg_table(const reg_table& m) {
  std::vector<std::byte> p;
  detail::put_u64(p, m.alloc_id);
  detail::put_u64(p, m.bytes.size());
  for (std::uint64_t b : m.bytes) detail::put_u64(p, b);
  for (std::size_t q = 0; q < m.bytes.size(); ++q) detail::put_u64(p, q < m.freed.size() ? m.freed[q].size() : 0);
  for (std::size_t q = 0; q < m.bytes.size() && q < m.freed.size(); ++q)
    for (std::uint64_t id : m.freed[q]) detail::put_u64(p, id);
  return encode(msg_type::reg_table, p.data(), p.size());
}

[[noreturn]] inline void reject(const std::string& why) { raise(errc::protocol, "rendezvous message rejected: " + why); }

// Validates a header; returns the payload length the caller must then receive.
inline std::uint32_t parse_header(const std::byte* data, std::size_t n, msg_type expected) {
  if (n < sizeof(header)) reject("truncated header (" + std::to_string(n) + " bytes)");
  header h;
  std::memcpy(&h, data, sizeof h);
  if (h.magic != magic) reject("bad magic (not a braid peer)");
  if (h.version != version) reject("protocol version " + std::to_string(h.version) + ", expected " + std::to_string(version));
  if (h.type != static_cast<std::uint16_t>(expected)) reject("unexpected message type " + std::to_string(h.type));
  std::uint32_t maxlen = 0;
  switch (expected) {
  case msg_type::hello: maxlen = sizeof(hello); break;
  case msg_type::welcome: maxlen = static_cast<std::uint32_t>(sizeof(welcome_fixed) + max_ranks * sizeof(std::int32_t)); break;
  case msg_type::reg_offer: maxlen = 24 + max_freed * 8; break;
  case msg_type::reg_table: maxlen = 16 + max_ranks * 16 + max_ranks * max_freed * 8; break;
  }
  if (h.length > maxlen) reject("payload length " + std::to_string(h.length) + " exceeds " + std::to_string(maxlen));
  if (h.reserved != 0) reject("reserved header field is not zero");
  return h.length;
}

inline hello parse_hello(const std::byte* payload, std::size_t n) {
  if (n != sizeof(hello)) reject("hello payload has " + std::to_string(n) + " bytes, expected " + std::to_string(sizeof(hello)));
  hello m;
  std::memcpy(&m, payload, sizeof m);
  if (m.nranks < 1 || static_cast<std::uint32_t>(m.nranks) > max_ranks) reject("hello: bad nranks " + std::to_string(m.nranks));
  if (m.rank < 0 || m.rank >= m.nranks) reject("hello: rank " + std::to_string(m.rank) + " out of range");
  if (m.pid <= 0) reject("hello: bad pid");
  if (m.reserved != 0) reject("hello: reserved field is not zero");
  return m;
}

inline welcome parse_welcome(const std::byte* payload, std::size_t n) {
  if (n < sizeof(welcome_fixed)) reject("welcome payload truncated");
  welcome m;
  std::memcpy(&m.fixed, payload, sizeof m.fixed);
  if (m.fixed.nranks < 1 || static_cast<std::uint32_t>(m.fixed.nranks) > max_ranks) reject("welcome: bad nranks");
  if (n != sizeof(welcome_fixed) + static_cast<std::size_t>(m.fixed.nranks) * sizeof(std::int32_t))
    reject("welcome payload length does not match nranks");
  if (m.fixed.half_bytes == 0 || m.fixed.p2p_bytes == 0 || m.fixed.total_bytes < m.fixed.half_bytes)
    reject("welcome: inconsistent sizes");
  if (m.fixed.reserved != 0) reject("welcome: reserved field is not zero");
  m.pids.resize(static_cast<std::size_t>(m.fixed.nranks));
  std::memcpy(m.pids.data(), payload + sizeof(welcome_fixed), m.pids.size() * sizeof(std::int32_t));
  for (std::int32_t pid : m.pids)
    if (pid <= 0) reject("welcome: bad pid");
  return m;
}

namespace detail {
// A list of freed ids: at most max_freed, increasing, each in [1, alloc_id).
inline void check_freed(const std::vector<std::uint64_t>& ids, std::uint64_t alloc_id, const char* what) {
  std::uint64_t last = 0;
  for (std::uint64_t id : ids) {
    if (id <= last || id >= alloc_id) reject(std::string(what) + ": freed ids must increase and precede the allocation");
    last = id;
  }
}
} // namespace detail

inline reg_offer parse_reg_offer(const std::byte* payload, std::size_t n) {
  if (n < 24) reject("registration offer has " + std::to_string(n) + " bytes, fewer than 24");
  reg_offer m;
  m.alloc_id = detail::get_u64(payload, 0);
  m.bytes = detail::get_u64(payload, 1);
  const std::uint64_t k = detail::get_u64(payload, 2);
  if (k > max_freed || n != 24 + k * 8) reject("registration offer: length does not match its count of freed ids");
  if (m.alloc_id == 0) reject("registration offer: allocation id 0");
  if (m.bytes == 0 || m.bytes > (std::uint64_t{1} << 40)) reject("registration offer: bad size");
  m.freed.resize(k);
  for (std::size_t i = 0; i < k; ++i) m.freed[i] = detail::get_u64(payload, 3 + i);
  detail::check_freed(m.freed, m.alloc_id, "registration offer");
  return m;
}

inline reg_table parse_reg_table(const std::byte* payload, std::size_t n) {
  if (n < 16 || n % 8 != 0) reject("registration table has a bad length");
  reg_table m;
  m.alloc_id = detail::get_u64(payload, 0);
  const std::uint64_t nr = detail::get_u64(payload, 1);
  if (nr < 1 || nr > max_ranks || n < 16 + nr * 16) reject("registration table: bad rank count or length");
  if (m.alloc_id == 0) reject("registration table: allocation id 0");
  m.bytes.resize(nr);
  std::uint64_t total = 0;
  for (std::size_t q = 0; q < nr; ++q) {
    m.bytes[q] = detail::get_u64(payload, 2 + q);
    if (m.bytes[q] == 0 || m.bytes[q] > (std::uint64_t{1} << 40)) reject("registration table: bad size");
    const std::uint64_t k = detail::get_u64(payload, 2 + nr + q);
    if (k > max_freed) reject("registration table: too many freed ids");
    total += k;
  }
  if (n != 16 + nr * 16 + total * 8) reject("registration table: length does not match its counts of freed ids");
  m.freed.resize(nr);
  std::size_t at = 2 + 2 * nr;
  for (std::size_t q = 0; q < nr; ++q) {
    m.freed[q].resize(detail::get_u64(payload, 2 + nr + q));
    for (auto& id : m.freed[q]) id = detail::get_u64(payload, at++);
    detail::check_freed(m.freed[q], m.alloc_id, "registration table");
  }
  return m;
}

} // namespace braid::wire
