// `kiln train`'s checkpoints: one file holding the step reached and every
// parameter and optimizer state tensor (as .npy records). Written beside
// its path and renamed over it, so a kill mid-save leaves the last complete
// checkpoint; a damaged or foreign file is an error naming it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "support/status.h"
#include "support/tensor.h"

namespace kiln::cli {

struct Checkpoint {
  int64_t epoch = 0;  // epochs finished
  int64_t batch = 0;  // batches finished in the current epoch
  int64_t step = 0;   // steps taken in all
  std::map<std::string, Tensor> tensors;
};

Status write_checkpoint(const std::string& path, const Checkpoint& c);
Result<Checkpoint> read_checkpoint(const std::string& path);

}  // namespace kiln::cli
