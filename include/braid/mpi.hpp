// braid/mpi.hpp — braid beyond one host: the MPI bootstrap and hierarchical collectives.
//
// Optional: needs MPI (<mpi.h>, link MPI::MPI_CXX, or the braid::mpi CMake target, which exists when
// find_package(MPI) found one). <braid/braid.hpp> does not include it.
//
//   MPI_Init(&argc, &argv);
//   {
//     braid::mpi::communicator comm(MPI_COMM_WORLD);   // collective: hosts found, host communicators joined
//     comm.all_reduce(in, out, count, braid::sum<float>{});
//   }                                                  // destroy before MPI_Finalize
//   MPI_Finalize();
#pragma once

#include "mpi/bootstrap.hpp"
#include "mpi/check.hpp"
#include "mpi/communicator.hpp"
