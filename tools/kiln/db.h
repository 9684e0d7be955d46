// kiln db: the tuning database from the command line.
#pragma once

#include <string>
#include <vector>

#include "support/status.h"

namespace kiln::cli {

Result<int> cmd_db(const std::vector<std::string>& args);
// kiln tune (tools/kiln/tune.cc) and its measuring worker.
Result<int> cmd_tune(const std::vector<std::string>& args);
Result<int> cmd_tune_measure(const std::vector<std::string>& args);
Result<int> cmd_tune_worker(const std::vector<std::string>& args);

}  // namespace kiln::cli
