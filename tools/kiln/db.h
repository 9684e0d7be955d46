// kiln db: the tuning database from the command line.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/status.h"

namespace kiln::cli {

Result<int> cmd_db(const std::vector<std::string>& args);
// kiln tune (tools/kiln/tune.cc) and its measuring worker. `train`, set when
// --train was given: the training step's settings for the model file
// (main.cc parses them as for kiln train; whether the model carries its own
// training algorithm decides between the two).
using TrainOptionsFor = std::function<Result<TrainOptions>(const std::string& model)>;
Result<int> cmd_tune(const std::vector<std::string>& args, const TrainOptionsFor& train);
Result<int> cmd_tune_measure(const std::vector<std::string>& args);
Result<int> cmd_tune_worker(const std::vector<std::string>& args);

}  // namespace kiln::cli
