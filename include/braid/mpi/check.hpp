// braid/mpi/check.hpp — MPI return codes become braid errors.
//
// braid's MPI layer sets MPI_ERRORS_RETURN on every communicator it creates, so a failing MPI call
// returns a code instead of aborting the job; BRAID_MPI_CHECK turns that code into a braid::error of
// code errc::system whose call() is the MPI call's text and whose message is MPI_Error_string's.
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <string>

#include "../core/error.hpp"

namespace braid::mpi::detail {

[[noreturn]] inline void raise_mpi(int code, const char* call, const char* file, int line, const error_context& ctx) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  raise(errc::system, "MPI error " + std::to_string(code) + (len > 0 ? ": " + std::string(text, static_cast<std::size_t>(len)) : std::string()),
        ctx, call, file, line);
}

inline bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

} // namespace braid::mpi::detail

// Evaluates an MPI call; a result other than MPI_SUCCESS raises braid::system_error with the call's
// text, file:line and the error_context `ctx` (which must be in scope, or pass braid::error_context{}).
#define BRAID_MPI_CHECK_CTX(expr, ctx)                                                              \
  do {                                                                                             \
    const int braid_mpi_rc_ = (expr);                                                              \
    if (braid_mpi_rc_ != MPI_SUCCESS) ::braid::mpi::detail::raise_mpi(braid_mpi_rc_, #expr, __FILE__, __LINE__, (ctx)); \
  } while (0)
#define BRAID_MPI_CHECK(expr) BRAID_MPI_CHECK_CTX(expr, ::braid::error_context{})
