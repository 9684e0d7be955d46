// kiln db: the tuning database from the command line.
#pragma once

#include <string>
#include <vector>

#include "support/status.h"

namespace kiln::cli {

Result<int> cmd_db(const std::vector<std::string>& args);

}  // namespace kiln::cli
