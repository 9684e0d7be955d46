#include "driver/database_source.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "tune/trial.h"

namespace kiln::driver {

namespace {
// Points drawn from each candidate's space for a zero-shot pick, besides its default.
constexpr int kZeroShotDraws = 8;
// The default point stays while fewer than this many points score above it.
constexpr int kZeroShotTrust = 3;
}  // namespace

DatabaseSource::DatabaseSource(std::shared_ptr<db::Database> db, const Graph& graph,
                               std::vector<kernels::GroupWorkload> workloads, int threads)
    : db_(std::move(db)), graph_(graph), threads_(threads) {
  for (kernels::GroupWorkload& gw : workloads) {
    const Node* anchor = gw.anchor;
    workloads_.emplace(anchor, std::move(gw));
  }
}

std::optional<strategy::Choice> DatabaseSource::predict(const Node& n, const kernels::GroupWorkload& gw,
                                                        const std::vector<const strategy::Candidate*>& applicable,
                                                        const Target& target) {
  if (!model_loaded_) {
    model_loaded_ = true;
    auto blob = db_->load_model("cost_model");
    if (!blob.is_ok()) {
      error_ = blob.status();
      return std::nullopt;
    }
    if (!blob->empty()) {
      auto m = std::make_unique<tune::CostModel>();
      if (Status st = m->load(*blob); st.is_ok()) model_ = std::move(m);
      else std::fprintf(stderr, "kiln: warning: %s: the stored cost model does not load (%s)\n",
                        db_->location().c_str(), st.to_string().c_str());
    }
  }
  if (!model_ || applicable.empty()) return std::nullopt;
  size_t anchor = 0;
  auto group = tune::group_graph(graph_, gw, &anchor);
  if (!group.is_ok()) return std::nullopt;
  // The priority candidate's default point and a few drawn from its space.
  // Switching candidates is left to measurement (a record): loop-IR features
  // compare knob points of one template better than different algorithms.
  std::mt19937_64 rng(std::stoull(gw.workload.key.substr(0, 15), nullptr, 16));
  std::vector<tune::Trial> trials;
  for (const strategy::Candidate* c : {applicable.front()}) {
    tir::Knobs def = c->default_knobs ? c->default_knobs(n, target) : tir::Knobs{};
    trials.push_back({c->name, tir::knobs_to_string(def)});
    tir::KnobSpace space = c->space ? c->space(n, target) : tir::KnobSpace{};
    for (int i = 0; i < kZeroShotDraws && !space.knobs.empty(); ++i)
      if (auto k = tir::sample_knobs(space, rng); k.is_ok()) trials.push_back({c->name, tir::knobs_to_string(*k)});
  }
  std::vector<std::vector<float>> feats;
  std::vector<const tune::Trial*> scored;
  for (const tune::Trial& t : trials)
    if (auto f = tune::trial_features(**group, anchor, t, threads_); f.is_ok()) {
      feats.push_back(std::move(*f));
      scored.push_back(&t);
    }
  auto pred = model_->predict(feats);
  if (!pred.is_ok() || pred->empty()) return std::nullopt;
  size_t best = 0;
  for (size_t i = 1; i < pred->size(); ++i)
    if ((*pred)[i] > (*pred)[best]) best = i;
  // The priority choice's default point (trials[0]) stays unless the model
  // ranks it below its top few: on workloads it never saw, the model orders
  // pairs of points less reliably than it finds a good few.
  bool kept_default = false;
  if (!scored.empty() && scored[0] == &trials[0] && best != 0) {
    int above = 0;
    for (size_t i = 1; i < pred->size(); ++i)
      if ((*pred)[i] > (*pred)[0]) ++above;
    if (above < kZeroShotTrust) {
      best = 0;
      kept_default = true;
    }
  }
  auto knobs = tir::parse_knobs(scored[best]->knobs);
  if (!knobs.is_ok()) return std::nullopt;
  strategy::Choice c;
  c.candidate = scored[best]->candidate;
  c.knobs = *knobs;
  c.source = "predicted";
  c.why = (kept_default ? "the default point, in the cost model's top " + std::to_string(kZeroShotTrust) + " of "
                         : "cost model's best of ") +
          std::to_string(scored.size()) + " points, no record of workload " + gw.workload.key.substr(0, 12);
  return c;
}

std::optional<strategy::Choice> DatabaseSource::lookup(const Node& n,
                                                       const std::vector<const strategy::Candidate*>& applicable,
                                                       const Target& target) {
  auto w = workloads_.find(&n);
  if (w == workloads_.end() || !error_.is_ok()) return std::nullopt;
  const tune::Workload& workload = w->second.workload;
  auto it = records_.find(workload.key);
  if (it == records_.end()) {
    auto recs = db_->records_for(workload.key);
    if (!recs.is_ok()) {
      error_ = recs.status();
      return std::nullopt;
    }
    it = records_.emplace(workload.key, std::move(*recs)).first;
  }
  // Only records of candidates that apply here compete.
  std::vector<tune::Record> usable;
  for (const tune::Record& r : it->second)
    for (const strategy::Candidate* c : applicable)
      if (c->name == r.candidate) usable.push_back(r);
  tune::TargetMatch match = tune::TargetMatch::kIncompatible;
  std::optional<tune::Record> best = db::best_record(usable, tune::TargetKey::host(target), threads_, &match);
  if (!best) return predict(n, w->second, applicable, target);
  // A record replaces the priority choice's own default point only when it
  // is faster by more than that point's measurement noise (the spread of its
  // middle half, at least 2%): a kernel timed alone and found 1% faster is as
  // likely to be 1% slower in the model.
  if (!applicable.empty()) {
    const strategy::Candidate* first = applicable.front();
    const std::string def = tir::knobs_to_string(first->default_knobs ? first->default_knobs(n, target) : tir::Knobs{});
    std::vector<tune::Record> same_target;
    for (const tune::Record& r : usable)
      if (r.candidate == first->name && r.knobs == def && r.target == best->target && r.threads == best->threads)
        same_target.push_back(r);
    if (!same_target.empty() && !(best->candidate == first->name && best->knobs == def)) {
      const tune::Record& d = same_target.front();
      std::vector<double> v = d.latencies_s;
      std::sort(v.begin(), v.end());
      const double median = d.median_s();
      const double spread = median > 0 ? (v[v.size() * 3 / 4] - v[v.size() / 4]) / median : 0;
      if (best->median_s() > median * (1 - std::max(0.02, spread))) best = d;
    }
  }
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
          (best->threads == 1 ? "" : "s") + " on " + best->host + ", workload " + workload.key.substr(0, 12);
  return c;
}

}  // namespace kiln::driver
