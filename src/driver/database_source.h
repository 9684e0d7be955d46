// The tuning database as a choice source of kernel choice (strategy.h): the
// best record of each node's workload on this target (tune/tune.h), exact
// target first, then a compatible one. For a miss, where the database holds a
// trained cost model (tune/cost_model.h), the model's pick among the
// priority candidate's default point and a few points drawn from its space
// (seeded by the workload, so a compile is repeatable), without measuring:
// the source is then "predicted". The default point stays unless at least
// three points score above it, and the model picks nothing unless its
// held-out pairwise accuracy, stored with it (tune::store_model), is at
// least 0.85.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "db/database.h"
#include "kernels/kernels.h"
#include "tune/cost_model.h"
#include "strategy/strategy.h"
#include "tune/tune.h"

namespace kiln::driver {

class DatabaseSource : public strategy::ChoiceSource {
 public:
  // `workloads`: every node with candidates and its workload (kernels::candidate_workloads).
  DatabaseSource(std::shared_ptr<db::Database> db, const Graph& graph, std::vector<kernels::GroupWorkload> workloads,
                 int threads);
  std::string name() const override { return "database"; }
  std::optional<strategy::Choice> lookup(const Node& n, const std::vector<const strategy::Candidate*>& applicable,
                                         const Target& target) override;
  // The best record of a kernel without a candidate (generic_workloads'),
  // with the same rules; nullopt for a miss (the default schedule: no
  // zero-shot pick in the generic space).
  std::optional<strategy::Choice> lookup_generic(const kernels::GroupWorkload& gw, const Target& target);
  // The workloads looked up without a record (exact or compatible target),
  // as jobs for this target (db::JobSpec, the model left empty); those whose
  // group has a symbolic input shape, which a worker cannot tune, are only counted.
  const std::vector<db::JobSpec>& misses() const { return misses_; }
  int symbolic_misses() const { return symbolic_misses_; }
  // Errors met reading the database (reported by the compile that owns it).
  const Status& error() const { return error_; }

 private:
  std::shared_ptr<db::Database> db_;
  // Read once per key, those compared with each other only (db::timed_alike).
  const std::vector<tune::Record>& records(const std::string& key);
  static bool keep_default_within_noise(const std::vector<tune::Record>& usable, const std::string& candidate,
                                        const std::string& default_knobs, tune::Record& best);
  static std::optional<strategy::Choice> choice_of(const tune::Record& best, tune::TargetMatch match,
                                                   const std::string& where, const tune::Workload& workload);
  std::optional<strategy::Choice> predict(const Node& n, const kernels::GroupWorkload& gw,
                                          const std::vector<const strategy::Candidate*>& applicable, const Target& target);
  const Graph& graph_;
  std::map<const Node*, kernels::GroupWorkload> workloads_;
  int threads_;
  std::unique_ptr<tune::CostModel> model_;  // loaded on the first miss
  bool model_loaded_ = false;
  std::map<std::string, std::vector<tune::Record>> records_;  // by workload key, read once
  void add_miss(const kernels::GroupWorkload& gw, const Target& target);
  std::vector<db::JobSpec> misses_;
  int symbolic_misses_ = 0;
  std::set<std::string> warned_;  // stale generic records reported
  Status error_;
};

}  // namespace kiln::driver
