// braid/comm/options.hpp — communicator options and their environment variables.
//   BRAID_TIMEOUT        longest wait for one peer: "30" (seconds), "500ms", "2m"   (default 300 s)
//   BRAID_ALGO           "ring" for every collective that has it, or per collective:
//                        "all_reduce=two_shot,broadcast=tree"                        (default: tuning table)
//   BRAID_STAGING_BYTES  staging memory per rank, both halves together              (default 8 MiB)
//   BRAID_SPIN           how long a waiting rank polls before it sleeps until its peer posts:
//                        "200us", "1ms", "0.5"                                        (default 200 us)
//   BRAID_DEBUG          1: before any data moves, every rank checks that every peer makes the same call
//                        (collective, type, operator, algorithm, count, root); a difference is a
//                        mismatch_error on every rank naming both calls. Set it on every rank or none.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../schedule/common.hpp"

namespace braid {

struct options {
  std::chrono::nanoseconds timeout = std::chrono::seconds(300);
  // Algorithm per collective (index: braid::collective); automatic = the tuning table decides.
  algo algorithm[5] = {algo::automatic, algo::automatic, algo::automatic, algo::automatic, algo::automatic};
  std::size_t staging_bytes = std::size_t{8} << 20; // per rank, split in two halves
  std::size_t p2p_bytes = std::size_t{1} << 20;     // per rank send buffer
  // Ranks that are threads read each other's inputs in place (no staging copy) from this size on,
  // for out-of-place calls (16 KiB: 1.8-4x faster than staging at 32-128 KiB with 2 threads,
  // bench/results).
  std::size_t zero_copy_min_bytes = std::size_t{16} << 10;
  // A waiting rank polls this long (yielding between polls when ranks outnumber CPUs), then sleeps in
  // the kernel until the rank it waits for posts (host/sleep.hpp).
  std::chrono::nanoseconds spin = std::chrono::microseconds(200);
  bool debug = false;

  options& with_algorithm(algo a) {
    for (auto& x : algorithm) x = a;
    return *this;
  }
  options& with_algorithm(collective c, algo a) {
    if (static_cast<int>(c) < 5) algorithm[static_cast<int>(c)] = a;
    return *this;
  }
  options& with_timeout(std::chrono::nanoseconds t) {
    timeout = t;
    return *this;
  }
  options& with_spin(std::chrono::nanoseconds t) {
    spin = t;
    return *this;
  }

  // Defaults overridden by the environment; a malformed value is an invalid_argument error.
  static options from_env() {
    options o;
    if (const char* t = std::getenv("BRAID_TIMEOUT"); t && *t) o.timeout = parse_duration(t);
    if (const char* a = std::getenv("BRAID_ALGO"); a && *a) o.apply_algo_spec(a);
    if (const char* s = std::getenv("BRAID_STAGING_BYTES"); s && *s) {
      o.staging_bytes = parse_size(s, "BRAID_STAGING_BYTES");
      if (o.staging_bytes < (std::size_t{64} << 10))
        raise(errc::invalid_argument, "BRAID_STAGING_BYTES='" + std::string(s) + "' is below the minimum of 64K (65536 bytes)");
    }
    if (const char* t = std::getenv("BRAID_SPIN"); t && *t) o.spin = parse_duration(t, "BRAID_SPIN");
    if (const char* d = std::getenv("BRAID_DEBUG"); d && *d && std::string_view(d) != "0") o.debug = true;
    return o;
  }

  // BRAID_TIMEOUT's syntax (`what` names the variable). A bad value raises invalid_argument saying
  // what is wrong with it: not a number, an unknown unit, not positive, or too large.
  static std::chrono::nanoseconds parse_duration(std::string_view s, const char* what = "BRAID_TIMEOUT") {
    const std::string shown = std::string(what) + "='" + std::string(s) + "'";
    const char* syntax = " (a positive number of seconds, or with a unit: 30, 0.5, 500ms, 250us, 2m)";
    const bool negative = !s.empty() && s[0] == '-';
    std::size_t i = negative ? 1 : 0;
    double v = 0;
    bool digits = false;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') { v = v * 10 + (s[i] - '0'); ++i; digits = true; }
    if (i < s.size() && s[i] == '.') {
      double f = 0.1;
      for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, f /= 10) { v += (s[i] - '0') * f; digits = true; }
    }
    if (!digits) raise(errc::invalid_argument, shown + " is not a number" + syntax);
    const std::string_view unit = s.substr(i);
    double scale = 1e9;
    if (unit == "ms") scale = 1e6;
    else if (unit == "us") scale = 1e3;
    else if (unit == "m" || unit == "min") scale = 60e9;
    else if (!unit.empty() && unit != "s")
      raise(errc::invalid_argument, shown + " has an unknown unit '" + std::string(unit) + "' (s, ms, us, m or min; none means s)");
    if (negative || v <= 0) raise(errc::invalid_argument, shown + " must be positive" + syntax);
    if (v * scale > 1e18) raise(errc::invalid_argument, shown + " is too large (at most 10^18 ns, about 31.7 years)");
    return std::chrono::nanoseconds(static_cast<std::int64_t>(v * scale));
  }

  // A size in bytes (BRAID_STAGING_BYTES's syntax; `what` names the variable). A bad value raises
  // invalid_argument saying what is wrong with it: not a number, not whole, an unknown unit, not
  // positive, or above 1 TiB.
  static std::size_t parse_size(std::string_view s, const char* what) {
    constexpr std::size_t limit = std::size_t{1} << 40; // 1 TiB: anything larger is a typo
    const std::string shown = std::string(what) + "='" + std::string(s) + "'";
    const char* syntax = " (a whole number of bytes, optionally with K, KiB, M, MiB, G or GiB; e.g. 8M)";
    const bool negative = !s.empty() && s[0] == '-';
    const std::size_t first = negative ? 1 : 0;
    std::size_t v = 0, i = first;
    bool over = false;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
      v = v * 10 + static_cast<std::size_t>(s[i] - '0');
      if (v > limit) over = true; // stays set: v may wrap afterwards, unread
    }
    if (i == first) raise(errc::invalid_argument, shown + " is not a number" + syntax);
    const std::string_view unit = s.substr(i);
    if (!unit.empty() && unit[0] == '.') raise(errc::invalid_argument, shown + " must be a whole number" + syntax);
    int shift = 0;
    if (unit == "K" || unit == "KiB") shift = 10;
    else if (unit == "M" || unit == "MiB") shift = 20;
    else if (unit == "G" || unit == "GiB") shift = 30;
    else if (!unit.empty())
      raise(errc::invalid_argument, shown + " has an unknown unit '" + std::string(unit) + "' (K, KiB, M, MiB, G or GiB: powers of 1024)");
    if (negative || (v == 0 && !over)) raise(errc::invalid_argument, shown + " must be positive" + syntax);
    if (over || v > (limit >> shift)) raise(errc::invalid_argument, shown + " is larger than 1 TiB");
    return v << shift;
  }

  void apply_algo_spec(std::string_view spec) {
    while (!spec.empty()) {
      const std::size_t comma = spec.find(',');
      std::string_view item = spec.substr(0, comma);
      spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
      const std::size_t eq = item.find('=');
      algo a;
      if (eq == std::string_view::npos) {
        if (!parse_algo(item, a)) raise(errc::invalid_argument, "BRAID_ALGO: unknown algorithm '" + std::string(item) + "'");
        with_algorithm(a);
        continue;
      }
      const std::string_view c = item.substr(0, eq), v = item.substr(eq + 1);
      if (!parse_algo(v, a)) raise(errc::invalid_argument, "BRAID_ALGO: unknown algorithm '" + std::string(v) + "'");
      bool found = false;
      for (int k = 0; k < 5; ++k)
        if (name(static_cast<collective>(k)) == c) { algorithm[k] = a; found = true; }
      if (!found) raise(errc::invalid_argument, "BRAID_ALGO: unknown collective '" + std::string(c) + "'");
    }
  }
};

// Per-call overrides.
struct call_options {
  algo algorithm = algo::automatic; // must be supported by the collective, else unsupported_error
};

} // namespace braid
