#include "mpi.h"

#include <climits>
#include <cstdlib>

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

namespace kiln::cli {

namespace {

// Open MPI's, MPICH's/Hydra's and PMIx's launchers set these in each process.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

}  // namespace

#ifdef KILN_HAVE_MPI

Result<std::shared_ptr<const Collective>> start_mpi_if_launched() {
  if (!launched_by_mpi()) return std::shared_ptr<const Collective>();
  int ok = 0;
  MPI_Initialized(&ok);
  if (!ok && MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return internal_error() << "MPI_Init failed";
  std::atexit([] {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
  });
  auto c = std::make_shared<Collective>();
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size);
  c->all_reduce_sum = [](void* data, int64_t count, DType dtype) -> Status {
    MPI_Datatype t;
    size_t esize;
    if (dtype == DType::kFloat32) {
      t = MPI_FLOAT;
      esize = 4;
    } else if (dtype == DType::kFloat64) {
      t = MPI_DOUBLE;
      esize = 8;
    } else {
      return invalid_argument() << "all-reduce of " << dtype_name(dtype) << " (f32 or f64 expected)";
    }
    char* p = static_cast<char*>(data);
    for (int64_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min<int64_t>(count - done, INT_MAX));
      if (MPI_Allreduce(MPI_IN_PLACE, p + done * esize, n, t, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        return internal_error() << "MPI_Allreduce failed";
      done += n;
    }
    return Status::ok();
  };
  set_collective(c);
  return std::shared_ptr<const Collective>(c);
}

void abort_mpi_job(int code) {
  int ok = 0, done = 0;
  MPI_Initialized(&ok);
  MPI_Finalized(&done);
  if (ok && !done) MPI_Abort(MPI_COMM_WORLD, code);
}

#else

Result<std::shared_ptr<const Collective>> start_mpi_if_launched() {
  if (launched_by_mpi())
    return unsupported() << "this kiln was built without MPI (install libopenmpi-dev and build again) but was "
                            "started by mpirun";
  return std::shared_ptr<const Collective>();
}

void abort_mpi_job(int) {}

#endif

}  // namespace kiln::cli
