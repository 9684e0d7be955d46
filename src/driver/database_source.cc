#include "driver/database_source.h"

#include <cstdio>

namespace kiln::driver {

DatabaseSource::DatabaseSource(std::shared_ptr<db::Database> db, std::map<const Node*, tune::Workload> workloads,
                               int threads)
    : db_(std::move(db)), workloads_(std::move(workloads)), threads_(threads) {}

std::optional<strategy::Choice> DatabaseSource::lookup(const Node& n,
                                                       const std::vector<const strategy::Candidate*>& applicable,
                                                       const Target& target) {
  auto w = workloads_.find(&n);
  if (w == workloads_.end() || !error_.is_ok()) return std::nullopt;
  auto it = records_.find(w->second.key);
  if (it == records_.end()) {
    auto recs = db_->records_for(w->second.key);
    if (!recs.is_ok()) {
      error_ = recs.status();
      return std::nullopt;
    }
    it = records_.emplace(w->second.key, std::move(*recs)).first;
  }
  // Only records of candidates that apply here compete.
  std::vector<tune::Record> usable;
  for (const tune::Record& r : it->second)
    for (const strategy::Candidate* c : applicable)
      if (c->name == r.candidate) usable.push_back(r);
  tune::TargetMatch match = tune::TargetMatch::kIncompatible;
  std::optional<tune::Record> best = db::best_record(usable, tune::TargetKey::host(target), threads_, &match);
  if (!best) return std::nullopt;
  auto knobs = tir::parse_knobs(best->knobs);
  if (!knobs.is_ok()) {
    std::fprintf(stderr, "kiln: warning: %s: ignoring the database record %s '%s' (%s)\n", n.describe().c_str(),
                 best->candidate.c_str(), best->knobs.c_str(), knobs.status().to_string().c_str());
    return std::nullopt;
  }
  strategy::Choice c;
  c.candidate = best->candidate;
  c.knobs = *knobs;
  c.source = match == tune::TargetMatch::kExact ? "database" : "database (compatible target)";
  char ms[64];
  std::snprintf(ms, sizeof ms, "%.3f ms", best->median_s() * 1e3);
  c.why = std::string("record ") + ms + " at " + std::to_string(best->threads) + " thread" +
          (best->threads == 1 ? "" : "s") + " on " + best->host + ", workload " + w->second.key.substr(0, 12);
  return c;
}

}  // namespace kiln::driver
