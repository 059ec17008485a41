// Bootstrap: unique ids (round trip, parse errors, randomness), options::from_env (BRAID_TIMEOUT,
// BRAID_ALGO, BRAID_STAGING_BYTES), launch_info_from_env (torchrun, OpenMPI and Slurm variables,
// BRAID_UNIQUE_ID, missing or contradictory variables), the rendezvous wire format (round trips, and
// protocol_error for every malformed field), and the process rendezvous itself: 3 forked ranks join,
// also through communicator_from_env; a rank with a wrong secret, a rank with the wrong size and a
// foreign client are not admitted while the real ranks complete with a full set.
#include <doctest/doctest.h>

#include <braid/host/rendezvous/wire.hpp>
#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace {

using braid::errc;
using namespace std::chrono_literals;

// Sets and unsets environment variables for one scope; restores what was there before.
class env_scope {
public:
  env_scope() = default;
  env_scope(const env_scope&) = delete;
  env_scope& operator=(const env_scope&) = delete;
  ~env_scope() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }
  env_scope& set(const char* name, const std::string& value) {
    save(name);
    ::setenv(name, value.c_str(), 1);
    return *this;
  }
  env_scope& unset(const char* name) {
    save(name);
    ::unsetenv(name);
    return *this;
  }

private:
  void save(const char* name) {
    const char* v = std::getenv(name);
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Every variable options::from_env and launch_info_from_env read, unset.
void clean_env(env_scope& e) {
  for (const char* n : {"BRAID_TIMEOUT", "BRAID_SPIN", "BRAID_ALGO", "BRAID_STAGING_BYTES", "BRAID_DEBUG", "BRAID_UNIQUE_ID", "RANK",
                        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_MCA_ess_base_jobid",
                        "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"})
    e.unset(n);
}

// Checks that f raises exactly E with code `code`.
template <class E, class F> void expect_error(errc code, F&& f, const std::string& what) {
  INFO(what);
  bool raised = false;
  try {
    f();
  } catch (const E& e) {
    raised = true;
    CHECK(e.code() == code);
  } catch (const std::exception& e) {
    raised = true;
    FAIL_CHECK("wrong exception: " << e.what());
  }
  CHECK_MESSAGE(raised, "no exception");
}
template <class F> void expect_invalid(F&& f, const std::string& what) {
  expect_error<braid::invalid_argument>(errc::invalid_argument, f, what);
}
template <class F> void expect_protocol(F&& f, const std::string& what) {
  expect_error<braid::protocol_error>(errc::protocol, f, what);
}

// The message of the braid::invalid_argument that f raises; empty when it raises none (any other
// exception leaves the case, which fails it).
template <class F> std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const braid::invalid_argument& e) {
    return e.what();
  }
  return {};
}

// launch_info_from_env() in the environment as it is: checks its rank and size, and that its id is
// derived from the launcher's variables (not given by BRAID_UNIQUE_ID). `launcher` names the case.
braid::launch_info derived_launch_info(const char* launcher, int rank, int size) {
  INFO(launcher);
  const braid::launch_info li = braid::launch_info_from_env();
  CHECK(li.rank == rank);
  CHECK(li.size == size);
  CHECK(li.derived_id);
  return li;
}

// Checks that `message` contains `says`; a failure prints both.
void check_says(const std::string& message, const std::string& says) {
  CHECK_MESSAGE(message.find(says) != std::string::npos, "got: " << message << "\nwant: " << says);
}

} // namespace

// ---- unique_id ----------------------------------------------------------------------------------------

TEST_CASE("unique_id: generate, to_string and parse round trip") {
  const braid::unique_id id = braid::unique_id::generate();
  const std::string s = id.to_string();
  CHECK(s.size() == 64);
  for (char ch : s) CHECK(((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')));
  CHECK(braid::unique_id::parse(s) == id);
  std::string upper = s;
  for (char& ch : upper)
    if (ch >= 'a' && ch <= 'f') ch = static_cast<char>(ch - 'a' + 'A');
  CHECK(braid::unique_id::parse(upper) == id);
  CHECK(id.socket_name() == "braid-" + s.substr(0, 32)); // the name only: the secret is never exposed
  CHECK(id.socket_name().find(s.substr(32)) == std::string::npos);

  braid::unique_id zero;
  CHECK(zero.to_string() == std::string(64, '0'));
  CHECK(braid::unique_id::parse(std::string(64, '0')) == zero);
}

TEST_CASE("unique_id: two generated ids differ in name and in secret") {
  const braid::unique_id a = braid::unique_id::generate(), b = braid::unique_id::generate();
  CHECK_FALSE(a == b);
  CHECK(a.name != b.name);
  CHECK(a.secret != b.secret);
  CHECK(a.name != a.secret);
}

TEST_CASE("unique_id: derive is deterministic and depends on the key") {
  CHECK(braid::unique_id::derive("torch:host:29500:") == braid::unique_id::derive("torch:host:29500:"));
  CHECK_FALSE(braid::unique_id::derive("torch:host:29500:") == braid::unique_id::derive("torch:host:29501:"));
  CHECK_FALSE(braid::unique_id::derive("a") == braid::unique_id::derive("b"));
}

TEST_CASE("unique_id: parse errors") {
  const std::string good = braid::unique_id::generate().to_string();
  expect_invalid([] { (void)braid::unique_id::parse(""); }, "empty");
  expect_invalid([&] { (void)braid::unique_id::parse(good.substr(0, 63)); }, "63 digits");
  expect_invalid([&] { (void)braid::unique_id::parse(good + "0"); }, "65 digits");
  expect_invalid([&] { (void)braid::unique_id::parse(good.substr(0, 32)); }, "32 digits (name only)");
  for (char bad : {'g', 'G', 'x', ' ', '-', ':', '\0', '\xff'})
    for (std::size_t pos : {std::size_t{0}, std::size_t{31}, std::size_t{32}, std::size_t{63}}) {
      std::string s = good;
      s[pos] = bad;
      expect_invalid([&] { (void)braid::unique_id::parse(s); },
                     "non-hex character " + std::to_string(static_cast<int>(bad)) + " at " + std::to_string(pos));
    }
  expect_invalid([&] { (void)braid::unique_id::parse("0x" + good.substr(2)); }, "0x prefix");
}

// ---- options::from_env --------------------------------------------------------------------------------

TEST_CASE("options::from_env: defaults when nothing is set") {
  env_scope env;
  clean_env(env);
  const braid::options o = braid::options::from_env();
  CHECK(o.timeout == std::chrono::seconds(300));
  for (auto a : o.algorithm) CHECK(a == braid::algo::automatic);
  CHECK(o.staging_bytes == std::size_t{8} << 20);
  CHECK(o.p2p_bytes == std::size_t{1} << 20);
  CHECK_FALSE(o.debug);
  env.set("BRAID_TIMEOUT", "").set("BRAID_ALGO", "").set("BRAID_STAGING_BYTES", ""); // empty = unset
  const braid::options e = braid::options::from_env();
  CHECK(e.timeout == std::chrono::seconds(300));
  CHECK(e.staging_bytes == std::size_t{8} << 20);
}

TEST_CASE("options::from_env: BRAID_TIMEOUT") {
  env_scope env;
  clean_env(env);
  const std::pair<const char*, std::chrono::nanoseconds> good[] = {
      {"30", 30s}, {"500ms", 500ms}, {"2m", 120s}, {"2min", 120s}, {"10s", 10s}, {"1.5", 1500ms},
      {"250us", 250us}, {"0.25s", 250ms}, {"1", 1s}};
  for (const auto& [text, want] : good) {
    env.set("BRAID_TIMEOUT", text);
    CHECK_MESSAGE(braid::options::from_env().timeout == want, text);
  }
  for (const char* bad : {"garbage", "abc", "-5", "0", "0ms", "10x", "ms", "s", "5h", "1 s", " 1", "1e3", "1,5", ".", "10 ms"}) {
    env.set("BRAID_TIMEOUT", bad);
    expect_invalid([] { (void)braid::options::from_env(); }, std::string("BRAID_TIMEOUT=") + bad);
  }
}

TEST_CASE("options::from_env: BRAID_ALGO") {
  using braid::algo;
  using braid::collective;
  env_scope env;
  clean_env(env);
  auto at = [](const braid::options& o, collective c) { return o.algorithm[static_cast<int>(c)]; };

  env.set("BRAID_ALGO", "ring");
  braid::options o = braid::options::from_env();
  for (auto a : o.algorithm) CHECK(a == algo::ring);

  env.set("BRAID_ALGO", "all_reduce=two_shot,broadcast=tree");
  o = braid::options::from_env();
  CHECK(at(o, collective::all_reduce) == algo::two_shot);
  CHECK(at(o, collective::broadcast) == algo::tree);
  CHECK(at(o, collective::reduce) == algo::automatic);
  CHECK(at(o, collective::reduce_scatter) == algo::automatic);
  CHECK(at(o, collective::all_gather) == algo::automatic);

  env.set("BRAID_ALGO", "reduce_scatter=direct,all_gather=hd,reduce=tree,all_reduce=oneshot");
  o = braid::options::from_env();
  CHECK(at(o, collective::reduce_scatter) == algo::direct);
  CHECK(at(o, collective::all_gather) == algo::halving_doubling);
  CHECK(at(o, collective::reduce) == algo::tree);
  CHECK(at(o, collective::all_reduce) == algo::one_shot);

  env.set("BRAID_ALGO", "tree,all_reduce=ring"); // a default for all, then one override
  o = braid::options::from_env();
  CHECK(at(o, collective::all_reduce) == algo::ring);
  CHECK(at(o, collective::broadcast) == algo::tree);

  for (const char* bad : {"bogus", "Ring", "all_reduce=bogus", "bogus=ring", "all_reduce=", "=ring", "all_reduce:ring",
                          "all_reduce=two_shot,bogus", "ring,,tree", "barrier=ring", "send_recv=ring", " ring"}) {
    env.set("BRAID_ALGO", bad);
    expect_invalid([] { (void)braid::options::from_env(); }, std::string("BRAID_ALGO=") + bad);
  }
}

TEST_CASE("options::from_env: BRAID_ALGO reaches the communicator's algorithm choice") {
  env_scope env;
  clean_env(env);
  env.set("BRAID_ALGO", "all_reduce=two_shot,broadcast=tree");
  const braid::options o = braid::options::from_env();
  braid::run_threads(2, [](braid::communicator& c) {
    CHECK(c.algorithm_for(braid::collective::all_reduce, 8) == braid::algo::two_shot);
    CHECK(c.algorithm_for(braid::collective::all_reduce, 8 << 20) == braid::algo::two_shot);
    CHECK(c.algorithm_for(braid::collective::broadcast, 8) == braid::algo::tree);
    CHECK(c.algorithm_for(braid::collective::all_reduce, 8, braid::algo::ring) == braid::algo::ring); // per call wins
    std::vector<double> v(1000, c.rank() + 1.0);
    c.all_reduce(std::span<double>(v));
    CHECK(v[999] == 3.0);
    c.broadcast(std::span<double>(v), 1);
    CHECK(v[0] == 3.0);
  }, o);
}

TEST_CASE("options::from_env: BRAID_STAGING_BYTES") {
  env_scope env;
  clean_env(env);
  const std::pair<const char*, std::size_t> good[] = {
      {"65536", 65536}, {"64K", 64u << 10}, {"64KiB", 64u << 10}, {"16M", 16u << 20}, {"16MiB", 16u << 20},
      {"2G", std::size_t{2} << 30}, {"1GiB", std::size_t{1} << 30}};
  for (const auto& [text, want] : good) {
    env.set("BRAID_STAGING_BYTES", text);
    CHECK_MESSAGE(braid::options::from_env().staging_bytes == want, text);
  }
  // Malformed, and well-formed but below the 64 KiB minimum.
  for (const char* bad : {"abc", "0", "0M", "12Q", "K", "M", "-1", "1.5M", "16 M", "16m", "16MB", "4096", "65535", "63K"}) {
    env.set("BRAID_STAGING_BYTES", bad);
    expect_invalid([] { (void)braid::options::from_env(); }, std::string("BRAID_STAGING_BYTES=") + bad);
  }
  env.unset("BRAID_STAGING_BYTES");
  CHECK(braid::options::from_env().staging_bytes == std::size_t{8} << 20);

  // It sizes the communicator: two staging halves of half of it, plus the send buffer.
  env.set("BRAID_STAGING_BYTES", "16M");
  braid::run_threads(1, [](braid::communicator& c) {
    CHECK(c.memory_bytes() == (std::size_t{16} << 20) + (std::size_t{1} << 20));
  }, braid::options::from_env());
}

// ---- launch_info_from_env ----------------------------------------------------------------------------

TEST_CASE("launch_info_from_env: torchrun variables") {
  env_scope env;
  clean_env(env);
  env.set("RANK", "1").set("WORLD_SIZE", "4").set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", "29500");
  const braid::launch_info li = derived_launch_info("torchrun", 1, 4);
  CHECK(braid::launch_info_from_env().id == li.id); // every rank of the job derives the same id

  env.set("RANK", "3");
  CHECK(braid::launch_info_from_env().id == li.id); // independent of the rank
  env.set("MASTER_PORT", "29501");
  CHECK_FALSE(braid::launch_info_from_env().id == li.id);
  env.set("MASTER_PORT", "29500").set("TORCHELASTIC_RUN_ID", "job-7");
  CHECK_FALSE(braid::launch_info_from_env().id == li.id);

  env.set("LOCAL_WORLD_SIZE", "4").set("LOCAL_RANK", "3");
  CHECK(braid::launch_info_from_env().size == 4);
}

TEST_CASE("launch_info_from_env: BRAID_UNIQUE_ID takes precedence and is not derived") {
  env_scope env;
  clean_env(env);
  const braid::unique_id id = braid::unique_id::generate();
  env.set("RANK", "0").set("WORLD_SIZE", "2").set("BRAID_UNIQUE_ID", id.to_string());
  braid::launch_info li = braid::launch_info_from_env();
  CHECK(li.id == id);
  CHECK_FALSE(li.derived_id);
  CHECK(li.rank == 0);
  CHECK(li.size == 2);
  env.set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", "29500");
  li = braid::launch_info_from_env();
  CHECK(li.id == id);
  CHECK_FALSE(li.derived_id);
  env.set("BRAID_UNIQUE_ID", id.to_string().substr(1));
  expect_invalid([] { (void)braid::launch_info_from_env(); }, "malformed BRAID_UNIQUE_ID");
}

TEST_CASE("launch_info_from_env: OpenMPI and Slurm variables") {
  {
    env_scope env;
    clean_env(env);
    env.set("OMPI_COMM_WORLD_RANK", "2").set("OMPI_COMM_WORLD_SIZE", "3").set("OMPI_MCA_ess_base_jobid", "12345");
    (void)derived_launch_info("OpenMPI", 2, 3);
    env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "1");
    expect_error<braid::unsupported_error>(errc::unsupported, [] { (void)braid::launch_info_from_env(); },
                                           "OMPI_COMM_WORLD_LOCAL_SIZE=1 of 3");
  }
  {
    env_scope env;
    clean_env(env);
    env.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "2").set("SLURM_JOB_ID", "99");
    const braid::launch_info li = derived_launch_info("Slurm", 0, 2);
    env.set("SLURM_STEP_ID", "1");
    CHECK_FALSE(braid::launch_info_from_env().id == li.id);
  }
  {
    env_scope env;
    clean_env(env);
    env.set("PMI_RANK", "1").set("PMI_SIZE", "2").set("PMIX_NAMESPACE", "ns");
    CHECK(braid::launch_info_from_env().rank == 1);
  }
  {
    env_scope env; // RANK/WORLD_SIZE win over the MPI variables
    clean_env(env);
    env.set("RANK", "1").set("WORLD_SIZE", "2").set("OMPI_COMM_WORLD_RANK", "0").set("OMPI_COMM_WORLD_SIZE", "5");
    env.set("MASTER_ADDR", "h").set("MASTER_PORT", "1");
    const braid::launch_info li = braid::launch_info_from_env();
    CHECK(li.rank == 1);
    CHECK(li.size == 2);
  }
}

TEST_CASE("launch_info_from_env: missing or contradictory variables") {
  env_scope env;
  clean_env(env);
  expect_invalid([] { (void)braid::launch_info_from_env(); }, "nothing set");
  env.set("RANK", "0");
  expect_invalid([] { (void)braid::launch_info_from_env(); }, "no WORLD_SIZE");
  env.unset("RANK").set("WORLD_SIZE", "2");
  expect_invalid([] { (void)braid::launch_info_from_env(); }, "no RANK");
  env.set("RANK", "0");
  expect_invalid([] { (void)braid::launch_info_from_env(); }, "no BRAID_UNIQUE_ID, MASTER_ADDR or job id");
  env.set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", "29500");
  CHECK_NOTHROW((void)braid::launch_info_from_env());
  for (const auto& [rank, size] : {std::pair<const char*, const char*>{"2", "2"}, {"5", "2"}, {"-1", "2"}, {"abc", "2"},
                                   {"0", "0"}, {"0", "x"}, {"1 ", "2"}, {"0", "-2"}, {"0", "99999999999"}}) {
    env.set("RANK", rank).set("WORLD_SIZE", size);
    expect_invalid([] { (void)braid::launch_info_from_env(); }, std::string("RANK=") + rank + " WORLD_SIZE=" + size);
  }
  env.set("RANK", "0").set("WORLD_SIZE", "4").set("LOCAL_WORLD_SIZE", "2");
  expect_error<braid::unsupported_error>(errc::unsupported, [] { (void)braid::launch_info_from_env(); },
                                         "LOCAL_WORLD_SIZE 2 != WORLD_SIZE 4");
  env.set("LOCAL_WORLD_SIZE", "8");
  expect_error<braid::unsupported_error>(errc::unsupported, [] { (void)braid::launch_info_from_env(); },
                                         "LOCAL_WORLD_SIZE 8 != WORLD_SIZE 4");
  env.set("LOCAL_WORLD_SIZE", "many");
  expect_invalid([] { (void)braid::launch_info_from_env(); }, "LOCAL_WORLD_SIZE not a number");
}

// Issue 18: a bad value's message says what is wrong with it (not "cannot parse" for a value that
// parses), and names the variable and the value.
TEST_CASE("bad environment values: each message says what is wrong with the value") {
  struct bad_value {
    const char* var;
    const char* value;
    const char* says;
  };
  const bad_value cases[] = {
      {"BRAID_TIMEOUT", "0", "BRAID_TIMEOUT='0' must be positive"},
      {"BRAID_TIMEOUT", "0ms", "BRAID_TIMEOUT='0ms' must be positive"},
      {"BRAID_TIMEOUT", "0.0", "BRAID_TIMEOUT='0.0' must be positive"},
      {"BRAID_TIMEOUT", "-5", "BRAID_TIMEOUT='-5' must be positive"},
      {"BRAID_TIMEOUT", "-1.5s", "BRAID_TIMEOUT='-1.5s' must be positive"},
      {"BRAID_TIMEOUT", "abc", "BRAID_TIMEOUT='abc' is not a number"},
      {"BRAID_TIMEOUT", "ms", "BRAID_TIMEOUT='ms' is not a number"},
      {"BRAID_TIMEOUT", ".", "BRAID_TIMEOUT='.' is not a number"},
      {"BRAID_TIMEOUT", " 1", "BRAID_TIMEOUT=' 1' is not a number"},
      {"BRAID_TIMEOUT", "10x", "BRAID_TIMEOUT='10x' has an unknown unit 'x' (s, ms, us, m or min"},
      {"BRAID_TIMEOUT", "5h", "BRAID_TIMEOUT='5h' has an unknown unit 'h'"},
      {"BRAID_TIMEOUT", "1e3", "BRAID_TIMEOUT='1e3' has an unknown unit 'e3'"},
      {"BRAID_TIMEOUT", "10 ms", "BRAID_TIMEOUT='10 ms' has an unknown unit ' ms'"},
      {"BRAID_TIMEOUT", "99999999999", "BRAID_TIMEOUT='99999999999' is too large (at most 10^18 ns"},
      {"BRAID_SPIN", "0", "BRAID_SPIN='0' must be positive"},
      {"BRAID_SPIN", "fast", "BRAID_SPIN='fast' is not a number"},
      {"BRAID_SPIN", "5h", "BRAID_SPIN='5h' has an unknown unit 'h'"},
      {"BRAID_STAGING_BYTES", "0", "BRAID_STAGING_BYTES='0' must be positive"},
      {"BRAID_STAGING_BYTES", "-1", "BRAID_STAGING_BYTES='-1' must be positive"},
      {"BRAID_STAGING_BYTES", "4096", "BRAID_STAGING_BYTES='4096' is below the minimum of 64K (65536 bytes)"},
      {"BRAID_STAGING_BYTES", "63K", "BRAID_STAGING_BYTES='63K' is below the minimum of 64K"},
      {"BRAID_STAGING_BYTES", "abc", "BRAID_STAGING_BYTES='abc' is not a number"},
      {"BRAID_STAGING_BYTES", "16m", "BRAID_STAGING_BYTES='16m' has an unknown unit 'm' (K, KiB, M, MiB, G or GiB"},
      {"BRAID_STAGING_BYTES", "16MB", "BRAID_STAGING_BYTES='16MB' has an unknown unit 'MB'"},
      {"BRAID_STAGING_BYTES", "1.5M", "BRAID_STAGING_BYTES='1.5M' must be a whole number"},
      {"BRAID_STAGING_BYTES", "2048G", "BRAID_STAGING_BYTES='2048G' is larger than 1 TiB"},
      {"BRAID_STAGING_BYTES", "99999999999999999999999", "BRAID_STAGING_BYTES='99999999999999999999999' is larger than 1 TiB"},
      {"BRAID_ALGO", "bogus", "BRAID_ALGO: unknown algorithm 'bogus'"},
      {"BRAID_ALGO", "bogus=ring", "BRAID_ALGO: unknown collective 'bogus'"},
  };
  // Each case over a clean environment, after what `prepare` sets: c.var = c.value makes parse()
  // raise invalid_argument saying c.says. INFO names the variable and the value.
  const auto check_each = [](const auto& list, auto prepare, auto parse) {
    for (const bad_value& c : list) {
      env_scope env;
      clean_env(env);
      prepare(env);
      env.set(c.var, c.value);
      INFO(c.var << "=" << c.value);
      check_says(invalid_argument_message(parse), c.says);
    }
  };
  check_each(cases, [](env_scope&) {}, [] { (void)braid::options::from_env(); });

  // A good BRAID_SPIN sets options::spin (the default is 200 us).
  {
    env_scope env;
    clean_env(env);
    CHECK(braid::options::from_env().spin == std::chrono::microseconds(200));
    env.set("BRAID_SPIN", "1.5ms");
    CHECK(braid::options::from_env().spin == std::chrono::microseconds(1500));
  }

  // The launcher's variables: named, with the value and what is wrong with it.
  const bad_value launch[] = {
      {"RANK", "-1", "RANK='-1' must not be negative"},
      {"RANK", "abc", "RANK='abc' is not a number"},
      {"RANK", "1 ", "RANK='1 ' is not a number"},
      {"RANK", "2", "RANK='2' must be below WORLD_SIZE='2'"},
      {"WORLD_SIZE", "0", "WORLD_SIZE='0' must be at least 1"},
      {"WORLD_SIZE", "-2", "WORLD_SIZE='-2' must be at least 1"},
      {"WORLD_SIZE", "x", "WORLD_SIZE='x' is not a number"},
      {"WORLD_SIZE", "99999999999", "WORLD_SIZE='99999999999' is too large (at most 1048576)"},
      {"LOCAL_WORLD_SIZE", "many", "LOCAL_WORLD_SIZE='many' is not a number"},
      {"BRAID_UNIQUE_ID", "12ab", "BRAID_UNIQUE_ID: unique id must be 64 hex digits, got 4 characters"},
  };
  const auto launch_info = [] { (void)braid::launch_info_from_env(); };
  check_each(launch, [](env_scope& env) {
    env.set("RANK", "0").set("WORLD_SIZE", "2").set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", "29500");
  }, launch_info);
  {
    env_scope env;
    clean_env(env);
    env.set("OMPI_COMM_WORLD_RANK", "x1").set("OMPI_COMM_WORLD_SIZE", "2").set("OMPI_MCA_ess_base_jobid", "1");
    check_says(invalid_argument_message(launch_info), "OMPI_COMM_WORLD_RANK='x1' is not a number");
  }
}

// ---- a socket whose peer is gone ------------------------------------------------------------------------

// Issue 18: end of file, ECONNRESET and EPIPE all mean the peer closed its end or died; each is the
// documented protocol_error, carrying the caller's context (rank, call, sequence, peer) and the errno.
namespace {
struct closed_peer {
  int code = 0, rank = -2, peer = -2, sys_errno = -1;
  std::uint64_t seq = 0;
  std::string collective, what;
};
template <class F> closed_peer catch_closed(F&& f) {
  closed_peer o;
  try {
    f();
  } catch (const braid::error& e) {
    o = closed_peer{static_cast<int>(e.code()), e.rank(), e.peer(), e.sys_errno(), e.sequence(), std::string(e.collective()), e.what()};
  }
  return o;
}
void check_closed(const closed_peer& o, int want_errno) {
  INFO(o.what);
  CHECK(o.code == static_cast<int>(errc::protocol));
  CHECK(o.rank == 3);
  CHECK(o.peer == 5);
  CHECK(o.collective == "alloc");
  CHECK(o.seq == 7);
  CHECK(o.sys_errno == want_errno);
  CHECK(o.what.find("rank 5 closed the connection (it closed its communicator, or it died)") != std::string::npos);
}
} // namespace

TEST_CASE("socket errors: a peer that closed or died is protocol_error naming it, whatever errno the socket gave") {
  namespace hd = braid::host::detail;
  const braid::error_context who{3, "alloc", 7, 5};
  const auto deadline = hd::clock::now() + std::chrono::seconds(5);
  std::byte buf[16];

  { // end of file: the peer closed with nothing unread
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    ::close(sv[1]);
    check_closed(catch_closed([&] { hd::recv_all(sv[0], buf, sizeof buf, nullptr, deadline, who); }), 0);
    ::close(sv[0]);
  }
  { // ECONNRESET: the peer's process went with bytes of ours unread in its socket
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE(::send(sv[0], "x", 1, MSG_NOSIGNAL) == 1);
    ::close(sv[1]);
    check_closed(catch_closed([&] { hd::recv_all(sv[0], buf, sizeof buf, nullptr, deadline, who); }), ECONNRESET);
    ::close(sv[0]);
  }
  { // EPIPE: sending to a peer that closed its end
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    ::close(sv[1]);
    const std::vector<std::byte> msg(64, std::byte{1});
    check_closed(catch_closed([&] { hd::send_all(sv[0], msg, {}, deadline, who); }), EPIPE);
    ::close(sv[0]);
  }
  // The mapping itself: these four errnos mean the other end is gone; others stay system_error.
  for (int e : {ECONNRESET, EPIPE, ECONNABORTED, ENOTCONN}) {
    CHECK(hd::peer_gone_errno(e));
    check_closed(catch_closed([&] { hd::raise_socket_errno("recvmsg", __FILE__, __LINE__, e, who); }), e);
  }
  for (int e : {EBADF, ENOMEM, EINVAL}) {
    CHECK_FALSE(hd::peer_gone_errno(e));
    const closed_peer o = catch_closed([&] { hd::raise_socket_errno("recvmsg", __FILE__, __LINE__, e, who); });
    CHECK(o.code == static_cast<int>(errc::system));
    CHECK(o.peer == 5);
    CHECK(o.sys_errno == e);
  }
  // During join a closed connection means refused or dead; before a hello the peer is not known.
  const closed_peer j = catch_closed([] { hd::raise_peer_closed(braid::error_context{0, "rendezvous", 0, -1}, 0); });
  CHECK(j.code == static_cast<int>(errc::protocol));
  CHECK(j.what.find("the peer closed the connection (it refused this rank, or it died)") != std::string::npos);
}

// ---- wire format --------------------------------------------------------------------------------------

namespace {
namespace wire = braid::wire;

wire::hello sample_hello() {
  wire::hello h{};
  for (int i = 0; i < 16; ++i) h.secret[i] = static_cast<std::uint8_t>(0xA0 + i);
  h.rank = 2;
  h.nranks = 3;
  h.pid = 4242;
  h.reserved = 0;
  return h;
}

wire::welcome sample_welcome() {
  wire::welcome w;
  w.fixed = wire::welcome_fixed{std::uint64_t{40} << 20, std::uint64_t{4} << 20, std::uint64_t{1} << 20, 3, 0};
  w.pids = {100, 200, 300};
  return w;
}

wire::header header_of(const std::vector<std::byte>& m) {
  wire::header h;
  std::memcpy(&h, m.data(), sizeof h);
  return h;
}
std::vector<std::byte> with_header(std::vector<std::byte> m, const wire::header& h) {
  std::memcpy(m.data(), &h, sizeof h);
  return m;
}
} // namespace

TEST_CASE("wire: hello and welcome round trip") {
  const wire::hello h = sample_hello();
  const auto m = wire::encode_hello(h);
  REQUIRE(m.size() == sizeof(wire::header) + sizeof(wire::hello));
  const wire::header hd = header_of(m);
  CHECK(hd.magic == wire::magic);
  CHECK(hd.version == wire::version);
  CHECK(hd.type == static_cast<std::uint16_t>(wire::msg_type::hello));
  CHECK(hd.reserved == 0);
  CHECK(wire::parse_header(m.data(), sizeof(wire::header), wire::msg_type::hello) == sizeof(wire::hello));
  const wire::hello p = wire::parse_hello(m.data() + sizeof(wire::header), sizeof(wire::hello));
  CHECK(std::memcmp(p.secret, h.secret, 16) == 0);
  CHECK(p.rank == h.rank);
  CHECK(p.nranks == h.nranks);
  CHECK(p.pid == h.pid);

  const wire::welcome w = sample_welcome();
  const auto wm = wire::encode_welcome(w);
  const std::uint32_t len = wire::parse_header(wm.data(), wm.size(), wire::msg_type::welcome);
  REQUIRE(len == sizeof(wire::welcome_fixed) + 3 * sizeof(std::int32_t));
  REQUIRE(wm.size() == sizeof(wire::header) + len);
  const wire::welcome q = wire::parse_welcome(wm.data() + sizeof(wire::header), len);
  CHECK(q.fixed.total_bytes == w.fixed.total_bytes);
  CHECK(q.fixed.half_bytes == w.fixed.half_bytes);
  CHECK(q.fixed.p2p_bytes == w.fixed.p2p_bytes);
  CHECK(q.fixed.nranks == 3);
  CHECK(q.pids == w.pids);

  // The limits themselves are accepted: 1 rank, and max_ranks ranks.
  wire::hello one = sample_hello();
  one.rank = 0;
  one.nranks = 1;
  CHECK(wire::parse_hello(wire::encode_hello(one).data() + sizeof(wire::header), sizeof(wire::hello)).nranks == 1);
  wire::welcome big = sample_welcome();
  big.fixed.nranks = static_cast<std::int32_t>(wire::max_ranks);
  big.pids.assign(wire::max_ranks, 7);
  const auto bm = wire::encode_welcome(big);
  const std::uint32_t blen = wire::parse_header(bm.data(), bm.size(), wire::msg_type::welcome);
  CHECK(wire::parse_welcome(bm.data() + sizeof(wire::header), blen).pids.size() == wire::max_ranks);
}

TEST_CASE("wire: malformed headers are rejected with protocol_error") {
  const auto m = wire::encode_hello(sample_hello());
  const auto wm = wire::encode_welcome(sample_welcome());
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{8}, sizeof(wire::header) - 1})
    expect_protocol([&] { (void)wire::parse_header(m.data(), n, wire::msg_type::hello); },
                    "truncated header of " + std::to_string(n) + " bytes");

  wire::header h = header_of(m);
  h.magic = 0x5a445243;
  expect_protocol([&] { (void)wire::parse_header(with_header(m, h).data(), m.size(), wire::msg_type::hello); }, "bad magic");
  h = header_of(m);
  h.magic = 0;
  expect_protocol([&] { (void)wire::parse_header(with_header(m, h).data(), m.size(), wire::msg_type::hello); }, "zero magic");

  for (std::uint16_t v : {std::uint16_t{0}, static_cast<std::uint16_t>(wire::version - 1), static_cast<std::uint16_t>(wire::version + 1),
                          std::uint16_t{0xffff}}) {
    h = header_of(m);
    h.version = v;
    expect_protocol([&] { (void)wire::parse_header(with_header(m, h).data(), m.size(), wire::msg_type::hello); },
                    "version " + std::to_string(v));
  }

  expect_protocol([&] { (void)wire::parse_header(m.data(), m.size(), wire::msg_type::welcome); }, "hello where a welcome is expected");
  expect_protocol([&] { (void)wire::parse_header(wm.data(), wm.size(), wire::msg_type::hello); }, "welcome where a hello is expected");
  for (std::uint16_t t : {std::uint16_t{0}, std::uint16_t{3}, std::uint16_t{0x100}}) {
    h = header_of(m);
    h.type = t;
    expect_protocol([&] { (void)wire::parse_header(with_header(m, h).data(), m.size(), wire::msg_type::hello); },
                    "type " + std::to_string(t));
  }

  for (std::uint32_t len : {std::uint32_t{sizeof(wire::hello) + 1}, std::uint32_t{1} << 20, ~std::uint32_t{0}}) {
    h = header_of(m);
    h.length = len;
    expect_protocol([&] { (void)wire::parse_header(with_header(m, h).data(), m.size(), wire::msg_type::hello); },
                    "hello length " + std::to_string(len));
  }
  const std::uint32_t welcome_max = sizeof(wire::welcome_fixed) + wire::max_ranks * sizeof(std::int32_t);
  for (std::uint32_t len : {welcome_max + 1, welcome_max + 4, ~std::uint32_t{0}}) {
    wire::header wh = header_of(wm);
    wh.length = len;
    expect_protocol([&] { (void)wire::parse_header(with_header(wm, wh).data(), wm.size(), wire::msg_type::welcome); },
                    "welcome length " + std::to_string(len));
  }
  {
    wire::header wh = header_of(wm);
    wh.length = welcome_max;
    CHECK(wire::parse_header(with_header(wm, wh).data(), wm.size(), wire::msg_type::welcome) == welcome_max);
  }

  for (std::uint32_t r : {std::uint32_t{1}, std::uint32_t{0x80000000u}}) {
    h = header_of(m);
    h.reserved = r;
    expect_protocol([&] { (void)wire::parse_header(with_header(m, h).data(), m.size(), wire::msg_type::hello); },
                    "reserved " + std::to_string(r));
  }
}

TEST_CASE("wire: malformed payloads are rejected with protocol_error") {
  const auto m = wire::encode_hello(sample_hello());
  const std::byte* hp = m.data() + sizeof(wire::header);
  for (std::size_t n : {std::size_t{0}, sizeof(wire::hello) - 1, sizeof(wire::hello) + 1})
    expect_protocol([&] {
      std::vector<std::byte> buf(sizeof(wire::hello) + 1);
      std::memcpy(buf.data(), hp, sizeof(wire::hello));
      (void)wire::parse_hello(buf.data(), n);
    }, "hello payload of " + std::to_string(n) + " bytes");

  auto bad_hello = [&](auto mutate, const std::string& what) {
    wire::hello h = sample_hello();
    mutate(h);
    const auto bm = wire::encode_hello(h);
    expect_protocol([&] { (void)wire::parse_hello(bm.data() + sizeof(wire::header), sizeof(wire::hello)); }, what);
  };
  bad_hello([](wire::hello& h) { h.rank = -1; }, "hello rank -1");
  bad_hello([](wire::hello& h) { h.rank = h.nranks; }, "hello rank == nranks");
  bad_hello([](wire::hello& h) { h.rank = 1 << 30; }, "hello rank huge");
  bad_hello([](wire::hello& h) { h.nranks = 0; h.rank = 0; }, "hello nranks 0");
  bad_hello([](wire::hello& h) { h.nranks = -3; h.rank = 0; }, "hello nranks -3");
  bad_hello([](wire::hello& h) { h.nranks = static_cast<std::int32_t>(wire::max_ranks) + 1; }, "hello nranks max + 1");
  bad_hello([](wire::hello& h) { h.pid = 0; }, "hello pid 0");
  bad_hello([](wire::hello& h) { h.pid = -7; }, "hello pid -7");

  const auto wm = wire::encode_welcome(sample_welcome());
  const std::byte* wp = wm.data() + sizeof(wire::header);
  const std::size_t wlen = wm.size() - sizeof(wire::header);
  for (std::size_t n : {std::size_t{0}, sizeof(wire::welcome_fixed) - 1, sizeof(wire::welcome_fixed), wlen - 1, wlen - 4})
    expect_protocol([&] { (void)wire::parse_welcome(wp, n); }, "welcome payload of " + std::to_string(n) + " bytes");
  expect_protocol([&] {
    std::vector<std::byte> longer(wlen + 4);
    std::memcpy(longer.data(), wp, wlen);
    (void)wire::parse_welcome(longer.data(), longer.size());
  }, "welcome payload 4 bytes longer than nranks says");

  auto bad_welcome = [&](auto mutate, const std::string& what) {
    wire::welcome w = sample_welcome();
    mutate(w);
    const auto bm = wire::encode_welcome(w);
    expect_protocol([&] { (void)wire::parse_welcome(bm.data() + sizeof(wire::header), bm.size() - sizeof(wire::header)); }, what);
  };
  bad_welcome([](wire::welcome& w) { w.fixed.nranks = 0; w.pids.clear(); }, "welcome nranks 0");
  bad_welcome([](wire::welcome& w) { w.fixed.nranks = -1; w.pids.clear(); }, "welcome nranks -1");
  bad_welcome([](wire::welcome& w) {
    w.fixed.nranks = static_cast<std::int32_t>(wire::max_ranks) + 1;
    w.pids.assign(wire::max_ranks + 1, 1);
  }, "welcome nranks max + 1");
  bad_welcome([](wire::welcome& w) { w.fixed.nranks = 4; }, "welcome nranks 4 with 3 pids");
  bad_welcome([](wire::welcome& w) { w.fixed.nranks = 2; }, "welcome nranks 2 with 3 pids");
  bad_welcome([](wire::welcome& w) { w.fixed.half_bytes = 0; }, "welcome half_bytes 0");
  bad_welcome([](wire::welcome& w) { w.fixed.p2p_bytes = 0; }, "welcome p2p_bytes 0");
  bad_welcome([](wire::welcome& w) { w.fixed.total_bytes = w.fixed.half_bytes - 1; }, "welcome total < half");
}

TEST_CASE("wire: registration offer and table carry freed ids; malformed ones are rejected with protocol_error") {
  const wire::reg_offer o{9, 1 << 20, {2, 5, 8}};
  const auto om = wire::encode_reg_offer(o);
  const std::uint32_t olen = wire::parse_header(om.data(), om.size(), wire::msg_type::reg_offer);
  CHECK(olen == 24 + 3 * 8);
  const wire::reg_offer o2 = wire::parse_reg_offer(om.data() + sizeof(wire::header), olen);
  CHECK(o2.alloc_id == 9);
  CHECK(o2.bytes == o.bytes);
  CHECK(o2.freed == o.freed);
  const wire::reg_table t{9, {4096, 8192, 4096}, {{1, 2}, {}, {8}}};
  const auto tm = wire::encode_reg_table(t);
  const std::uint32_t tlen = wire::parse_header(tm.data(), tm.size(), wire::msg_type::reg_table);
  CHECK(tlen == 16 + 3 * 16 + 3 * 8);
  const wire::reg_table t2 = wire::parse_reg_table(tm.data() + sizeof(wire::header), tlen);
  CHECK(t2.bytes == t.bytes);
  CHECK(t2.freed == t.freed);
  // As many freed ids as a message may carry still parse.
  wire::reg_offer full{wire::max_freed + 1, 4096, {}};
  for (std::uint64_t i = 1; i <= wire::max_freed; ++i) full.freed.push_back(i);
  const auto fm = wire::encode_reg_offer(full);
  CHECK(wire::parse_reg_offer(fm.data() + sizeof(wire::header), fm.size() - sizeof(wire::header)).freed.size() == wire::max_freed);

  auto bad_offer = [&](wire::reg_offer m, const std::string& what, std::ptrdiff_t cut = 0) {
    const auto b = wire::encode_reg_offer(m);
    expect_protocol([&] { (void)wire::parse_reg_offer(b.data() + sizeof(wire::header), b.size() - sizeof(wire::header) - static_cast<std::size_t>(cut)); }, what);
  };
  bad_offer({9, 4096, {3, 2}}, "offer: decreasing freed ids");
  bad_offer({9, 4096, {2, 2}}, "offer: a freed id twice");
  bad_offer({9, 4096, {0}}, "offer: freed id 0");
  bad_offer({9, 4096, {9}}, "offer: freed id == alloc id");
  bad_offer({0, 4096, {}}, "offer: alloc id 0");
  bad_offer({9, 0, {}}, "offer: size 0");
  bad_offer({9, 4096, {1, 2}}, "offer: one id short", 8);
  bad_offer({9, 4096, {1, 2}}, "offer: shorter than its fixed part", 24);
  wire::reg_offer over = full;
  over.alloc_id += 1;
  over.freed.push_back(wire::max_freed + 1);
  bad_offer(over, "offer: max_freed + 1 ids");
  expect_protocol([&] {
    std::vector<std::byte> longer(om.begin() + sizeof(wire::header), om.end());
    longer.resize(longer.size() + 8);
    (void)wire::parse_reg_offer(longer.data(), longer.size());
  }, "offer: 8 bytes more than its count says");

  auto bad_table = [&](wire::reg_table m, const std::string& what, std::ptrdiff_t cut = 0) {
    const auto b = wire::encode_reg_table(m);
    expect_protocol([&] { (void)wire::parse_reg_table(b.data() + sizeof(wire::header), b.size() - sizeof(wire::header) - static_cast<std::size_t>(cut)); }, what);
  };
  bad_table({9, {4096, 4096}, {{}, {5, 4}}}, "table: decreasing freed ids");
  bad_table({9, {4096, 4096}, {{12}, {}}}, "table: freed id after the allocation");
  bad_table({0, {4096, 4096}, {{}, {}}}, "table: alloc id 0");
  bad_table({9, {4096, 0}, {{}, {}}}, "table: size 0");
  bad_table({9, {}, {}}, "table: no rank");
  bad_table({9, {4096, 4096}, {{1}, {2}}}, "table: one id short", 8);
  bad_table({9, {4096, 4096}, {{1}, {2}}}, "table: counts cut off", 24);
  expect_protocol([&] {
    std::vector<std::byte> longer(tm.begin() + sizeof(wire::header), tm.end());
    longer.resize(longer.size() + 8);
    (void)wire::parse_reg_table(longer.data(), longer.size());
  }, "table: 8 bytes more than its counts say");
  expect_protocol([&] {
    std::vector<std::byte> huge(tm.begin() + sizeof(wire::header), tm.end());
    const std::uint64_t k = wire::max_freed + 1; // rank 0's count
    std::memcpy(huge.data() + (2 + 3) * 8, &k, 8);
    (void)wire::parse_reg_table(huge.data(), huge.size());
  }, "table: a count above max_freed");
}

// ---- the process rendezvous ------------------------------------------------------------------------

namespace {
template <class T> T* shared_object() {
  void* p = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) T{};
}
template <class T> void release_shared(T* p) { ::munmap(static_cast<void*>(p), sizeof(T)); }

// What a real rank checks after joining: the full set of ranks, and a working all_reduce.
int check_joined(braid::communicator& c, int rank, int n) {
  if (c.rank() != rank || c.size() != n) return 10;
  std::vector<std::int64_t> v(4099, rank + 1);
  c.all_reduce(std::span<std::int64_t>(v));
  for (auto x : v)
    if (x != std::int64_t{n} * (n + 1) / 2) return 11;
  c.barrier();
  return 0;
}

struct intruder_record {
  std::atomic<int> joined{0};  // real ranks that finished joining
  std::atomic<int> done{0};    // 1 once the intruder finished
  int code = -1;               // errc the intruder's join raised; 0 = it was admitted
  double seconds = 0;
  int dropped = -1;            // foreign client: 1 if rank 0 closed the connection
  int rank = -2, peer = -2;    // the context of the intruder's error (issue 18: who and where)
  char collective[32] = {};
};
} // namespace

TEST_CASE("rendezvous: 3 processes join with communicator::join") {
  const auto status = braid::testing::fork_ranks(3, [](int rank, const braid::unique_id& id) {
    braid::communicator c = braid::communicator::join(id, rank, 3, braid::options{}.with_timeout(20s));
    return check_joined(c, rank, 3);
  }, 60s);
  for (int s : status) CHECK(s == 0);
}

TEST_CASE("rendezvous: 3 processes join with communicator_from_env (RANK, WORLD_SIZE, BRAID_UNIQUE_ID or MASTER_ADDR)") {
  for (bool derived : {false, true}) {
    INFO(std::string(derived ? "MASTER_ADDR/MASTER_PORT" : "BRAID_UNIQUE_ID"));
    const std::string port = std::to_string(20000 + ::getpid() % 40000);
    const auto status = braid::testing::fork_ranks(3, [&](int rank, const braid::unique_id& id) {
      env_scope env;
      clean_env(env);
      env.set("RANK", std::to_string(rank)).set("WORLD_SIZE", "3").set("LOCAL_WORLD_SIZE", "3");
      if (derived) env.set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", port).set("TORCHELASTIC_RUN_ID", id.to_string());
      else env.set("BRAID_UNIQUE_ID", id.to_string());
      braid::communicator c = braid::communicator_from_env(braid::options{}.with_timeout(20s));
      return check_joined(c, rank, 3);
    }, 60s);
    for (int s : status) CHECK(s == 0);
  }
}

namespace {
enum class intruder { wrong_secret_early, wrong_secret_late, wrong_size_early, foreign_client };

// Ranks 0..2 are real; rank 3 is the intruder. The real ranks 1 and 2 join 300 ms late so that an
// early intruder reaches rank 0 while it is still listening; a late one tries after all joined.
void run_intruder(intruder kind) {
  intruder_record* rec = shared_object<intruder_record>();
  const auto status = braid::testing::fork_ranks(4, [&](int rank, const braid::unique_id& id) {
    if (rank < 3) {
      if (rank > 0) std::this_thread::sleep_for(300ms);
      braid::communicator c = braid::communicator::join(id, rank, 3, braid::options{}.with_timeout(20s));
      ++rec->joined;
      const int rc = check_joined(c, rank, 3);
      while (!rec->done) std::this_thread::sleep_for(1ms); // keep the job alive until the intruder is done
      return rc;
    }
    if (kind == intruder::wrong_secret_late)
      while (rec->joined < 3) std::this_thread::sleep_for(1ms);
    const auto t0 = std::chrono::steady_clock::now();
    if (kind == intruder::foreign_client) {
      socklen_t len = 0;
      const sockaddr_un addr = braid::host::detail::abstract_address(id.socket_name(), len);
      int fd = -1;
      for (;;) { // until rank 0 listens
        fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) break;
        ::close(fd);
        ::usleep(1000);
      }
      const char garbage[] = "GET / HTTP/1.0\r\n\r\n"; // a full header's worth of bytes with a bad magic
      (void)!::write(fd, garbage, sizeof garbage);
      char b;
      const ssize_t got = ::read(fd, &b, 1); // rank 0 closes it (reset: it left our tail unread)
      rec->dropped = got == 0 || (got < 0 && errno == ECONNRESET) ? 1 : 0;
      ::close(fd);
      rec->code = 0;
    } else {
      braid::unique_id bad = id;
      if (kind != intruder::wrong_size_early) bad.secret[5] ^= 0x5a; // same name, other secret
      try {
        braid::communicator c = braid::communicator::join(bad, 1, kind == intruder::wrong_size_early ? 4 : 3,
                                                          braid::options{}.with_timeout(1s));
        rec->code = 0; // admitted
      } catch (const braid::error& e) {
        rec->code = static_cast<int>(e.code());
        rec->rank = e.rank();
        rec->peer = e.peer();
        std::snprintf(rec->collective, sizeof rec->collective, "%.*s", static_cast<int>(e.collective().size()), e.collective().data());
      }
    }
    rec->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rec->done = 1;
    return 0;
  }, 60s);
  for (int r = 0; r < 4; ++r) CHECK_MESSAGE(status[static_cast<std::size_t>(r)] == 0, "rank " << r);
  CHECK(rec->joined == 3);
  switch (kind) {
  case intruder::wrong_secret_late:
    // The rendezvous socket is gone: nobody answers, the join times out.
    CHECK(rec->code == static_cast<int>(errc::timeout));
    CHECK(rec->seconds >= 0.95);
    CHECK(rec->seconds < 3.0);
    break;
  case intruder::wrong_secret_early:
  case intruder::wrong_size_early:
    // Rank 0 drops the connection: the intruder learns at once that it was refused.
    CHECK(rec->code == static_cast<int>(errc::protocol));
    CHECK(rec->seconds < 3.0);
    break;
  case intruder::foreign_client:
    CHECK(rec->dropped == 1);
    break;
  }
  if (kind != intruder::foreign_client) { // every join error says who and where: rank 1, its join, rank 0
    CHECK(rec->rank == 1);
    CHECK(std::string(rec->collective) == "rendezvous");
    CHECK(rec->peer == 0);
  }
  release_shared(rec);
}
} // namespace

TEST_CASE("rendezvous: a rank with a wrong secret is not admitted; the real ranks complete") {
  SUBCASE("it arrives while rank 0 is listening") { run_intruder(intruder::wrong_secret_early); }
  SUBCASE("it arrives after everyone joined") { run_intruder(intruder::wrong_secret_late); }
}

TEST_CASE("rendezvous: a rank with the right id but another size is not admitted") {
  run_intruder(intruder::wrong_size_early);
}

TEST_CASE("rendezvous: a foreign client that sends garbage is dropped; the real ranks complete") {
  run_intruder(intruder::foreign_client);
}

// Issue 18: every error says who and where. A second rank 0 for one id is refused at bind(), which
// raised with no context before (rank -1, no collective); the join now names rank 0 and "rendezvous".
TEST_CASE("rendezvous: a second rank 0 for the same id is refused, naming this rank and the rendezvous") {
  const braid::unique_id id = braid::unique_id::generate();
  std::atomic<int> first_code{-1};
  std::thread first([&] { // waits for a rank 1 that never comes: a timeout after 2 s
    try {
      (void)braid::communicator::join(id, 0, 2, braid::options{}.with_timeout(2s));
      first_code = 0;
    } catch (const braid::error& e) {
      first_code = static_cast<int>(e.code());
    }
  });
  std::this_thread::sleep_for(300ms); // the first rank 0 is listening by now
  try {
    (void)braid::communicator::join(id, 0, 2, braid::options{}.with_timeout(1s));
    FAIL("a second rank 0 joined");
  } catch (const braid::error& e) {
    CHECK(e.code() == errc::invalid_usage);
    CHECK_MESSAGE(e.rank() == 0, e.what());
    CHECK_MESSAGE(e.collective() == "rendezvous", e.what());
    CHECK(std::string(e.what()).find("another rank 0 is already using this unique id") != std::string::npos);
  }
  first.join();
  CHECK(first_code == static_cast<int>(errc::timeout));
}

// The communicator completes the context of an error raised below it (guarded(), join): what the
// error knows stays, what it leaves unknown comes from the call; code, message, errno and call stay.
TEST_CASE("error context: raise_in_context fills only what the error leaves unknown") {
  const braid::error_context call{2, "alloc", 9, -1};
  auto caught = [](auto f) -> braid::error {
    try {
      f();
    } catch (const braid::error& e) {
      return e;
    }
    FAIL("nothing raised");
    return braid::error(errc::internal, "unreachable");
  };
  const braid::error bare(errc::system, "boom", braid::error_context{-1, nullptr, 0, 5}, "recvmsg", "f.cpp", 12, 104);
  const braid::error full = caught([&] { braid::detail::raise_in_context(bare, call); });
  CHECK(full.code() == errc::system);
  CHECK_THROWS_AS(braid::detail::raise_in_context(bare, call), braid::system_error); // the code's class
  CHECK(full.rank() == 2);
  CHECK(full.collective() == "alloc");
  CHECK(full.sequence() == 9);
  CHECK(full.peer() == 5); // the error's own peer stays
  CHECK(full.sys_errno() == 104);
  CHECK(full.message() == "boom");
  CHECK(std::string(full.what()) == "braid: system error [rank 2, alloc #9, peer 5]: boom (in recvmsg at f.cpp:12)");
  const braid::error known(errc::protocol, "x", braid::error_context{1, "rendezvous", 0, 0});
  const braid::error kept = caught([&] { braid::detail::raise_in_context(known, call); });
  CHECK(kept.rank() == 1);
  CHECK(kept.collective() == "rendezvous");
  const braid::error replaced = caught([&] { braid::detail::raise_in_context(known, call, true); });
  CHECK(replaced.rank() == 1);
  CHECK(replaced.collective() == "alloc");
  CHECK(replaced.sequence() == 9);
  CHECK_FALSE(braid::detail::lacks_context(full));
  CHECK(braid::detail::lacks_context(bare));
}

TEST_CASE("rendezvous: join with a bad rank or size raises invalid_argument") {
  const braid::unique_id id = braid::unique_id::generate();
  const braid::options o = braid::options{}.with_timeout(1s);
  expect_invalid([&] { (void)braid::communicator::join(id, -1, 2, o); }, "rank -1");
  expect_invalid([&] { (void)braid::communicator::join(id, 2, 2, o); }, "rank == nranks");
  expect_invalid([&] { (void)braid::communicator::join(id, 0, 0, o); }, "nranks 0");
  expect_invalid([&] { (void)braid::communicator::join(id, 0, static_cast<int>(braid::wire::max_ranks) + 1, o); },
                 "nranks max + 1");
  // A single rank needs nobody.
  braid::communicator c = braid::communicator::join(id, 0, 1, o);
  CHECK(check_joined(c, 0, 1) == 0);
}

TEST_CASE("environment sizes and durations that overflow are rejected") {
  for (const char* bad : {"17179869185G", "18446744073709617152", "2T"}) {
    ::setenv("BRAID_STAGING_BYTES", bad, 1);
    CHECK_THROWS_AS(braid::options::from_env(), braid::invalid_argument);
  }
  ::unsetenv("BRAID_STAGING_BYTES");
  for (const char* bad : {"99999999999", "300000000000m"}) {
    ::setenv("BRAID_TIMEOUT", bad, 1);
    CHECK_THROWS_AS(braid::options::from_env(), braid::invalid_argument);
  }
  ::unsetenv("BRAID_TIMEOUT");
}

TEST_CASE("wire parsers reject nonzero reserved fields and bad pids") {
  namespace w = braid::wire;
  w::hello h{};
  h.rank = 1;
  h.nranks = 2;
  h.pid = 10;
  h.reserved = 1;
  auto hb = w::encode_hello(h);
  CHECK_THROWS_AS(w::parse_hello(hb.data() + sizeof(w::header), hb.size() - sizeof(w::header)), braid::protocol_error);
  for (int variant = 0; variant < 2; ++variant) {
    w::welcome m;
    m.fixed = w::welcome_fixed{1 << 20, 4096, 4096, 2, variant == 0 ? 1 : 0};
    m.pids = variant == 0 ? std::vector<std::int32_t>{1, 2} : std::vector<std::int32_t>{0, -3};
    auto mb = w::encode_welcome(m);
    CHECK_THROWS_AS(w::parse_welcome(mb.data() + sizeof(w::header), mb.size() - sizeof(w::header)), braid::protocol_error);
  }
}
