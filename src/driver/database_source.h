// The tuning database as a choice source of kernel choice (strategy.h): the
// best record of each node's workload on this target (tune/tune.h), exact
// target first, then a compatible one; nothing for a miss.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "db/database.h"
#include "strategy/strategy.h"
#include "tune/tune.h"

namespace kiln::driver {

class DatabaseSource : public strategy::ChoiceSource {
 public:
  // `workloads`: every node with candidates and its workload (kernels::candidate_workloads).
  DatabaseSource(std::shared_ptr<db::Database> db, std::map<const Node*, tune::Workload> workloads, int threads);
  std::string name() const override { return "database"; }
  std::optional<strategy::Choice> lookup(const Node& n, const std::vector<const strategy::Candidate*>& applicable,
                                         const Target& target) override;
  // Errors met reading the database (reported by the compile that owns it).
  const Status& error() const { return error_; }

 private:
  std::shared_ptr<db::Database> db_;
  std::map<const Node*, tune::Workload> workloads_;
  int threads_;
  std::map<std::string, std::vector<tune::Record>> records_;  // by workload key, read once
  Status error_;
};

}  // namespace kiln::driver
