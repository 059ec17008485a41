// Simulates every schedule symbolically for nranks 1..64 and proves, per chunk and then per element:
// every rank's output holds each rank's contribution exactly once (reductions) or the owner's data
// (copies), the fully reduced value is finalised exactly once, every rank ends with the same reduction
// expression (so the same bits), reads of peers' data wait for the step that wrote it, every window
// slot is written at most once per round, peers read only published input chunks, in-place use never
// reads an input chunk after its output chunk was written, and no rank waits forever.
#include <doctest/doctest.h>

#include <braid/schedule/schedule.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace braid;
using namespace braid::schedule;

struct value {
  bool written = false;
  std::uint64_t mask = 0; // contributors (nranks <= 64)
  std::uint64_t expr = 0; // hash of the ordered expression that produced it
  int finals = 0;         // how many times finalize was applied
  int writer_step = -2;   // writer's step (-1: the round's input)
};

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

struct sim_config {
  collective coll;
  algo a;
  int n;
  int root;
  std::uint32_t pipeline;
  unsigned seed;
};

std::string describe(const sim_config& c) {
  std::ostringstream s;
  s << name(c.coll) << "/" << name(c.a) << " n=" << c.n << " root=" << c.root << " pipeline=" << c.pipeline
    << " seed=" << c.seed;
  return s.str();
}

bool in_covers(const sim_config& c, int r, std::uint32_t chunk) {
  switch (c.coll) {
  case collective::all_gather: return static_cast<int>(chunk) == r;
  case collective::broadcast: return r == c.root;
  default: return true;
  }
}
bool out_covers(const sim_config& c, int r, std::uint32_t chunk) {
  switch (c.coll) {
  case collective::reduce_scatter: return static_cast<int>(chunk) == r;
  case collective::reduce: return r == c.root;
  default: return true;
  }
}
bool reduces(collective c) {
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
}

// Returns an empty string on success, else the first violation.
template <class S> std::string simulate(const sim_config& cfg) {
  const int n = cfg.n;
  const std::uint32_t P = S::nchunks(cfg.coll, n, cfg.pipeline);
  const int nph = S::nphases(cfg.coll, n);
  std::vector<args> A(n);
  std::vector<int> nsteps(n), done(n, 0);
  // win[r][phase][chunk], out[r][chunk]
  std::vector<std::vector<std::vector<value>>> win(n, std::vector<std::vector<value>>(nph, std::vector<value>(P)));
  std::vector<std::vector<value>> out(n, std::vector<value>(P));
  auto input = [&](int r, std::uint32_t) {
    value v;
    v.written = true;
    v.mask = 1ULL << r;
    v.expr = mix(static_cast<std::uint64_t>(r) + 1);
    v.writer_step = -1;
    return v;
  };
  for (int r = 0; r < n; ++r) {
    A[r] = args{cfg.coll, n, r, cfg.root, P};
    nsteps[r] = S::nsteps(A[r]);
  }
  std::mt19937 rng(cfg.seed);
  std::ostringstream err;
  auto fail = [&](int r, int j, const std::string& what) {
    err << describe(cfg) << ": rank " << r << " step " << j << ": " << what;
    return err.str();
  };
  auto ready_ok = [&](int r, const step& st) {
    for (int i = 0; i < st.count_sources(n); ++i) {
      const source s = st.source_at(i);
      if (s.rank != r && done[s.rank] < s.ready + 1) return false;
    }
    return true;
  };
  for (;;) {
    std::vector<int> ready;
    bool finished = true;
    for (int r = 0; r < n; ++r) {
      if (done[r] >= nsteps[r]) continue;
      finished = false;
      if (ready_ok(r, S::at(A[r], done[r]))) ready.push_back(r);
    }
    if (finished) break;
    if (ready.empty()) return fail(-1, -1, "deadlock: no rank can proceed");
    const int r = ready[rng() % ready.size()];
    const int j = done[r];
    const step st = S::at(A[r], j);
    if (st.lo > st.hi || st.hi > P) return fail(r, j, "chunk range out of bounds");
    const int ns = st.count_sources(n);
    if (ns > 0 && st.lo == st.hi && (st.win >= 0 || st.out)) return fail(r, j, "empty step with destinations");
    for (std::uint32_t c = st.lo; c < st.hi; ++c) {
      if (ns == 0) return fail(r, j, "destination without source");
      value acc;
      for (int i = 0; i < ns; ++i) {
        const source s = st.source_at(i);
        if (s.rank < 0 || s.rank >= n) return fail(r, j, "source rank out of range");
        value v;
        if (s.reg == region::in) {
          if (!in_covers(cfg, s.rank, c)) return fail(r, j, "reads input chunk the rank does not have");
          if (s.rank != r && !S::in_published(A[s.rank], c))
            return fail(r, j, "reads unpublished input chunk " + std::to_string(c) + " of rank " + std::to_string(s.rank));
          if (s.rank == r && out[r][c].written && out_covers(cfg, r, c))
            return fail(r, j, "in-place hazard: reads own input chunk after writing that output chunk");
          v = input(s.rank, c);
        } else {
          if (s.phase >= nph) return fail(r, j, "window phase out of range");
          v = win[s.rank][s.phase][c];
          if (!v.written) return fail(r, j, "reads window slot never written");
          if (s.rank != r && v.writer_step > s.ready)
            return fail(r, j, "waits for step " + std::to_string(s.ready) + " but data is written at step " +
                                  std::to_string(v.writer_step));
          if (s.rank == r && v.writer_step >= j) return fail(r, j, "reads own slot written later");
        }
        if (i == 0) {
          acc = v;
        } else {
          if (acc.mask & v.mask) return fail(r, j, "a contribution is reduced twice");
          if (acc.finals || v.finals) return fail(r, j, "reduces an already finalised value");
          acc.mask |= v.mask;
          acc.expr = mix(acc.expr * 31 + v.expr + 0x9e37);
        }
      }
      if (st.final) {
        if (!reduces(cfg.coll)) return fail(r, j, "finalises in a non-reducing collective");
        if (acc.mask != (n == 64 ? ~0ULL : (1ULL << n) - 1)) return fail(r, j, "finalises a partial value");
        acc.finals++;
        acc.expr = mix(acc.expr ^ 0xf1a1);
      }
      acc.written = true;
      acc.writer_step = j;
      if (st.win >= 0) {
        if (st.win >= nph) return fail(r, j, "publishes to a phase out of range");
        value& slot = win[r][st.win][c];
        if (slot.written) return fail(r, j, "window slot written twice in one round");
        slot = acc;
      }
      if (st.out && out_covers(cfg, r, c)) {
        if (out[r][c].written) return fail(r, j, "output chunk written twice");
        out[r][c] = acc;
      }
    }
    ++done[r];
  }
  // Every rank's output: complete, correct and identical across ranks.
  const std::uint64_t all = n == 64 ? ~0ULL : (1ULL << n) - 1;
  for (std::uint32_t c = 0; c < P; ++c) {
    std::uint64_t expr = 0;
    bool have = false;
    for (int r = 0; r < n; ++r) {
      if (!out_covers(cfg, r, c)) continue;
      const value& v = out[r][c];
      if (!v.written) return fail(r, -1, "output chunk " + std::to_string(c) + " never written");
      if (reduces(cfg.coll)) {
        if (v.mask != all || v.finals != 1) return fail(r, -1, "output chunk not fully reduced exactly once");
      } else {
        const int owner = cfg.coll == collective::broadcast ? cfg.root : static_cast<int>(c);
        if (v.mask != (1ULL << owner) || v.expr != mix(static_cast<std::uint64_t>(owner) + 1))
          return fail(r, -1, "output chunk is not the owner's data");
      }
      if (have && v.expr != expr) return fail(r, -1, "ranks disagree on the reduction order (bits)");
      expr = v.expr;
      have = true;
    }
  }
  return {};
}

std::string simulate_any(const sim_config& cfg) {
  return with_schedule(cfg.a, [&](auto s) { return simulate<decltype(s)>(cfg); });
}

constexpr collective kColls[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                 collective::broadcast, collective::reduce};

} // namespace

TEST_CASE("every schedule is correct for nranks 2..64, roots and pipelines, random interleavings") {
  int runs = 0;
  for (int n = 2; n <= 64; ++n) {
    for (collective coll : kColls) {
      for (algo a : all_algos) {
        if (!supports(a, coll)) continue;
        std::set<int> roots = {0};
        if (coll == collective::broadcast || coll == collective::reduce) roots = {0, 1, n / 2, n - 1};
        for (int root : roots) {
          for (std::uint32_t pipe : {1u, 2u, 3u, 8u}) {
            const unsigned seeds = n <= 8 ? 4 : 1;
            for (unsigned seed = 0; seed < seeds; ++seed) {
              const sim_config cfg{coll, a, n, root, pipe, seed * 7919u + static_cast<unsigned>(n)};
              const std::string e = simulate_any(cfg);
              ++runs;
              if (!e.empty()) FAIL(e);
            }
          }
        }
      }
    }
  }
  MESSAGE("schedules simulated: " << runs);
}

TEST_CASE("barrier: dissemination reaches every rank") {
  for (int n = 1; n <= 64; ++n) {
    const int K = dissemination::nsteps(n);
    // seen[r] = set of ranks known to have entered when r finishes step k (transitive closure)
    std::vector<std::uint64_t> seen(n);
    for (int r = 0; r < n; ++r) seen[r] = 1ULL << r;
    for (int k = 0; k < K; ++k) {
      std::vector<std::uint64_t> next = seen;
      for (int r = 0; r < n; ++r) {
        const step st = dissemination::at(n, r, k);
        REQUIRE(st.nsrc == 1);
        REQUIRE(st.src[0].ready == k - 1);
        next[r] |= seen[st.src[0].rank];
      }
      seen = next;
    }
    const std::uint64_t all = n == 64 ? ~0ULL : (1ULL << n) - 1;
    for (int r = 0; r < n; ++r) CHECK(seen[r] == all);
  }
}

TEST_CASE("chunks and rounds cover every element exactly once") {
  // counts {0, 1, n-1, n+1, primes, a few million} for every n, every chunk count the schedules use.
  std::vector<std::uint64_t> primes = {2, 3, 7, 13, 101, 1009, 65537, 1000003, 3000017};
  int checked = 0;
  for (int n = 1; n <= 64; ++n) {
    std::vector<std::uint64_t> counts = {0, 1, static_cast<std::uint64_t>(n - 1), static_cast<std::uint64_t>(n + 1),
                                         4000000};
    counts.insert(counts.end(), primes.begin(), primes.end());
    for (std::uint64_t count : counts) {
      for (std::uint64_t per_round : {std::uint64_t{1}, std::uint64_t{64}, std::uint64_t{1000}, std::uint64_t{1} << 20}) {
        if (count / per_round > 100000) continue;
        for (std::uint32_t P : {1u, 2u, static_cast<std::uint32_t>(n), 8u}) {
          for (std::uint64_t unit : {std::uint64_t{1}, std::uint64_t{16}}) {
            std::uint64_t next = 0; // every element of [0, count) exactly once, in order
            bool ok = true;
            for (std::uint64_t k = 0; ok && k < nrounds(count, per_round); ++k) {
              const std::uint64_t base = k * per_round, len = round_len(count, per_round, k);
              ok = len >= 1;
              for (std::uint32_t c = 0; ok && c < P; ++c) {
                const chunk_span s = chunk_at(collective::all_reduce, len, P, c, unit);
                ok = base + s.begin == next && (!s.count || s.begin + s.count == len || (s.begin + s.count) % unit == 0);
                next += s.count;
              }
            }
            if (!ok || next != count)
              FAIL("partition broken: n=" << n << " count=" << count << " per_round=" << per_round << " P=" << P);
            ++checked;
          }
        }
      }
    }
  }
  MESSAGE("partitions checked: " << checked);
}
