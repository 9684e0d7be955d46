// kiln db: the tuning database from the command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/status.h"

namespace kiln::cli {

Result<int> cmd_db(const std::vector<std::string>& args);
// kiln tune (tools/kiln/tune.cc) and its measuring worker. `train`: the
// training step's settings when --train was given (main.cc parses them, as
// for kiln train).
Result<int> cmd_tune(const std::vector<std::string>& args, const std::optional<TrainOptions>& train);
Result<int> cmd_tune_measure(const std::vector<std::string>& args);
Result<int> cmd_tune_worker(const std::vector<std::string>& args);

}  // namespace kiln::cli
