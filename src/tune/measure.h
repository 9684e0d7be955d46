// Measurement: a fused group's kernel compiled under each trial (candidate
// and knobs) and timed in a child process, so a candidate that crashes or
// hangs costs that trial, not the tuner.
//
// The parent writes the group as a standalone graph (group_graph: its
// external inputs, constants copied, its nodes, its outputs) and the trials
// to a request file and runs `WORKER tune-measure REQUEST RESULTS` (the kiln
// binary). The child compiles the group once with naive schedules as the
// reference, then per trial: records the choice on the anchor, applies the
// candidate's transform, compiles (stages 6-13), checks the outputs against
// the reference, warms up and times repeated runs until both a minimum time
// and a minimum count are reached, and appends one line to RESULTS
// (interleaved: every trial prepared first, then timed in rounds, the lines
// written at the end). The
// parent restarts the child after a crash (the trial in progress fails with
// the signal) or after `timeout_s` without a result (killed; the trial fails
// as timed out). A child stopped by SIGINT (Ctrl-C, sent to the whole process
// group) ends the call: the trials left fail as interrupted.
//
// Fault injection for tests: with KILN_TUNE_FAULT=crash:KNOBS (or
// hang:KNOBS) in the child's environment, a trial whose knobs print as KNOBS
// crashes (hangs) the child; with slow:KNOBS, each of its timed runs takes
// 2 ms more.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "support/status.h"
#include "tune/trial.h"

namespace kiln::tune {

struct TrialResult {
  bool ok = false;
  std::string error;                // why not ok: compile error, wrong results, crash, timeout
  std::vector<double> latencies_s;  // every timed run
  std::string schedule;             // the anchor kernel's schedule as text
  std::vector<float> features;      // the cost model's features of the anchor kernel (features.h)
  double median_s() const;
};

struct MeasureOptions {
  std::string worker;        // the kiln binary (`/proc/self/exe` from the CLI)
  int threads = 1;           // the model's thread count
  double min_seconds = 0.2;  // time repeats for at least this long ...
  int min_repeats = 5;       // ... and at least this many times
  int max_repeats = 200;
  double timeout_s = 120;    // without a result for this long, the child is killed
  bool check = true;         // compare each trial's outputs with the naive schedules'
  // Before each timed run, write every line of a scratch buffer of
  // flush_bytes, then read the group's inputs back: what the rest of a model
  // touches between two runs of this kernel passes through the caches, and
  // the activations come from cache. With flush_bytes at least twice the
  // host's last-level cache (0: exactly that), the constants (weights) come
  // from memory; with a model's footprint below that, from whichever level
  // the model leaves them in. Repeats then stop once their wall time,
  // evictions included, reaches min_seconds.
  bool flush = true;
  int64_t flush_bytes = 0;
  // Time the trials of one call round by round (each run once per round, the
  // order rotated) instead of one after the other, so that a slow phase of
  // the machine falls on every trial alike: for comparing points with each
  // other (the tuner's confirmation). min_seconds and timeout_s are then per
  // trial. If the child dies, the trials left are measured one by one instead.
  bool interleave = false;
};

// Twice the host's last-level cache (32 MB when the host does not say):
// scratch writes that leave none of a kernel's data in any cache.
int64_t full_flush_bytes();

// The start of every trial's error when the group itself cannot be set up
// (its graph, its inputs, or the naive reference failed): no trial of it can
// succeed, and the tuner stops spending trials on it.
inline constexpr const char* kGroupUnmeasurable = "the group cannot be measured alone: ";

// Every trial of one group, in child processes. One result per trial.
Result<std::vector<TrialResult>> measure_trials(const Graph& group, size_t anchor_index,
                                                const std::vector<Trial>& trials, const MeasureOptions& options);

// The child's side (`kiln tune-measure REQUEST RESULTS`): returns the exit code.
int measure_worker_main(const std::string& request_path, const std::string& results_path);

}  // namespace kiln::tune
