// Collective communication for data-parallel training: the processes of one
// job (kiln train under mpirun) sum buffers across them. Kiln links no
// communication library itself; the program that owns the processes (the
// kiln CLI, with MPI) installs a Collective, and the op kiln:AllReduceMean
// (ops/collective.cc) calls it. Without one, a process is its own world.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "support/dtype.h"
#include "support/status.h"

namespace kiln {

struct Collective {
  int rank = 0;
  int size = 1;
  // Sums `count` elements of `dtype` at `data` over every process, in place;
  // every process calls it in the same order with the same count and dtype.
  std::function<Status(void* data, int64_t count, DType dtype)> all_reduce_sum;
};

// Installs the process-wide collective (null: none, a world of one).
void set_collective(std::shared_ptr<const Collective> c);
std::shared_ptr<const Collective> collective();

}  // namespace kiln
