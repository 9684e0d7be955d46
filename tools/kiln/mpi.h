// `kiln train` under mpirun: MPI (Debian's OpenMPI) as the collective of a
// data-parallel step (support/collective.h).
#pragma once

#include <memory>

#include "support/collective.h"
#include "support/status.h"

namespace kiln::cli {

// When this process was started by an MPI launcher (mpirun's environment),
// initializes MPI, installs a Collective over MPI_COMM_WORLD summing with
// MPI_Allreduce and returns it; MPI is finalized at exit. Otherwise null.
// A launched process of a kiln built without MPI is an error saying so.
Result<std::shared_ptr<const Collective>> start_mpi_if_launched();

// Ends every process of the job after an error on this one (the others
// would wait for it in a collective).
void abort_mpi_job(int code);

}  // namespace kiln::cli
