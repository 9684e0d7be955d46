// kiln db stats|export|import|prune [PATH|URL]: the tuning database (src/db).
#include "db.h"

#include <fstream>
#include <iostream>

#include "db/database.h"

namespace kiln::cli {

namespace {

const char kDbUsage[] =
    "usage: kiln db stats [DB] [--json]\n"
    "       kiln db export [DB] [-o FILE.jsonl]     (default: standard output)\n"
    "       kiln db import [DB] FILE.jsonl          (one record per line; '-' reads standard input)\n"
    "       kiln db prune [DB] [--keep N]           (per workload, target and schedule, keep the N fastest; default 1)\n"
    "  DB is a path or a postgresql:// URL; default $KILN_DB, else ~/.cache/kiln/tuning.db.\n"
    "  example: kiln db stats ~/.cache/kiln/tuning.db --json\n";

}  // namespace

Result<int> cmd_db(const std::vector<std::string>& args_in) {
  std::vector<std::string> args = args_in;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kDbUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string sub = args[0];
  args.erase(args.begin());
  bool json = false;
  int keep = 1;
  std::string out_path;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--keep" && i + 1 < args.size()) {
      try {
        keep = std::stoi(args[++i]);
      } catch (...) {
        return invalid_argument() << "--keep needs a number, not '" << args[i] << "'";
      }
    } else if (a == "-o" && i + 1 < args.size()) {
      out_path = args[++i];
    } else if (a == "--help" || a == "-h") {
      std::cout << kDbUsage;
      return 0;
    } else if (a.size() > 1 && a[0] == '-') {
      return invalid_argument() << "kiln db " << sub << ": unknown flag '" << a << "'\n" << kDbUsage;
    } else {
      positional.push_back(a);
    }
  }
  // The database: the first positional argument when there is one more than
  // the command's own (import's file), else $KILN_DB or the default path.
  const size_t own = sub == "import" ? 1 : 0;
  std::string where;
  if (positional.size() == own + 1) {
    where = positional[0];
    positional.erase(positional.begin());
  } else {
    where = db::default_database_path();
  }
  if (positional.size() != own) return invalid_argument() << "kiln db " << sub << ": wrong arguments\n" << kDbUsage;

  if (sub == "stats") {
    KILN_ASSIGN_OR_RETURN(auto database, db::open_database(where, false));
    KILN_ASSIGN_OR_RETURN(db::Stats st, database->stats());
    if (json) {
      std::cout << "{\"database\": \"" << database->location() << "\", \"records\": " << st.records
                << ", \"workloads\": " << st.workloads << ", \"targets\": " << st.targets << ", \"jobs\": {";
      bool first = true;
      for (const auto& [state, n] : st.jobs) {
        std::cout << (first ? "" : ", ") << "\"" << state << "\": " << n;
        first = false;
      }
      std::cout << "}}\n";
    } else {
      std::cout << "database   " << database->location() << "\n"
                << "records    " << st.records << "\n"
                << "workloads  " << st.workloads << "\n"
                << "targets    " << st.targets << "\n"
                << "jobs      ";
      for (const auto& [state, n] : st.jobs) std::cout << " " << state << " " << n;
      std::cout << "\n";
    }
    return 0;
  }
  if (sub == "export") {
    KILN_ASSIGN_OR_RETURN(auto database, db::open_database(where, false));
    int64_t n = 0;
    if (out_path.empty()) {
      KILN_RETURN_IF_ERROR(db::export_records(*database, std::cout, &n));
    } else {
      std::ofstream f(out_path);
      if (!f) return io_error() << out_path << ": cannot be written";
      KILN_RETURN_IF_ERROR(db::export_records(*database, f, &n));
      f.close();
      if (!f) return io_error() << out_path << ": writing failed";
    }
    std::cerr << "exported " << n << " records\n";
    return 0;
  }
  if (sub == "import") {
    KILN_ASSIGN_OR_RETURN(auto database, db::open_database(where, true));
    int64_t n = 0;
    const std::string& file = positional[0];
    if (file == "-") {
      KILN_RETURN_IF_ERROR(db::import_records(*database, std::cin, &n).with_context("standard input"));
    } else {
      std::ifstream f(file);
      if (!f) return not_found() << file << ": cannot be read";
      KILN_RETURN_IF_ERROR(db::import_records(*database, f, &n).with_context(file));
    }
    std::cerr << "imported " << n << " records into " << database->location() << "\n";
    return 0;
  }
  if (sub == "prune") {
    KILN_ASSIGN_OR_RETURN(auto database, db::open_database(where, false));
    KILN_ASSIGN_OR_RETURN(int64_t removed, database->prune(keep));
    std::cout << "removed " << removed << " records\n";
    return 0;
  }
  return invalid_argument() << "kiln db: unknown subcommand '" << sub << "'\n" << kDbUsage;
}

}  // namespace kiln::cli
