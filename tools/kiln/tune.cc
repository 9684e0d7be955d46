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
    "                  [--train [kiln train's --loss, --target, --prediction, --optimizer, --momentum, --nesterov,\n"
    "                   --weight-decay, --clip-norm]]\n"
    "  measure the schedules of every kernel of MODEL and commit them to the tuning database\n"
    "  (default $KILN_DB, else ~/.cache/kiln/tuning.db); Ctrl-C keeps every committed record, running again resumes.\n"
    "  --time-budget   wall time for the model (default 600 s)\n"
    "  --trials N      stop the search after N measured trials\n"
    "  --no-confirm    skip the confirmation: by default, where a kernel's best point is not its default, the\n"
    "                  search ends before the budget and the best points are measured again beside the default,\n"
    "                  interleaved, and judged on every measurement, so a point fast by chance is not kept\n"
    "  --threads T     the thread count the model will run with (default 1)\n"
    "  --dim NAME=V    bind a symbolic input dim (kernels with symbolic shapes are skipped otherwise)\n"
    "  --enqueue       queue the model's workloads as jobs for kiln tune-worker instead of tuning them here\n"
    "  --refeature     measure nothing: recompute the cost model's features of MODEL's records in the database\n"
    "                  (those measured on this host's target) with this Kiln's definition of them\n"
    "  --train         the kernels of MODEL's training step (forward, backward, update) as kiln train compiles it\n"
    "                  with the same options; kiln train and kiln.Trainer then find them in the database\n"
    "  --warm-caches   time repeated runs back to back (default: before each run, as many bytes as the model\n"
    "                  touches, at most twice the L3, are written through the caches and the kernel's inputs\n"
    "                  read back, so weights come from where the rest of the model leaves them)\n"
    "  example: kiln tune resnet50.onnx --db tuning.db --time-budget 10m\n";

void on_sigint(int) { tune::request_stop(); }

// The options kiln tune and kiln tune-worker share (--db, --time-budget,
// --trials, --threads, taking their value from args[i + 1], and
// --warm-caches, --no-confirm); false: not one of them.
Result<bool> shared_option(const std::vector<std::string>& args, size_t& i, tune::TuneOptions& options) {
  const std::string& a = args[i];
  if (a == "--warm-caches") {
    options.measure.flush = false;
    return true;
  }
  if (a == "--no-confirm") {
    options.confirm = false;
    return true;
  }
  if (a != "--db" && a != "--time-budget" && a != "--trials" && a != "--threads") return false;
  if (i + 1 >= args.size()) return invalid_argument() << a << " needs a value";
  const std::string& v = args[++i];
  if (a == "--db") {
    options.db = v;
  } else if (a == "--time-budget") {
    KILN_ASSIGN_OR_RETURN(options.time_budget_s, tune::parse_duration(v));
  } else {
    char* end = nullptr;
    long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1 || n > (1 << 30)) return invalid_argument() << a << " needs a positive integer, not '" << v << "'";
    if (a == "--trials") options.max_trials = n;
    else options.threads = static_cast<int>(n);
  }
  return true;
}

}  // namespace

Result<int> cmd_tune(const std::vector<std::string>& args, const TrainOptionsFor& train) {
  tune::TuneOptions options;
  std::string model;
  bool enqueue = false, refeature = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= args.size()) return invalid_argument() << a << " needs a value";
      return args[++i];
    };
    KILN_ASSIGN_OR_RETURN(bool shared, shared_option(args, i, options));
    if (shared) continue;
    if (a == "--help" || a == "-h") {
      std::cout << kTuneUsage;
      return 0;
    } else if (a == "--enqueue") {
      enqueue = true;
    } else if (a == "--refeature") {
      refeature = true;
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
  if (train) {
    if (enqueue)
      return invalid_argument() << "--train does not go with --enqueue: a job names the model and its --dim "
                                   "bindings, not the training options; tune the step here";
    KILN_ASSIGN_OR_RETURN(TrainOptions t, train(model));
    options.train = t;
  }
  if (options.db.empty()) options.db = db::default_database_path();
  options.live = isatty(STDOUT_FILENO) != 0;
  options.measure.worker = "/proc/self/exe";
  if (enqueue && refeature) return invalid_argument() << "--enqueue and --refeature are two different jobs; pick one";
  if (enqueue) {
    KILN_RETURN_IF_ERROR(tune::enqueue_model(model, options, std::cout).status());
    return 0;
  }
  if (refeature) {
    KILN_ASSIGN_OR_RETURN(tune::RefeatureSummary s, tune::refeature_model(model, options, std::cerr));
    std::cout << "refeatured " << s.updated << " records of " << s.workloads << " workloads of " << model << " in "
              << options.db << "; " << s.current << " already current, " << s.other_target << " of other targets, "
              << s.failed << " whose point no longer applies kept theirs\n";
    return 0;
  }
  std::signal(SIGINT, on_sigint);
  KILN_ASSIGN_OR_RETURN(tune::TuneSummary s, tune::tune_model(model, options, std::cout));
  std::cout << "tuned " << s.workloads << " workloads in " << s.seconds << " s: " << s.trials << " trials ("
            << s.failed << " failed), " << s.confirmed << " points confirmed, " << s.committed
            << " records committed, " << s.resumed << " found in the database\n";
  return 0;
}

Result<int> cmd_tune_worker(const std::vector<std::string>& args) {
  static const char kUsage[] =
      "usage: kiln tune-worker [--db PATH|URL] [--threads T] [--trials N] [--time-budget S] [--exit-when-idle] [--name NAME]\n"
      "                        [--lease SECONDS]   (a job not renewed for this long returns to the queue; default 120)\n"
      "                        [--warm-caches] [--no-confirm]     (as kiln tune's)\n"
      "  claim tuning jobs of this machine's target (queued by kiln tune MODEL --enqueue), tune each job's workload\n"
      "  (--trials / --time-budget per job; default 64 trials), commit, repeat; without --exit-when-idle, wait for jobs.\n"
      "  example: kiln tune-worker --db postgresql://tuner@db.local/kiln --exit-when-idle\n";
  tune::WorkerOptions options;
  options.tune.max_trials = 64;
  options.tune.time_budget_s = 3600;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  options.name = std::string(host) + ":" + std::to_string(getpid());
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= args.size()) return invalid_argument() << a << " needs a value";
      return args[++i];
    };
    KILN_ASSIGN_OR_RETURN(bool shared, shared_option(args, i, options.tune));
    if (shared) continue;
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--name") {
      KILN_ASSIGN_OR_RETURN(options.name, value());
    } else if (a == "--exit-when-idle") {
      options.exit_when_idle = true;
    } else if (a == "--lease") {
      KILN_ASSIGN_OR_RETURN(std::string v, value());
      options.lease_s = std::atoi(v.c_str());
      if (options.lease_s < 1) return invalid_argument() << "--lease needs a positive number of seconds";
    } else {
      return invalid_argument() << "kiln tune-worker: unknown argument '" << a << "'\n" << kUsage;
    }
  }
  if (options.tune.db.empty()) options.tune.db = db::default_database_path();
  options.tune.measure.worker = "/proc/self/exe";
  std::signal(SIGINT, on_sigint);
  KILN_ASSIGN_OR_RETURN(tune::WorkerSummary s, tune::run_worker(options, std::cout));
  std::cout << options.name << ": " << s.jobs << " jobs (" << s.failed << " failed), " << s.trials << " trials\n";
  return 0;
}

Result<int> cmd_tune_measure(const std::vector<std::string>& args) {
  if (args.size() != 2) return invalid_argument() << "kiln tune-measure REQUEST RESULTS (run by kiln tune)";
  return tune::measure_worker_main(args[0], args[1]);
}

}  // namespace kiln::cli
