// `kiln tune`: every workload of a model that has candidates is searched and
// its measurements are committed to the tuning database.
//
// The model goes through the compile stages up to kernel choice (import,
// support check, graph passes); kernels::candidate_workloads gives each node
// with candidates the fused group its choice will compile. Per distinct
// workload, the tuner first measures every applicable candidate at its
// default knobs (records already in the database for this target and thread
// count are not measured again: a second run resumes), then spends the rest of
// the budget in rounds: the task scheduler picks the workload with the most
// to gain (its share of the model's latency, damped by the trials it has had),
// and a batch of new points is measured for it: once the cost model is
// trained, the model's best of an evolutionary search (evolve.h) and two
// blind; before, mutations of its best points (one knob moved to another
// value of its space) and draws from the spaces of its candidates. Each batch is measured in a child
// process (measure.h) and committed at once, so an interrupted run keeps
// every batch it finished. The search ends at 85% of the budget; then, where a
// workload's best point is not its default, the confirmation measures the
// default and the best points again, interleaved, and commits those records
// too (points are judged on all their latencies pooled, as db::best_record
// judges them).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <ostream>
#include <string>

#include "kiln/kiln.h"
#include "tune/cost_model.h"
#include "tune/measure.h"

namespace kiln::tune {

struct TuneOptions {
  std::string db;                     // path or URL
  double time_budget_s = 600;         // wall time for the whole model
  int64_t max_trials = 0;             // 0: no limit but the time
  int threads = 1;
  std::map<std::string, int64_t> dims;  // symbolic input dims bound for tuning
  int batch = 8;                      // trials per round
  uint64_t seed = 1;
  bool live = false;                  // redraw a table on a terminal (else one line per round)
  Objective objective = Objective::kRegression;  // the cost model's (cost_model.h)
  std::set<std::string> only_workloads;  // non-empty: tune these workload keys only (a worker's job)
  // After the search, measure each workload's best points again beside its
  // default, interleaved, where the best is not the default (tuner.cc); the
  // search then stops short of the budget's end to leave it time. Its
  // measurements do not count against max_trials.
  bool confirm = true;
  // The model's training step (forward, backward and update, as kiln train
  // compiles it) instead of its inference graph: its kernels' workloads.
  std::optional<TrainOptions> train;
  MeasureOptions measure;
};

struct TuneSummary {
  int workloads = 0;        // distinct workloads with candidates
  int64_t trials = 0;       // measured in this run
  int64_t failed = 0;       // of those, failed (compile error, wrong results, crash, timeout)
  int64_t committed = 0;    // records committed
  int64_t resumed = 0;      // points found already measured in the database
  int64_t confirmed = 0;    // points measured again by the confirmation
  double seconds = 0;
};

// The bytes one run of `g` touches as the caches see them: its constants and
// its activations at their peak (each live from its producer to its last
// reader; values of symbolic shape left out). The tuner evicts this much
// before each timed run, at most full_flush_bytes() (measure.h).
int64_t model_footprint_bytes(const Graph& g);

Result<TuneSummary> tune_model(const std::string& model_path, const TuneOptions& options, std::ostream& log);

// `kiln tune MODEL --db URL --enqueue`: every workload of the model with
// candidates becomes a job for this host's target (db::JobSpec; the model
// field is "PATH" or "PATH|name=value,..." with the --dim bindings).
// Returns how many were queued (those already queued, running or done are not).
Result<int64_t> enqueue_model(const std::string& model_path, const TuneOptions& options, std::ostream& log);

// `kiln tune-worker`: claims jobs of this host's target one at a time, tunes
// the job's workload (TuneOptions' budget or trials per job), commits, and
// marks the job done (failed on an error), renewing its lease while it works.
// A worker that dies loses only uncommitted work; its job returns to the
// queue when the lease expires.
struct WorkerOptions {
  TuneOptions tune;          // db, threads, per-job time_budget_s / max_trials, measure
  std::string name;          // this worker's name in the queue (host:pid by default)
  int lease_s = 120;
  bool exit_when_idle = false;
  double idle_poll_s = 5;
};
struct WorkerSummary {
  int64_t jobs = 0, failed = 0, trials = 0;
};
Result<WorkerSummary> run_worker(const WorkerOptions& options, std::ostream& log);

// `kiln db refeature DB MODEL`: recomputes the cost model's features
// (features.h, this Kiln's kFeatureVersion) of the database's records of the
// model's workloads (its training step's with options.train) measured on this
// host's target, from each record's candidate and knobs, and stores them in
// one transaction; nothing else of a record changes. Records on other
// targets, and points that no longer apply (a template changed), keep
// theirs and are counted.
struct RefeatureSummary {
  int workloads = 0;
  int64_t updated = 0, current = 0, other_target = 0, failed = 0;
};
Result<RefeatureSummary> refeature_model(const std::string& model_path, const TuneOptions& options, std::ostream& log);

// Stops tune_model after the batch in progress (Ctrl-C).
void request_stop();

// "600", "600s", "10m", "1.5h" as seconds.
Result<double> parse_duration(const std::string& text);

}  // namespace kiln::tune
