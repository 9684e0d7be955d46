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
// The held-out pairwise accuracy a stored model needs to pick at all.
constexpr double kZeroShotMinPairwise = 0.85;
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
    auto blob = db_->load_model(tune::kModelName);
    if (!blob.is_ok()) {
      error_ = blob.status();
      return std::nullopt;
    }
    // The model picks only where, on workloads held out of its training,
    // it ordered pairs of points as well as TenSet's model did on its CPU
    // data; otherwise the priority choice stands (a database with few
    // workloads, or a model that does not carry over).
    auto heldout = db_->load_model(tune::kHeldoutName);
    std::optional<tune::Evaluation> trust = heldout.is_ok() ? tune::parse_heldout(*heldout) : std::nullopt;
    if (!blob->empty() && trust && trust->pairwise >= kZeroShotMinPairwise) {
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
  const strategy::Candidate* first = applicable.front();
  trials.push_back(
      {first->name, tir::knobs_to_string(first->default_knobs ? first->default_knobs(n, target) : tir::Knobs{})});
  const tir::KnobSpace space = first->space ? first->space(n, target) : tir::KnobSpace{};
  for (int i = 0; i < kZeroShotDraws && !space.knobs.empty(); ++i)
    if (auto k = tir::sample_knobs(space, rng); k.is_ok()) trials.push_back({first->name, tir::knobs_to_string(*k)});
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
  const std::vector<tune::Record>& recs = records(workload.key);
  if (!error_.is_ok()) return std::nullopt;
  // Only records of candidates that apply here compete, their knobs spelled
  // in full (a point recorded before a knob existed is the point with the
  // knob's `absent` value: one point, however old its record).
  std::vector<tune::Record> usable;
  for (const strategy::Candidate* c : applicable) {
    std::optional<tir::KnobSpace> space;
    for (const tune::Record& r : recs) {
      if (c->name != r.candidate) continue;
      usable.push_back(r);
      if (!c->space) continue;
      if (!space) space = c->space(n, target);
      if (auto k = tir::parse_knobs(r.knobs); k.is_ok()) usable.back().knobs = tir::knobs_to_string(space->complete(*k));
    }
  }
  tune::TargetMatch match = tune::TargetMatch::kIncompatible;
  std::optional<tune::Record> best = db::best_record(usable, tune::TargetKey::host(target), threads_, &match);
  if (!best) {
    add_miss(w->second, target);
    return predict(n, w->second, applicable, target);
  }
  if (!applicable.empty()) {
    const strategy::Candidate* first = applicable.front();
    tir::Knobs def = first->default_knobs ? first->default_knobs(n, target) : tir::Knobs{};
    if (first->space) def = first->space(n, target).complete(def);
    if (!keep_default_within_noise(usable, first->name, tir::knobs_to_string(def), *best)) return std::nullopt;
  }
  return choice_of(*best, match, n.describe(), workload);
}

std::optional<strategy::Choice> DatabaseSource::lookup_generic(const kernels::GroupWorkload& gw, const Target& target) {
  if (!error_.is_ok()) return std::nullopt;
  const tir::KnobSpace space = strategy::generic_space(gw.def, target, threads_);
  if (space.knobs.empty()) return std::nullopt;
  // A record whose point left the space (the rules that build it changed) is skipped.
  std::vector<tune::Record> usable;
  for (const tune::Record& r : records(gw.workload.key)) {
    if (r.candidate != strategy::kGenericCandidate) continue;
    auto k = tir::parse_knobs(r.knobs);
    if (k.is_ok() && space.contains(*k)) {
      usable.push_back(r);
      usable.back().knobs = tir::knobs_to_string(space.complete(*k));
    } else if (warned_.insert(r.workload + r.knobs).second) {
      std::fprintf(stderr, "kiln: warning: %s: ignoring the database record generic '%s' (not in the kernel's space)\n",
                   gw.anchor->describe().c_str(), r.knobs.c_str());
    }
  }
  tune::TargetMatch match = tune::TargetMatch::kIncompatible;
  std::optional<tune::Record> best = db::best_record(usable, tune::TargetKey::host(target), threads_, &match);
  if (!best) {
    add_miss(gw, target);
    return std::nullopt;
  }
  if (!keep_default_within_noise(usable, strategy::kGenericCandidate,
                                 tir::knobs_to_string(strategy::generic_defaults(space)), *best))
    return std::nullopt;
  return choice_of(*best, match, gw.anchor->describe(), gw.workload);
}

void DatabaseSource::add_miss(const kernels::GroupWorkload& gw, const Target& target) {
  for (const Value* v : gw.inputs)
    if (!v->is_constant() && !v->type().is_static()) {
      ++symbolic_misses_;
      return;
    }
  for (const db::JobSpec& j : misses_)
    if (j.workload == gw.workload.key) return;
  misses_.push_back(db::JobSpec{gw.workload.key, tune::TargetKey::host(target).text(), gw.workload.anchor_op, ""});
}

const std::vector<tune::Record>& DatabaseSource::records(const std::string& key) {
  auto it = records_.find(key);
  if (it == records_.end()) {
    auto recs = db_->records_for(key);
    if (!recs.is_ok()) error_ = recs.status();
    it = records_.emplace(key, recs.is_ok() ? db::timed_alike(std::move(*recs)) : std::vector<tune::Record>{}).first;
  }
  return it->second;
}

// A record replaces a candidate's own default point only when it is faster
// by more than that point's measurement noise (the spread of its middle
// half, at least 2%; every measurement of the point pooled, as
// db::best_record pools them): a kernel timed alone and found 1% faster is as
// likely to be 1% slower in the model. Without a record of the default point
// (the tuner measured the group alone, where the priority candidate may not
// apply: matmul.attention needs the Softmax it reads) nothing says the record
// is faster than what runs without the database: false, and the priority
// choice stays.
bool DatabaseSource::keep_default_within_noise(const std::vector<tune::Record>& usable, const std::string& candidate,
                                               const std::string& default_knobs, tune::Record& best) {
  if (best.candidate == candidate && best.knobs == default_knobs) return true;
  db::PooledPoint def;
  for (const tune::Record& d : usable)
    if (d.candidate == candidate && d.knobs == default_knobs && d.target == best.target && d.threads == best.threads &&
        !d.latencies_s.empty())
      def.add(d);
  if (def.latest == nullptr) return false;
  std::vector<double> v = def.latencies;
  std::sort(v.begin(), v.end());
  const double median = tune::median_of(v);
  const double spread = median > 0 ? (v[v.size() * 3 / 4] - v[v.size() / 4]) / median : 0;
  if (best.median_s() > median * (1 - std::max(0.02, spread))) best = def.record();
  return true;
}

std::optional<strategy::Choice> DatabaseSource::choice_of(const tune::Record& best, tune::TargetMatch match,
                                                          const std::string& where, const tune::Workload& workload) {
  auto knobs = tir::parse_knobs(best.knobs);
  if (!knobs.is_ok()) {
    std::fprintf(stderr, "kiln: warning: %s: ignoring the database record %s '%s' (%s)\n", where.c_str(),
                 best.candidate.c_str(), best.knobs.c_str(), knobs.status().to_string().c_str());
    return std::nullopt;
  }
  strategy::Choice c;
  c.candidate = best.candidate;
  c.knobs = *knobs;
  c.source = match == tune::TargetMatch::kExact ? "database" : "database (compatible target)";
  char ms[64];
  std::snprintf(ms, sizeof ms, "%.3f ms", best.median_s() * 1e3);
  c.why = std::string("record ") + ms + " at " + std::to_string(best.threads) + " thread" +
          (best.threads == 1 ? "" : "s") + " on " + best.host + ", workload " + workload.key.substr(0, 12);
  return c;
}

}  // namespace kiln::driver
