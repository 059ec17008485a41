// The host communicator (and braid::mpi where <mpi.h> is found) with every promised type: see
// type_calls.hpp. Compiled, never run.
#include "type_calls.hpp"

#if __has_include(<mpi.h>)
#include <braid/mpi.hpp>
#endif

namespace braid_type_check {
void host_calls(braid::communicator& c, void* mem) { all_types(c, mem); }
#if __has_include(<mpi.h>)
void mpi_calls(braid::mpi::communicator& c, void* mem) { all_types(c, mem); }
#endif
} // namespace braid_type_check
