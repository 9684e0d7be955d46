// The tuning database as a choice source of kernel choice (strategy.h): the
// best record of each node's workload on this target (tune/tune.h), exact
// target first, then a compatible one. For a miss, where the database holds a
// trained cost model (tune/cost_model.h), the model's pick among the
// priority candidate's default point and a few points drawn from its space
// (seeded by the workload, so a compile is repeatable), without measuring:
// the source is then "predicted". The default point stays unless at least
// three points score above it.
#pragma once

#include <map>
#include <memory>
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
  // Errors met reading the database (reported by the compile that owns it).
  const Status& error() const { return error_; }

 private:
  std::shared_ptr<db::Database> db_;
  std::optional<strategy::Choice> predict(const Node& n, const kernels::GroupWorkload& gw,
                                          const std::vector<const strategy::Candidate*>& applicable, const Target& target);
  const Graph& graph_;
  std::map<const Node*, kernels::GroupWorkload> workloads_;
  int threads_;
  std::unique_ptr<tune::CostModel> model_;  // loaded on the first miss
  bool model_loaded_ = false;
  std::map<std::string, std::vector<tune::Record>> records_;  // by workload key, read once
  Status error_;
};

}  // namespace kiln::driver
