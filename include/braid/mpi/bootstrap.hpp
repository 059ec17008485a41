// braid/mpi/bootstrap.hpp — ranks from an MPI communicator, grouped by host.
//
// split_hosts(comm) is collective over `comm`. It groups the ranks by host, numbers the hosts and
// builds the communicators the hierarchical collectives run on:
//   local  the ranks of this host (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED), ordered by their
//          rank in `comm`; or, when BRAID_HOST_ID is set, the ranks that set the same value (a
//          non-negative integer), so that one machine can play several hosts. Every rank must set it
//          or none; a group that spans real hosts is refused (the local transports need one host).
//   cross  the ranks with the same local rank, one per host, ordered by host number: the inter-host
//          communicator. Hosts are numbered 0, 1, ... in the order of their lowest rank in `comm`.
// Every created communicator is a fresh one (MPI_Comm_split/dup) with MPI_ERRORS_RETURN.
//
// join_local(...) makes the braid::communicator of a host: local rank 0 draws a fresh secret
// unique_id and MPI_Bcasts it over `local`; every local rank then joins through braid's own rendezvous
// (an abstract Unix socket, which passes the shared-memory file descriptors by SCM_RIGHTS). Those
// descriptors cannot travel through MPI, which is why MPI carries only the 32-byte id.
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "../comm/communicator.hpp"
#include "../host/rendezvous/unique_id.hpp"
#include "check.hpp"

namespace braid::mpi {

// Owns an MPI communicator (freed on destruction unless MPI is already finalized). Move-only.
class comm_handle {
public:
  comm_handle() = default;
  explicit comm_handle(MPI_Comm c) : c_(c) {}
  comm_handle(comm_handle&& o) noexcept : c_(o.c_) { o.c_ = MPI_COMM_NULL; }
  comm_handle& operator=(comm_handle&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = o.c_;
      o.c_ = MPI_COMM_NULL;
    }
    return *this;
  }
  ~comm_handle() { reset(); }
  MPI_Comm get() const { return c_; }
  void reset() noexcept {
    if (c_ != MPI_COMM_NULL && detail::mpi_usable()) MPI_Comm_free(&c_);
    c_ = MPI_COMM_NULL;
  }

private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

// Who is where. Filled identically on every rank (except the fields marked "this rank").
struct host_layout {
  int rank = 0, size = 1;              // this rank in the world communicator, its size
  int host = 0, hosts = 1;             // this rank's host number; number of hosts
  int local_rank = 0, local_size = 1;  // this rank on its host; ranks on its host
  bool uniform = true;                 // every host has the same number of ranks
  bool overridden = false;             // hosts come from BRAID_HOST_ID
  std::vector<int> host_of, local_of;  // by world rank
  std::vector<int> host_size;          // by host
  std::vector<std::vector<int>> members; // by host: world ranks in local-rank order
};

struct host_comms {
  comm_handle world, local, cross;
  host_layout layout;
};

namespace detail {

inline comm_handle returning(MPI_Comm c) {
  if (c != MPI_COMM_NULL) BRAID_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return comm_handle(c);
}

// Every rank learns whether any rank failed; a failing rank's message is raised there, the others
// raise `others` (so that no rank is left waiting in a later collective).
inline void agree(MPI_Comm c, const std::string& mine, errc code, const std::string& others) {
  int bad = mine.empty() ? 0 : 1, any = 0;
  BRAID_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, c));
  if (bad) raise(code, mine);
  if (any) raise(errc::peer_failed, others);
}

// BRAID_HOST_ID: "" when unset, else the value; `error` says what is wrong with it.
inline long host_id_from_env(bool& set, std::string& error) {
  const char* v = std::getenv("BRAID_HOST_ID");
  set = v && *v;
  if (!set) return -1;
  char* end = nullptr;
  const long id = std::strtol(v, &end, 10);
  if (!end || *end || id < 0 || id > (1L << 30)) error = std::string("BRAID_HOST_ID must be a non-negative integer, got '") + v + "'";
  return id;
}

} // namespace detail

// Collective over `comm` (MPI must be initialised). See the file comment.
inline host_comms split_hosts(MPI_Comm comm) {
  if (!detail::mpi_usable()) raise(errc::invalid_usage, "braid::mpi: MPI is not initialised (or already finalized)");
  host_comms hc;
  MPI_Comm w = MPI_COMM_NULL;
  BRAID_MPI_CHECK(MPI_Comm_dup(comm, &w));
  hc.world = detail::returning(w);
  host_layout& L = hc.layout;
  BRAID_MPI_CHECK(MPI_Comm_rank(w, &L.rank));
  BRAID_MPI_CHECK(MPI_Comm_size(w, &L.size));

  // Every rank sets BRAID_HOST_ID (a valid one) or none does.
  bool set = false;
  std::string bad;
  const long id = detail::host_id_from_env(set, bad);
  int flags[2] = {set ? 1 : 0, set ? 0 : 1}, all[2] = {0, 0};
  BRAID_MPI_CHECK(MPI_Allreduce(flags, all, 2, MPI_INT, MPI_MIN, w));
  if (bad.empty() && !all[0] && !all[1]) bad = "BRAID_HOST_ID is set on some ranks and not on others";
  detail::agree(w, bad, errc::invalid_argument, "braid::mpi: another rank refused its BRAID_HOST_ID");
  L.overridden = set;

  MPI_Comm loc = MPI_COMM_NULL;
  if (set) {
    BRAID_MPI_CHECK(MPI_Comm_split(w, static_cast<int>(id), L.rank, &loc));
    hc.local = detail::returning(loc);
    // The simulated host must lie on one real host: braid's local transports are shared memory.
    MPI_Comm real = MPI_COMM_NULL;
    BRAID_MPI_CHECK(MPI_Comm_split_type(loc, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &real));
    comm_handle real_h = detail::returning(real);
    int a = 0, b = 0;
    BRAID_MPI_CHECK(MPI_Comm_size(loc, &a));
    BRAID_MPI_CHECK(MPI_Comm_size(real, &b));
    detail::agree(w, a == b ? std::string() : "BRAID_HOST_ID " + std::to_string(id) + " groups ranks of different real hosts",
                  errc::invalid_argument, "braid::mpi: another rank's BRAID_HOST_ID groups ranks of different real hosts");
  } else {
    BRAID_MPI_CHECK(MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, L.rank, MPI_INFO_NULL, &loc));
    hc.local = detail::returning(loc);
  }
  BRAID_MPI_CHECK(MPI_Comm_rank(loc, &L.local_rank));
  BRAID_MPI_CHECK(MPI_Comm_size(loc, &L.local_size));

  // Host numbers: hosts in the order of their lowest world rank (the world rank of local rank 0,
  // since local ranks follow world ranks).
  int leader = L.rank;
  BRAID_MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, loc));
  std::vector<int> mine{leader, L.local_rank}, every(2 * static_cast<std::size_t>(L.size));
  BRAID_MPI_CHECK(MPI_Allgather(mine.data(), 2, MPI_INT, every.data(), 2, MPI_INT, w));
  std::vector<int> leaders;
  for (int q = 0; q < L.size; ++q) leaders.push_back(every[2 * static_cast<std::size_t>(q)]);
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  L.hosts = static_cast<int>(leaders.size());
  L.host_of.resize(static_cast<std::size_t>(L.size));
  L.local_of.resize(static_cast<std::size_t>(L.size));
  L.host_size.assign(static_cast<std::size_t>(L.hosts), 0);
  L.members.assign(static_cast<std::size_t>(L.hosts), {});
  for (int q = 0; q < L.size; ++q) {
    const auto h = std::lower_bound(leaders.begin(), leaders.end(), every[2 * static_cast<std::size_t>(q)]) - leaders.begin();
    L.host_of[static_cast<std::size_t>(q)] = static_cast<int>(h);
    L.local_of[static_cast<std::size_t>(q)] = every[2 * static_cast<std::size_t>(q) + 1];
    ++L.host_size[static_cast<std::size_t>(h)];
  }
  for (auto& m : L.members) m.clear();
  for (int h = 0; h < L.hosts; ++h) L.members[static_cast<std::size_t>(h)].resize(static_cast<std::size_t>(L.host_size[static_cast<std::size_t>(h)]));
  for (int q = 0; q < L.size; ++q)
    L.members[static_cast<std::size_t>(L.host_of[static_cast<std::size_t>(q)])][static_cast<std::size_t>(L.local_of[static_cast<std::size_t>(q)])] = q;
  L.host = L.host_of[static_cast<std::size_t>(L.rank)];
  L.uniform = std::all_of(L.host_size.begin(), L.host_size.end(), [&](int s) { return s == L.host_size[0]; });

  MPI_Comm cr = MPI_COMM_NULL;
  BRAID_MPI_CHECK(MPI_Comm_split(w, L.local_rank, L.host, &cr));
  hc.cross = detail::returning(cr);
  return hc;
}

// The braid::communicator of this host's ranks (collective over `local`; every rank of `world` must
// call it, so that a rank that fails to join is reported to every rank instead of leaving them waiting).
inline communicator join_local(MPI_Comm world, MPI_Comm local, const options& opts = options::from_env()) {
  int lr = 0, ls = 1;
  BRAID_MPI_CHECK(MPI_Comm_rank(local, &lr));
  BRAID_MPI_CHECK(MPI_Comm_size(local, &ls));
  unique_id id;
  if (lr == 0) id = unique_id::generate();
  BRAID_MPI_CHECK(MPI_Bcast(id.name.data(), static_cast<int>(id.name.size()), MPI_BYTE, 0, local));
  BRAID_MPI_CHECK(MPI_Bcast(id.secret.data(), static_cast<int>(id.secret.size()), MPI_BYTE, 0, local));
  communicator c;
  std::exception_ptr failure;
  std::string what;
  try {
    c = communicator::join(id, lr, ls, opts);
  } catch (const std::exception& e) {
    failure = std::current_exception();
    what = e.what();
  }
  int bad = failure ? 1 : 0, any = 0;
  BRAID_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, world));
  if (failure) std::rethrow_exception(failure);
  if (any) raise(errc::peer_failed, "braid::mpi: another rank failed to join its host's communicator");
  return c;
}

} // namespace braid::mpi
