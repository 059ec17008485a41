// Shared-memory hygiene: braid never creates anything in /dev/shm (processes share memfds passed over
// an abstract Unix socket), its memfds are mode 0600, and once a communicator is gone no descriptor,
// mapping or socket name of it remains: after a normal exit, after an error (timeout) and after a rank
// was SIGKILLed mid-collective. The rendezvous socket's name is the unique id's 128 random bits.
#include <doctest/doctest.h>

#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <array>
#include <chrono>
#include <fstream>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <cstddef>
#include <cstring>

#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using braid::communicator;

std::set<std::string> dir_entries(const char* path) {
  std::set<std::string> out;
  if (DIR* d = ::opendir(path)) {
    while (dirent* e = ::readdir(d))
      if (std::string n = e->d_name; n != "." && n != "..") out.insert(n);
    ::closedir(d);
  }
  return out;
}

std::set<std::string> new_braid_entries(const std::set<std::string>& before) {
  std::set<std::string> out;
  for (const auto& n : dir_entries("/dev/shm"))
    if (!before.count(n) && n.find("braid") != std::string::npos) out.insert(n);
  return out;
}

struct fd_view {
  int total = 0, memfds = 0, dev_shm = 0, wrong_mode = 0;
};

// This process's descriptors: how many, how many are memfds (and of those, how many are not 0600), and
// how many point into /dev/shm.
fd_view my_fds() {
  fd_view v;
  for (const auto& n : dir_entries("/proc/self/fd")) {
    ++v.total;
    char target[512] = {};
    const std::string link = "/proc/self/fd/" + n;
    const ssize_t k = ::readlink(link.c_str(), target, sizeof target - 1);
    if (k <= 0) continue;
    const std::string t(target, static_cast<std::size_t>(k));
    if (t.rfind("/memfd:", 0) == 0) {
      ++v.memfds;
      struct stat st {};
      if (::stat(link.c_str(), &st) != 0 || (st.st_mode & 07777) != 0600) ++v.wrong_mode;
    }
    if (t.rfind("/dev/shm", 0) == 0) ++v.dev_shm;
  }
  return v;
}

int maps_into_dev_shm() {
  std::ifstream maps("/proc/self/maps");
  int k = 0;
  for (std::string line; std::getline(maps, line);) k += line.find("/dev/shm") != std::string::npos;
  return k;
}

// Whether anyone listens on the abstract name (what a rank joining with this id would connect to).
// /proc/net/unix is no guide after join: the accepted connections rank 0 keeps show the same name.
bool accepts_connections(const std::string& name) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return true; // cannot tell: count it as a failure
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size()); // sun_path[0] == 0: the abstract namespace
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const bool ok = ::connect(s, reinterpret_cast<const sockaddr*>(&a), len) == 0;
  ::close(s);
  return ok;
}

bool socket_name_listed(const std::string& name) { // abstract names appear as "@name" in /proc/net/unix
  std::ifstream f("/proc/net/unix");
  for (std::string line; std::getline(f, line);)
    if (line.find("@" + name) != std::string::npos) return true;
  return false;
}

// Exit codes a rank uses to say which check failed (0: all passed).
enum : int { ok = 0, no_memfd = 10, memfd_mode = 11, uses_dev_shm = 12, leaked_fd = 13, leaked_memfd = 14, listener_left = 15,
             wrong_error = 16 };

// While the communicator lives: memfds, all 0600, nothing in /dev/shm, the listener gone.
int check_live(const braid::unique_id& id) {
  const fd_view v = my_fds();
  if (v.memfds == 0) return no_memfd;
  if (v.wrong_mode) return memfd_mode;
  if (v.dev_shm || maps_into_dev_shm()) return uses_dev_shm;
  if (accepts_connections(id.socket_name())) return listener_left;
  return ok;
}

// After the communicator is gone: exactly the descriptors of before, no memfd, no mapping of /dev/shm.
int check_gone(int fds_before) {
  const fd_view v = my_fds();
  if (v.memfds) return leaked_memfd;
  if (v.total != fds_before) return leaked_fd;
  if (v.dev_shm || maps_into_dev_shm()) return uses_dev_shm;
  return ok;
}

void check_statuses(const std::vector<int>& status, int killed = -1) {
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank " << r << " exit status " << status[r]);
    if (static_cast<int>(r) == killed) CHECK(status[r] == 128 + SIGKILL);
    else CHECK(status[r] == ok);
  }
}

// Forks n process ranks; each joins a communicator with `timeout` and runs body(rank, c, id), whose
// nonzero return is the rank's exit code. Once the communicator is gone each rank checks that it
// left nothing behind (check_gone). Then the parent checks every rank's status (rank `killed`, if
// any, died by SIGKILL) and that /dev/shm gained no braid entry.
void run_leaving_nothing(int n, std::chrono::nanoseconds timeout,
                         int (*body)(int rank, communicator& c, const braid::unique_id& id), int killed = -1) {
  const auto before = dir_entries("/dev/shm");
  const auto status = braid::testing::fork_ranks(n, [&](int rank, const braid::unique_id& id) {
    const int fds_before = my_fds().total;
    {
      communicator c = communicator::join(id, rank, n, braid::options{}.with_timeout(timeout));
      if (const int e = body(rank, c, id)) return e;
    }
    return check_gone(fds_before);
  }, 120s);
  check_statuses(status, killed);
  CHECK(new_braid_entries(before).empty());
}

} // namespace

TEST_CASE("hygiene: normal exit leaves nothing in /dev/shm and no descriptor; memfds are 0600") {
  run_leaving_nothing(3, 30s, [](int, communicator& c, const braid::unique_id& id) {
    braid::buffer<float> b = c.alloc<float>(4096); // a registered buffer: one more memfd per rank
    for (auto& x : b) x = 1.0f;
    std::vector<float> out(4096);
    c.all_reduce(b.data(), out.data(), out.size());
    if (out[17] != 3.0f) return static_cast<int>(wrong_error);
    return check_live(id);
  });
}

TEST_CASE("hygiene: after an error (timeout) no descriptor, memfd or /dev/shm entry is left") {
  run_leaving_nothing(3, 300ms, [](int rank, communicator& c, const braid::unique_id& id) {
    std::vector<float> v(1000, 1.0f);
    if (rank == 2) {
      std::this_thread::sleep_for(1500ms); // never enters: the others time out
      return static_cast<int>(ok);
    }
    try {
      c.all_reduce(std::span<float>(v));
      return static_cast<int>(wrong_error);
    } catch (const braid::timeout_error&) {
    } catch (const braid::peer_error&) {
    }
    return check_live(id);
  });
}

TEST_CASE("hygiene: after a rank is SIGKILLed mid-collective the survivors hold nothing and /dev/shm is unchanged") {
  run_leaving_nothing(4, 10s, [](int rank, communicator& c, const braid::unique_id& id) {
    braid::buffer<float> b = c.alloc<float>(std::size_t{1} << 18);
    std::vector<float> out(b.size());
    if (rank == 1) {
      std::thread([] {
        std::this_thread::sleep_for(200ms);
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    try {
      for (;;) c.all_reduce(b.data(), out.data(), out.size());
    } catch (const braid::peer_error&) {
    } catch (const braid::usage_error&) {
    }
    return check_live(id);
  }, 1);
}

TEST_CASE("hygiene: the rendezvous socket is named by the unique id's 128 random bits and disappears after join") {
  // The name: "braid-" + 32 hex digits of unique_id::name, 16 bytes from getrandom().
  constexpr int samples = 1000;
  std::set<std::string> names;
  std::array<int, 128> ones{};
  for (int i = 0; i < samples; ++i) {
    const auto id = braid::unique_id::generate();
    const std::string n = id.socket_name();
    REQUIRE(n.size() == 6 + 32);
    CHECK(n.rfind("braid-", 0) == 0);
    names.insert(n);
    for (int b = 0; b < 128; ++b) ones[static_cast<std::size_t>(b)] += (id.name[static_cast<std::size_t>(b / 8)] >> (b % 8)) & 1;
  }
  CHECK(names.size() == samples);
  for (int b = 0; b < 128; ++b) { // each bit is set about half the time (±9 standard deviations)
    INFO("bit " << b);
    CHECK(ones[static_cast<std::size_t>(b)] > samples * 35 / 100);
    CHECK(ones[static_cast<std::size_t>(b)] < samples * 65 / 100);
  }
  // While rank 1 is late, rank 0's listener is visible under that name; once joined, nobody listens on it.
  const auto status = braid::testing::fork_ranks(2, [](int rank, const braid::unique_id& id) {
    if (rank == 1) {
      std::this_thread::sleep_for(300ms);
      if (!socket_name_listed(id.socket_name())) return 20; // rank 0 listens under the id's name
    }
    communicator c = communicator::join(id, rank, 2, braid::options{}.with_timeout(30s));
    c.barrier();
    return accepts_connections(id.socket_name()) ? static_cast<int>(listener_left) : static_cast<int>(ok);
  }, 60s);
  check_statuses(status);
}

TEST_CASE("hygiene: ranks as threads use no descriptor at all") {
  const int fds_before = my_fds().total;
  int during = 0;
  braid::run_threads(3, [&](communicator& c) {
    std::vector<float> v(1000, 1.0f);
    c.all_reduce(std::span<float>(v));
    if (c.rank() == 0) during = my_fds().memfds;
  });
  CHECK(during == 0);
  CHECK(my_fds().total == fds_before);
}

TEST_CASE("hygiene: a shared-memory descriptor shorter than announced is refused, not mapped (no SIGBUS)") {
  const int fds_before = my_fds().total;
  // A memfd of 4 KiB announced as 64 KiB: mapping it would succeed and the first touch past 4 KiB
  // would raise SIGBUS. map_shared checks the size first, raises protocol_error and closes the fd.
  braid::host::mapped_memory real = braid::host::mapped_memory::create_shared(4096, "braid-test-short");
  const int fd = ::dup(real.fd());
  REQUIRE(fd >= 0);
  try {
    (void)braid::host::mapped_memory::map_shared(fd, 65536, false);
    FAIL("a short descriptor was mapped");
  } catch (const braid::error& e) {
    CHECK(e.code() == braid::errc::protocol);
    CHECK(std::string(e.what()).find("4096 bytes, fewer than the 65536 announced") != std::string::npos);
  }
  // The exact size still maps.
  const int fd2 = ::dup(real.fd());
  REQUIRE(fd2 >= 0);
  braid::host::mapped_memory ok = braid::host::mapped_memory::map_shared(fd2, 4096, false);
  CHECK(ok.size() == 4096);
  ok.reset();
  real.reset();
  CHECK(my_fds().total == fds_before); // the refused descriptor was closed too
}
