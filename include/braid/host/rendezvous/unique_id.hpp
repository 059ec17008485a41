// braid/host/rendezvous/unique_id.hpp — the token ranks of one communicator meet by.
//
// 128 random bits name the rendezvous point; 128 more are a secret every joining rank must present.
// Pass it to the other ranks out of band (an environment variable, a file, the command line) as the
// 64-hex-digit string to_string() gives; anyone holding it can join, so treat it like a password.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <string_view>

#include <sys/random.h>

#include "../../core/error.hpp"

namespace braid {

class unique_id {
public:
  std::array<std::uint8_t, 16> name{};
  std::array<std::uint8_t, 16> secret{};

  // Fresh random id from the kernel's CSPRNG.
  static unique_id generate() {
    unique_id id;
    fill_random(id.name.data(), id.name.size());
    fill_random(id.secret.data(), id.secret.size());
    return id;
  }

  // An id derived from a string every rank of a job knows (not secret: see launch/env.hpp).
  static unique_id derive(std::string_view key) {
    unique_id id;
    std::uint64_t h[4] = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL, 0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL};
    for (int lane = 0; lane < 4; ++lane) {
      std::uint64_t x = h[lane];
      for (char c : key) x = mix(x ^ static_cast<std::uint8_t>(c)) + static_cast<std::uint64_t>(lane);
      h[lane] = mix(x ^ key.size());
    }
    std::memcpy(id.name.data(), h, 16);
    std::memcpy(id.secret.data(), h + 2, 16);
    return id;
  }

  std::string to_string() const {
    static constexpr char hex[] = "0123456789abcdef";
    std::string s;
    for (auto b : name) { s += hex[b >> 4]; s += hex[b & 15]; }
    for (auto b : secret) { s += hex[b >> 4]; s += hex[b & 15]; }
    return s;
  }

  // Parses to_string()'s form; throws invalid_argument with the reason otherwise.
  static unique_id parse(std::string_view s) {
    if (s.size() != 64) raise(errc::invalid_argument, "unique id must be 64 hex digits, got " + std::to_string(s.size()) + " characters");
    unique_id id;
    for (std::size_t i = 0; i < 32; ++i) {
      const int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
      if (hi < 0 || lo < 0) raise(errc::invalid_argument, "unique id has a character that is not a hex digit");
      (i < 16 ? id.name[i] : id.secret[i - 16]) = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    return id;
  }

  // The abstract-namespace socket name (no file is ever created).
  std::string socket_name() const { return "braid-" + to_string().substr(0, 32); }

  friend bool operator==(const unique_id&, const unique_id&) = default;

private:
  static int digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL; x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  static void fill_random(std::uint8_t* p, std::size_t n) {
    while (n) {
      const ssize_t got = ::getrandom(p, n, 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        detail::raise_errno("getrandom", __FILE__, __LINE__, errno);
      }
      p += got;
      n -= static_cast<std::size_t>(got);
    }
  }
};

} // namespace braid
