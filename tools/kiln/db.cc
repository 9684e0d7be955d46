// kiln db stats|export|import|prune [PATH|URL]: the tuning database (src/db).
#include "db.h"

#include <fstream>
#include <iostream>

#include "db/database.h"
#include "tune/cost_model.h"

#include <sstream>

namespace kiln::cli {

namespace {

const char kDbUsage[] =
    "usage: kiln db stats [DB] [--json]\n"
    "       kiln db export [DB] [-o FILE.jsonl]     (default: standard output)\n"
    "       kiln db import [DB] FILE.jsonl          (one record per line; '-' reads standard input)\n"
    "       kiln db prune [DB] [--keep N]           (per workload, target, thread count and point, keep the N latest; default 1)\n"
    "       kiln db train [DB] [--objective regression|rank]\n"
    "                                              (train the cost model on every record with features; store it in DB)\n"
    "       kiln db evaluate TEST_DB --train DB[,DB...] [--json] [--predictions FILE]\n"
    "                                              (train on the --train databases, rank TEST_DB's records, both objectives;\n"
    "                                               FILE gets one line per test record and objective: objective, workload,\n"
    "                                               median seconds, score)\n"
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
  std::string objective = "regression", train_from;
  std::string out_path, predictions_path;
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
    } else if (a == "--objective" && i + 1 < args.size()) {
      objective = args[++i];
      if (objective != "regression" && objective != "rank")
        return invalid_argument() << "--objective is regression or rank, not '" << objective << "'";
    } else if (a == "--train" && i + 1 < args.size()) {
      train_from = args[++i];
    } else if (a == "-o" && i + 1 < args.size()) {
      out_path = args[++i];
    } else if (a == "--predictions" && i + 1 < args.size()) {
      predictions_path = args[++i];
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
  auto samples_in = [](db::Database& d) -> Result<std::vector<tune::Sample>> {
    std::vector<tune::Record> recs;
    KILN_RETURN_IF_ERROR(d.for_each([&](const tune::Record& r) -> Status {
      recs.push_back(r);
      return Status::ok();
    }));
    return tune::samples_of(recs);
  };
  if (sub == "train") {
    KILN_ASSIGN_OR_RETURN(auto database, db::open_database(where, false));
    KILN_ASSIGN_OR_RETURN(std::vector<tune::Sample> samples, samples_in(*database));
    tune::CostModel model;
    KILN_RETURN_IF_ERROR(model.train(samples, objective == "rank" ? tune::Objective::kRank : tune::Objective::kRegression));
    KILN_RETURN_IF_ERROR(tune::store_model(*database, model, samples));
    KILN_ASSIGN_OR_RETURN(std::string heldout, database->load_model(tune::kHeldoutName));
    std::cout << "trained the cost model (" << tune::objective_name(model.objective()) << ") on " << samples.size()
              << " records; stored in " << database->location() << "\n"
              << "held out (4 folds of workloads): " << (heldout.empty() ? "too few workloads" : heldout) << "\n";
    return 0;
  }
  if (sub == "evaluate") {
    if (train_from.empty()) return invalid_argument() << "kiln db evaluate needs --train DB[,DB...]\n" << kDbUsage;
    KILN_ASSIGN_OR_RETURN(auto test_db, db::open_database(where, false));
    KILN_ASSIGN_OR_RETURN(std::vector<tune::Sample> test, samples_in(*test_db));
    std::vector<tune::Sample> train;
    std::string item;
    std::istringstream list(train_from);
    while (std::getline(list, item, ',')) {
      if (item.empty()) continue;
      KILN_ASSIGN_OR_RETURN(auto d, db::open_database(item, false));
      KILN_ASSIGN_OR_RETURN(std::vector<tune::Sample> s, samples_in(*d));
      train.insert(train.end(), s.begin(), s.end());
    }
    std::ofstream predictions;
    if (!predictions_path.empty()) {
      predictions.open(predictions_path);
      if (!predictions) return io_error() << predictions_path << ": cannot be written";
      predictions.precision(9);
    }
    if (json) std::cout << "{";
    bool first = true;
    for (tune::Objective o : {tune::Objective::kRegression, tune::Objective::kRank}) {
      tune::CostModel model;
      KILN_RETURN_IF_ERROR(model.train(train, o));
      KILN_ASSIGN_OR_RETURN(tune::Evaluation e, tune::evaluate(model, test));
      if (predictions.is_open()) {
        std::vector<std::vector<float>> f;
        for (const tune::Sample& s : test) f.push_back(s.features);
        KILN_ASSIGN_OR_RETURN(std::vector<float> score, model.predict(f));
        for (size_t i = 0; i < test.size(); ++i)
          predictions << tune::objective_name(o) << " " << test[i].workload << " " << test[i].seconds << " " << score[i]
                      << "\n";
        if (!predictions) return io_error() << predictions_path << ": writing failed";
      }
      if (json) {
        std::cout << (first ? "" : ", ") << "\"" << tune::objective_name(o) << "\": {\"train_records\": " << train.size()
                  << ", \"test_records\": " << test.size() << ", \"workloads\": " << e.workloads
                  << ", \"pairs\": " << e.pairs << ", \"pairwise\": " << e.pairwise << ", \"top1\": " << e.top1
                  << ", \"top5\": " << e.top5 << ", \"peak1\": " << e.peak1 << ", \"peak5\": " << e.peak5 << "}";
      } else {
        std::cout << tune::objective_name(o) << ": trained on " << train.size() << " records, tested on " << test.size()
                  << " (" << e.workloads << " workloads, " << e.pairs << " pairs): pairwise " << e.pairwise
                  << ", top-1 recall " << e.top1 << ", top-5 recall " << e.top5 << ", peak@1 " << e.peak1
                  << ", peak@5 " << e.peak5 << "\n";
      }
      first = false;
    }
    if (json) std::cout << "}\n";
    return 0;
  }
  return invalid_argument() << "kiln db: unknown subcommand '" << sub << "'\n" << kDbUsage;
}

}  // namespace kiln::cli
