// braid/launch/env.hpp — build a process communicator from the launcher's environment.
//
// Rank and size come from RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/SIZE (OpenMPI's mpirun),
// PMI_RANK/PMI_SIZE (MPICH, Slurm's PMI) or SLURM_PROCID/SLURM_NTASKS. LOCAL_RANK/LOCAL_WORLD_SIZE
// (or the OMPI_COMM_WORLD_LOCAL_* pair) must describe the same ranks: the host communicator covers
// one host. The meeting point is BRAID_UNIQUE_ID when set (a secret id from unique_id::generate());
// otherwise it is derived from what the launcher gives every rank of one job: MASTER_ADDR and
// MASTER_PORT (with TORCHELASTIC_RUN_ID), or OpenMPI's/PMIx's job id. A derived id is not secret:
// another process of the same user on the same host could join first. Use BRAID_UNIQUE_ID where that
// matters.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>

#include <unistd.h>

#include "../comm/communicator.hpp"
#include "../host/rendezvous/unique_id.hpp"

namespace braid {

namespace detail {
// The first of `names` that is set and not empty: its name and value (both null when none is).
struct env_var {
  const char* name = nullptr;
  const char* value = nullptr;
};
inline env_var env_first(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return {n, v};
  return {};
}
// A decimal in [min, 2^20]; otherwise invalid_argument naming the variable and saying what is wrong.
inline int env_int(const env_var& e, long min) {
  const std::string shown = std::string(e.name) + "='" + e.value + "'";
  char* end = nullptr;
  const long v = std::strtol(e.value, &end, 10);
  if (!end || end == e.value || *end) raise(errc::invalid_argument, shown + " is not a number");
  if (v < min)
    raise(errc::invalid_argument, shown + (min == 0 ? std::string(" must not be negative") : " must be at least " + std::to_string(min)));
  if (v > 1L << 20) raise(errc::invalid_argument, shown + " is too large (at most 1048576)");
  return static_cast<int>(v);
}
} // namespace detail

struct launch_info {
  int rank = 0, size = 1;
  unique_id id;
  bool derived_id = false;
};

inline launch_info launch_info_from_env() {
  using detail::env_first;
  launch_info li;
  const detail::env_var r = env_first({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"});
  const detail::env_var s = env_first({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"});
  if (!r.value || !s.value)
    raise(errc::invalid_argument, "from_env: no rank/size in the environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/SIZE, "
                                  "PMI_RANK/PMI_SIZE or SLURM_PROCID/SLURM_NTASKS)");
  li.rank = detail::env_int(r, 0);
  li.size = detail::env_int(s, 1);
  if (li.rank >= li.size)
    raise(errc::invalid_argument, std::string(r.name) + "='" + r.value + "' must be below " + s.name + "='" + s.value + "'");
  if (const detail::env_var ls = env_first({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}); ls.value) {
    if (detail::env_int(ls, 1) != li.size)
      raise(errc::unsupported, "from_env: the ranks span several hosts (local world size " + std::string(ls.value) +
                                   " of " + std::to_string(li.size) + "); the host communicator covers one host");
  }
  if (const char* id = std::getenv("BRAID_UNIQUE_ID"); id && *id) {
    try {
      li.id = unique_id::parse(id);
    } catch (const invalid_argument& e) {
      raise(errc::invalid_argument, "BRAID_UNIQUE_ID: " + e.message());
    }
    return li;
  }
  std::string key;
  if (const char* a = std::getenv("MASTER_ADDR")) {
    key = std::string("torch:") + a + ":" + (std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "") + ":" +
          (std::getenv("TORCHELASTIC_RUN_ID") ? std::getenv("TORCHELASTIC_RUN_ID") : "");
  } else if (const char* j = env_first({"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"}).value) {
    key = std::string("job:") + j + ":" + (std::getenv("SLURM_STEP_ID") ? std::getenv("SLURM_STEP_ID") : "");
  } else {
    raise(errc::invalid_argument, "from_env: set BRAID_UNIQUE_ID (or MASTER_ADDR/MASTER_PORT) so the ranks can meet");
  }
  li.id = unique_id::derive(key + ":uid" + std::to_string(::getuid()));
  li.derived_id = true;
  return li;
}

inline communicator communicator_from_env(const options& opts = options::from_env()) {
  const launch_info li = launch_info_from_env();
  return communicator::join(li.id, li.rank, li.size, opts);
}

} // namespace braid
