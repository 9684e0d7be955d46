// kiln tune MODEL --db PATH [--time-budget 600|10m] [--trials N] [--threads T] [--dim NAME=VALUE]
// and the hidden worker `kiln tune-measure REQUEST RESULTS` (src/tune/measure.h).
#include "db.h"

#include <unistd.h>

#include <csignal>
#include <iostream>

#include "db/database.h"
#include "tune/tuner.h"

namespace kiln::cli {

namespace {

const char kTuneUsage[] =
    "usage: kiln tune MODEL [--db PATH] [--time-budget SECONDS|10m] [--trials N] [--threads T] [--dim NAME=VALUE ...]\n"
    "  measure the schedules of every kernel of MODEL that has candidates and commit them to the tuning database\n"
    "  (default $KILN_DB, else ~/.cache/kiln/tuning.db); Ctrl-C keeps every committed record, running again resumes.\n"
    "  --time-budget   wall time for the model (default 600 s)\n"
    "  --trials N      stop after N measured trials\n"
    "  --threads T     the thread count the model will run with (default 1)\n"
    "  --dim NAME=V    bind a symbolic input dim (kernels with symbolic shapes are skipped otherwise)\n"
    "  example: kiln tune resnet50.onnx --db tuning.db --time-budget 10m\n";

void on_sigint(int) { tune::request_stop(); }

}  // namespace

Result<int> cmd_tune(const std::vector<std::string>& args) {
  tune::TuneOptions options;
  std::string model;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= args.size()) return invalid_argument() << a << " needs a value";
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kTuneUsage;
      return 0;
    } else if (a == "--db") {
      KILN_ASSIGN_OR_RETURN(options.db, value());
    } else if (a == "--time-budget") {
      KILN_ASSIGN_OR_RETURN(std::string v, value());
      KILN_ASSIGN_OR_RETURN(options.time_budget_s, tune::parse_duration(v));
    } else if (a == "--trials" || a == "--threads") {
      KILN_ASSIGN_OR_RETURN(std::string v, value());
      char* end = nullptr;
      long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > (1 << 30)) return invalid_argument() << a << " needs a positive integer, not '" << v << "'";
      if (a == "--trials") options.max_trials = n;
      else options.threads = static_cast<int>(n);
    } else if (a == "--dim") {
      KILN_ASSIGN_OR_RETURN(std::string v, value());
      size_t eq = v.find('=');
      char* end = nullptr;
      long long n = eq == std::string::npos ? -1 : std::strtoll(v.c_str() + eq + 1, &end, 10);
      if (eq == std::string::npos || eq == 0 || n < 0 || *end != '\0') return invalid_argument() << "--dim expects NAME=VALUE, got '" << v << "'";
      options.dims[v.substr(0, eq)] = n;
    } else if (a.size() > 1 && a[0] == '-') {
      return invalid_argument() << "kiln tune: unknown option '" << a << "'\n" << kTuneUsage;
    } else if (model.empty()) {
      model = a;
    } else {
      return invalid_argument() << "kiln tune takes one MODEL\n" << kTuneUsage;
    }
  }
  if (model.empty()) return invalid_argument() << "kiln tune needs a MODEL\n" << kTuneUsage;
  if (options.db.empty()) options.db = db::default_database_path();
  options.live = isatty(STDOUT_FILENO) != 0;
  options.measure.worker = "/proc/self/exe";
  std::signal(SIGINT, on_sigint);
  KILN_ASSIGN_OR_RETURN(tune::TuneSummary s, tune::tune_model(model, options, std::cout));
  std::cout << "tuned " << s.workloads << " workloads in " << s.seconds << " s: " << s.trials << " trials ("
            << s.failed << " failed), " << s.committed << " records committed, " << s.resumed
            << " found in the database\n";
  return 0;
}

Result<int> cmd_tune_measure(const std::vector<std::string>& args) {
  if (args.size() != 2) return invalid_argument() << "kiln tune-measure REQUEST RESULTS (run by kiln tune)";
  return tune::measure_worker_main(args[0], args[1]);
}

}  // namespace kiln::cli
