#include "tune/tuner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "db/database.h"
#include "driver/compile.h"
#include "frontend/onnx/import.h"
#include "kernels/kernels.h"
#include "strategy/strategy.h"
#include "tune/cost_model.h"
#include "tune/evolve.h"
#include "tune/features.h"

namespace kiln::tune {

namespace {

std::atomic<bool> g_stop{false};

// Confirmation (tune_model): the share of the time budget the search leaves
// to it, the best points measured again beside the default, the factor on
// the minimum time per point, and how often one workload may be confirmed.
constexpr double kConfirmShare = 0.15;
constexpr int kConfirmPoints = 3;
constexpr double kConfirmTimeFactor = 2;
constexpr int kMaxConfirmations = 8;

// One distinct workload of the model and what the search knows of it.
struct Task {
  kernels::GroupWorkload gw;          // the first group with this workload
  int count = 0;                      // groups of the model with it
  std::unique_ptr<Graph> graph;       // the group alone (measure.h)
  size_t anchor_index = 0;
  std::vector<const strategy::Candidate*> candidates;  // applicable, highest priority first
  std::map<std::string, tir::KnobSpace> spaces;        // per candidate
  std::set<std::pair<std::string, std::string>> tried;  // (candidate, knobs) measured or failed
  std::vector<std::pair<double, Trial>> results;        // measured points, any order: the median of each one's latencies
  std::map<std::pair<std::string, std::string>, std::vector<double>> latencies;  // every measurement of each point, pooled
  std::set<std::pair<std::string, std::string>> confirmed;  // points measured again by this run's confirmation
  std::vector<Trial> defaults;  // every candidate's default point, spelled in full
  Trial default_point;  // the first: the priority candidate's (what a compile without the database runs)
  int confirmations = 0;
  std::map<std::pair<std::string, std::string>, std::vector<float>> features;  // scored points' (empty: none)
  int trials = 0;
  bool exhausted = false;
  std::string skipped;  // why it is not tuned

  // The fastest point (null: none with a time; a record without latencies has none).
  const Trial* best_point() const {
    const std::pair<double, Trial>* b = nullptr;
    for (const auto& r : results)
      if (r.first > 0 && (b == nullptr || r.first < b->first)) b = &r;
    return b ? &b->second : nullptr;
  }
  double best_s() const {
    const Trial* b = best_point();
    return b ? point_s(*b) : 0;
  }
  // A point's new measurements, pooled with its earlier ones (as db::best_record judges it).
  void add(const Trial& tr, const std::vector<double>& lat) {
    std::vector<double>& all = latencies[{tr.candidate, tr.knobs}];
    all.insert(all.end(), lat.begin(), lat.end());
    const double s = median_of(all);
    for (auto& r : results)
      if (r.second.candidate == tr.candidate && r.second.knobs == tr.knobs) {
        r.first = s;
        return;
      }
    results.push_back({s, tr});
  }
  double point_s(const Trial& tr) const {
    auto it = latencies.find({tr.candidate, tr.knobs});
    return it == latencies.end() ? 0 : median_of(it->second);
  }
  // The default point's time; where it was not measured, the best point's.
  double default_s() const {
    const double d = point_s(default_point);
    return d > 0 ? d : best_s();
  }
};

}  // namespace

int64_t model_footprint_bytes(const Graph& g) {
  auto bytes = [](const Value* v) -> int64_t {
    const TensorType& t = v->type();
    if (t.is_container() || !t.shape) return 0;
    return t.numel().as_const().value_or(0) * dtype_size(t.dtype);
  };
  int64_t constants = 0;
  for (const Value* v : g.constants()) constants += v->constant().nbytes();
  const std::vector<Node*> nodes = g.nodes();
  std::map<const Node*, size_t> position;
  for (size_t i = 0; i < nodes.size(); ++i) position[nodes[i]] = i;
  // Each activation is live from its producer to its last reader (to the end
  // for the graph's outputs and values read only by subgraphs).
  std::vector<std::vector<const Value*>> dies(nodes.size());
  std::set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  int64_t live = 0, peak = 0;
  for (const Value* v : g.inputs()) live += v->is_constant() ? 0 : bytes(v);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value* v : nodes[i]->outputs()) {
      if (v == nullptr || outputs.count(v) || v->uses().empty()) continue;
      size_t last = i;
      for (const auto& [user, index] : v->uses()) {
        auto it = position.find(user);
        last = it == position.end() ? nodes.size() : std::max(last, it->second);
      }
      if (last < nodes.size()) dies[last].push_back(v);
    }
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const Value* v : nodes[i]->outputs())
      if (v != nullptr) live += bytes(v);
    peak = std::max(peak, live);
    for (const Value* v : dies[i]) live -= bytes(v);
  }
  return constants + peak;
}

namespace {

std::string format_ms(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 1e-3 ? 4 : 3) << s * 1e3;
  return os.str();
}

// New points for a task: half mutations of its best points, half random draws.
std::vector<Trial> propose(Task& t, int n, std::mt19937_64& rng) {
  std::vector<Trial> out;
  std::vector<std::pair<double, Trial>> ranked = t.results;
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  auto fresh = [&](const Trial& tr) {
    if (t.tried.count({tr.candidate, tr.knobs})) return false;
    for (const Trial& o : out)
      if (o.candidate == tr.candidate && o.knobs == tr.knobs) return false;
    return true;
  };
  for (int attempt = 0; attempt < 40 * n && static_cast<int>(out.size()) < n; ++attempt) {
    Trial tr;
    bool mutate = !ranked.empty() && (attempt % 2 == 0);
    if (mutate) {
      // One of the three best, one knob moved.
      const Trial& base = ranked[std::min<size_t>(ranked.size() - 1, rng() % 3)].second;
      auto sp = t.spaces.find(base.candidate);
      if (sp == t.spaces.end() || sp->second.knobs.empty()) continue;
      auto k = tir::parse_knobs(base.knobs);
      if (!k.is_ok()) continue;
      const tir::Knob& knob = sp->second.knobs[rng() % sp->second.knobs.size()];
      if (knob.values.empty()) continue;
      (*k)[knob.name] = knob.values[rng() % knob.values.size()];
      if (!sp->second.contains(*k)) continue;
      tr.candidate = base.candidate;
      tr.knobs = tir::knobs_to_string(*k);
    } else {
      if (t.spaces.empty()) break;
      auto sp = std::next(t.spaces.begin(), static_cast<long>(rng() % t.spaces.size()));
      if (sp->second.knobs.empty()) continue;
      auto k = tir::sample_knobs(sp->second, rng);
      if (!k.is_ok()) continue;
      tr.candidate = sp->first;
      tr.knobs = tir::knobs_to_string(*k);
    }
    if (fresh(tr)) out.push_back(tr);
  }
  return out;
}

}  // namespace

void request_stop() { g_stop = true; }

Result<double> parse_duration(const std::string& text) {
  if (text.empty()) return invalid_argument() << "empty duration";
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  std::string unit(end);
  double scale = unit.empty() || unit == "s" ? 1 : unit == "m" || unit == "min" ? 60 : unit == "h" ? 3600 : -1;
  if (end == text.c_str() || scale < 0 || !std::isfinite(v) || v <= 0)
    return invalid_argument() << "duration '" << text << "': a positive number of seconds, or with s, m or h";
  return v * scale;
}

namespace {

// Stages 1-4 of compilation (driver/compile.cc) with --dim bindings: the
// graph kernel choice would see (a training step's with options.train), and
// its symbol bounds.
Result<std::pair<std::unique_ptr<Graph>, SymbolBounds>> graph_before_choice(const std::string& model_path,
                                                                           const TuneOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(model_path));
  if (!options.dims.empty()) {
    std::map<std::string, Expr, std::less<>> repl;
    for (const auto& [name, v] : options.dims) repl[name] = Expr(v);
    for (Value* v : g->inputs()) {
      if (v->is_constant() || !v->type().shape || v->type().is_container()) continue;
      Shape s;
      for (const Expr& d : *v->type().shape) s.push_back(substitute(d, repl));
      v->set_type(TensorType{v->dtype(), s});
    }
  }
  CompileOptions copts;
  copts.threads = options.threads;
  copts.train = options.train;
  KILN_RETURN_IF_ERROR(driver::check_supported(*g));
  KILN_RETURN_IF_ERROR(driver::append_requested_gradients(*g, copts));
  driver::KernelEvaluator evaluator(copts);
  KILN_ASSIGN_OR_RETURN(passes::PassContext ctx, driver::pass_context(*g, copts, &evaluator));
  KILN_RETURN_IF_ERROR(driver::run_graph_passes(*g, copts, ctx));
  SymbolBounds bounds = ctx.infer.bounds;
  return std::make_pair(std::move(g), std::move(bounds));
}

std::string job_model(const std::string& path, const std::map<std::string, int64_t>& dims) {
  std::string out = path;
  char sep = '|';
  for (const auto& [name, v] : dims) {
    out += sep + name + "=" + std::to_string(v);
    sep = ',';
  }
  return out;
}

Status parse_job_model(const std::string& text, std::string* path, std::map<std::string, int64_t>* dims) {
  size_t bar = text.find('|');
  *path = text.substr(0, bar);
  if (bar == std::string::npos) return Status::ok();
  std::istringstream is(text.substr(bar + 1));
  std::string item;
  while (std::getline(is, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos) return invalid_argument() << "job model '" << text << "': bad binding '" << item << "'";
    (*dims)[item.substr(0, eq)] = std::atoll(item.c_str() + eq + 1);
  }
  return Status::ok();
}

// What `kiln tune` searches: every node with candidates (its group's
// workload), then every group without one whose generic space holds more
// than its default schedule.
std::vector<kernels::GroupWorkload> tuning_workloads(Graph& g, const SymbolBounds& bounds, bool fuse) {
  std::vector<kernels::GroupWorkload> out = kernels::candidate_workloads(g, bounds, fuse);
  for (kernels::GroupWorkload& gw : kernels::generic_workloads(g, bounds, fuse, /*before_choice=*/true))
    out.push_back(std::move(gw));
  return out;
}

}  // namespace

Result<int64_t> enqueue_model(const std::string& model_path, const TuneOptions& options, std::ostream& log) {
  if (options.train)
    return unsupported() << "a training step's workloads cannot be queued yet: a job names the model and its --dim "
                            "bindings, not the training options; tune them here (kiln tune MODEL --train ...)";
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<db::Database> database, db::open_database(options.db, true));
  KILN_ASSIGN_OR_RETURN(auto prepared, graph_before_choice(model_path, options));
  const std::string target = TargetKey::host(Target::host()).text();
  std::vector<db::JobSpec> jobs;
  std::set<std::string> seen;
  for (kernels::GroupWorkload& gw : tuning_workloads(*prepared.first, prepared.second, true))
    if ((!gw.generic || !strategy::generic_space(gw.def, Target::host(), options.threads).knobs.empty()) &&
        seen.insert(gw.workload.key).second)
      jobs.push_back(db::JobSpec{gw.workload.key, target, gw.workload.anchor_op, job_model(model_path, options.dims)});
  KILN_ASSIGN_OR_RETURN(int64_t queued, database->enqueue(jobs));
  log << "queued " << queued << " of " << jobs.size() << " workloads of " << model_path << " in "
      << database->location() << "\n";
  return queued;
}

namespace {

// The records of one workload (its group alone: group_graph's) whose features
// are not this Kiln's, on this target, with their features recomputed, into
// *changed; the others counted in *summary.
void refeature_records(const Graph* group, const Status& no_group, size_t anchor, std::vector<Record>& recs,
                       const std::string& target_key, RefeatureSummary* summary, std::vector<Record>* changed,
                       std::ostream& log) {
  for (Record& r : recs) {
    if (r.target != target_key) {
      ++summary->other_target;
      continue;
    }
    if (r.feature_version == kFeatureVersion && r.features.size() == static_cast<size_t>(kNumFeatures)) {
      ++summary->current;
      continue;
    }
    Result<std::vector<float>> f = group != nullptr ? trial_features(*group, anchor, Trial{r.candidate, r.knobs}, r.threads)
                                                    : Result<std::vector<float>>(no_group);
    if (!f.is_ok()) {
      ++summary->failed;
      log << "kiln: warning: record " << r.id << " (" << (r.candidate.empty() ? "default" : r.candidate) << " "
          << r.knobs << ", workload " << r.workload.substr(0, 12) << ") keeps its features: " << f.status().to_string()
          << "\n";
      continue;
    }
    r.features = std::move(*f);
    r.feature_version = kFeatureVersion;
    changed->push_back(r);
  }
}

}  // namespace

Result<RefeatureSummary> refeature_model(const std::string& model_path, const TuneOptions& options,
                                         std::ostream& log) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<db::Database> database, db::open_database(options.db, false));
  KILN_ASSIGN_OR_RETURN(auto prepared, graph_before_choice(model_path, options));
  CompileOptions copts;
  copts.train = options.train;
  const std::string target_key = TargetKey::host(Target::host()).text();
  RefeatureSummary summary;
  std::vector<Record> changed;
  std::set<std::string> seen;
  for (kernels::GroupWorkload& gw : tuning_workloads(*prepared.first, prepared.second, driver::fusion_enabled(copts))) {
    if (!seen.insert(gw.workload.key).second) continue;
    KILN_ASSIGN_OR_RETURN(std::vector<Record> recs, database->records_for(gw.workload.key));
    if (recs.empty()) continue;
    ++summary.workloads;
    size_t anchor = 0;
    Result<std::unique_ptr<Graph>> group = group_graph(*prepared.first, gw, &anchor);
    refeature_records(group.is_ok() ? group->get() : nullptr, group.status(), anchor, recs, target_key, &summary,
                      &changed, log);
  }
  KILN_RETURN_IF_ERROR(database->update_features(changed));
  summary.updated = static_cast<int64_t>(changed.size());
  return summary;
}

Result<WorkerSummary> run_worker(const WorkerOptions& options, std::ostream& log) {
  g_stop = false;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<db::Database> database, db::open_database(options.tune.db, false));
  const std::string target = TargetKey::host(Target::host()).text();
  WorkerSummary summary;
  while (!g_stop) {
    KILN_ASSIGN_OR_RETURN(std::optional<db::Job> job, database->claim(options.name, target, options.lease_s));
    if (!job) {
      if (options.exit_when_idle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(options.idle_poll_s * 1000)));
      continue;
    }
    log << options.name << ": job " << job->id << " (workload " << job->workload.substr(0, 12) << ", attempt "
        << job->attempts << ")\n";
    TuneOptions to = options.tune;
    to.only_workloads = {job->workload};
    std::string path;
    Status st = parse_job_model(job->model, &path, &to.dims);
    // The lease is renewed while the job runs, on the worker's own connection.
    std::atomic<bool> done{false};
    std::atomic<bool> lost{false};
    std::thread beat([&] {
      auto db2 = db::open_database(options.tune.db, false);
      while (!done) {
        for (int i = 0; i < options.lease_s * 10 / 3 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (done || !db2.is_ok()) break;
        if (!(*db2)->heartbeat(job->id, options.name, options.lease_s).is_ok()) lost = true;
      }
    });
    std::ostringstream quiet;
    Result<TuneSummary> r = st.is_ok() ? tune_model(path, to, quiet) : Result<TuneSummary>(st);
    done = true;
    beat.join();
    if (r.is_ok()) summary.trials += r->trials;
    if (!r.is_ok()) log << options.name << ": job " << job->id << " failed: " << r.status().to_string() << "\n";
    if (lost) {
      log << options.name << ": job " << job->id << " was taken back (lease lost); its committed records stay\n";
      continue;
    }
    KILN_RETURN_IF_ERROR(database->finish(job->id, options.name, r.is_ok()));
    ++summary.jobs;
    if (!r.is_ok()) ++summary.failed;
  }
  return summary;
}

Result<TuneSummary> tune_model(const std::string& model_path, const TuneOptions& options, std::ostream& log) {
  g_stop = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  TuneSummary summary;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<db::Database> database, db::open_database(options.db, true));

  // Stages 1-4 of compilation (driver/compile.cc), then the workloads kernel choice would ask for.
  KILN_ASSIGN_OR_RETURN(auto prepared, graph_before_choice(model_path, options));
  std::unique_ptr<Graph> g = std::move(prepared.first);
  CompileOptions copts;
  copts.threads = options.threads;
  const SymbolBounds bounds = std::move(prepared.second);
  const Target& target = Target::host();
  const std::string target_key = TargetKey::host(target).text();
  strategy::SelectOptions so;
  so.target = target;
  so.threads = options.threads;

  std::vector<Task> tasks;
  std::map<std::string, size_t> by_key;
  std::set<std::string> single_point;  // workloads of generic kernels whose space holds only the default schedule
  for (kernels::GroupWorkload& gw : tuning_workloads(*g, bounds, driver::fusion_enabled(copts))) {
    if (!options.only_workloads.empty() && !options.only_workloads.count(gw.workload.key)) continue;
    auto it = by_key.find(gw.workload.key);
    if (it != by_key.end()) {
      ++tasks[it->second].count;
      continue;
    }
    if (single_point.count(gw.workload.key)) continue;
    Task t;
    t.gw = std::move(gw);
    t.count = 1;
    if (t.gw.generic) {
      tir::KnobSpace space = strategy::generic_space(t.gw.def, target, options.threads);
      if (space.knobs.empty()) {
        single_point.insert(t.gw.workload.key);
        continue;
      }
      t.spaces[strategy::kGenericCandidate] = std::move(space);
    }
    by_key[t.gw.workload.key] = tasks.size();
    auto sub = group_graph(*g, t.gw, &t.anchor_index);
    if (!sub.is_ok()) {
      t.skipped = sub.status().to_string();
    } else if (!t.gw.generic) {
      t.graph = std::move(*sub);
      const Node& anchor = *t.graph->nodes()[t.anchor_index];
      t.candidates = strategy::applicable_candidates(*t.graph, anchor, so);
      for (const strategy::Candidate* c : t.candidates)
        t.spaces[c->name] = c->space ? c->space(anchor, target) : tir::KnobSpace{};
      if (t.candidates.empty()) {
        std::vector<std::string> rejected;
        strategy::applicable_candidates(*t.graph, anchor, so, &rejected);
        t.skipped = "no candidate applies to the group alone";
        for (size_t i = 0; i < rejected.size(); ++i) t.skipped += (i ? "; " : ": ") + rejected[i];
      }
    } else {
      t.graph = std::move(*sub);
    }
    tasks.push_back(std::move(t));
  }
  summary.workloads = static_cast<int>(tasks.size());
  log << "tuning " << model_path << ": " << tasks.size() << " workloads (" << single_point.size()
      << " more without a candidate have one schedule), " << options.threads
      << " thread" << (options.threads == 1 ? "" : "s") << ", target " << target.name << "\n";

  // What the database already holds for this target and thread count: resumed, not measured again.
  // Records whose features are of an older definition get this Kiln's (kiln tune --refeature).
  RefeatureSummary refeatured;
  std::vector<Record> stale;
  for (Task& t : tasks) {
    KILN_ASSIGN_OR_RETURN(std::vector<Record> recs, database->records_for(t.gw.workload.key));
    if (t.graph) refeature_records(t.graph.get(), Status::ok(), t.anchor_index, recs, target_key, &refeatured, &stale, log);
    for (const Record& r : recs) {
      // Points timed the other way (warm against evicted) are measured again, not resumed.
      if (r.target != target_key || r.threads != options.threads || r.timed_warm() == options.measure.flush) continue;
      // One spelling per point (a record from before a knob existed: the knob's absent value).
      Trial point{r.candidate, r.knobs};
      auto sp = t.spaces.find(r.candidate);
      if (auto k = tir::parse_knobs(r.knobs); k.is_ok() && sp != t.spaces.end())
        point.knobs = tir::knobs_to_string(sp->second.complete(*k));
      if (t.tried.insert({point.candidate, point.knobs}).second) ++summary.resumed;
      t.add(point, r.latencies_s);
    }
  }
  if (!stale.empty()) {
    KILN_RETURN_IF_ERROR(database->update_features(stale));
    log << "recomputed the features of " << stale.size() << " records (features of an older definition)\n";
  }

  // The cost model, trained on every record of the database that has
  // features (other models' too: what was learned there carries over), and
  // retrained as this run's records arrive.
  std::vector<Sample> samples;
  KILN_RETURN_IF_ERROR(database->for_each([&](const Record& r) -> Status {
    if (auto sample = sample_of(r)) samples.push_back(std::move(*sample));
    return Status::ok();
  }));
  CostModel model;
  size_t trained_on = 0;
  auto retrain = [&] {
    if (samples.size() < 32 || samples.size() < trained_on + trained_on / 4 + 8) return;
    if (model.train(samples, options.objective).is_ok()) trained_on = samples.size();
  };
  retrain();
  // Between two runs of a kernel, the rest of the model passes through the
  // caches: evict as much as the model touches, where that is less than
  // everything (weights of a model that fits in the last-level cache stay there).
  MeasureOptions measure = options.measure;
  if (measure.flush && measure.flush_bytes == 0)
    measure.flush_bytes = std::min(full_flush_bytes(), std::max<int64_t>(model_footprint_bytes(*g), 1));
  if (measure.flush) log << "evicting " << (measure.flush_bytes + (1 << 19)) / (1 << 20) << " MB before each timed run\n";
  std::mt19937_64 rng(options.seed);
  auto out_of_budget = [&] {
    return g_stop || elapsed() >= options.time_budget_s ||
           (options.max_trials > 0 && summary.trials >= options.max_trials);
  };
  // The search leaves the end of the budget to the confirmation.
  const double search_budget_s = options.time_budget_s * (options.confirm ? 1.0 - kConfirmShare : 1.0);
  auto search_over = [&] { return out_of_budget() || elapsed() >= search_budget_s; };
  // A batch of new points; or (confirm) points measured before, again, side by side.
  auto run_batch = [&](Task& t, std::vector<Trial> batch, bool confirm = false) -> Status {
    if (options.max_trials > 0 && !confirm)
      batch.resize(std::min<size_t>(batch.size(), static_cast<size_t>(options.max_trials - summary.trials)));
    if (batch.empty()) return Status::ok();
    MeasureOptions mo = measure;
    mo.threads = options.threads;
    if (confirm) {
      mo.interleave = true;
      mo.min_seconds *= kConfirmTimeFactor;
    }
    KILN_ASSIGN_OR_RETURN(std::vector<TrialResult> res, measure_trials(*t.graph, t.anchor_index, batch, mo));
    std::vector<Record> records;
    for (size_t i = 0; i < batch.size(); ++i) {
      t.tried.insert({batch[i].candidate, batch[i].knobs});
      if (confirm && res[i].ok) {
        t.confirmed.insert({batch[i].candidate, batch[i].knobs});
        ++summary.confirmed;
      } else if (!confirm) {
        ++t.trials;
        ++summary.trials;
      }
      if (!res[i].ok) {
        if (!confirm) ++summary.failed;
        if (res[i].error.rfind(kGroupUnmeasurable, 0) == 0) t.skipped = res[i].error;
        log << "  " << t.gw.anchor->describe() << ": " << batch[i].candidate << " '" << batch[i].knobs
            << "' failed: " << res[i].error << "\n";
        continue;
      }
      t.add(batch[i], res[i].latencies_s);
      Record r;
      r.workload = t.gw.workload.key;
      r.anchor_op = t.gw.workload.anchor_op;
      r.target = target_key;
      r.candidate = batch[i].candidate;
      r.knobs = batch[i].knobs;
      r.schedule = res[i].schedule;
      r.latencies_s = res[i].latencies_s;
      r.threads = options.threads;
      r.host = host_name();
      r.kiln_version = kiln_version();
      r.time = static_cast<int64_t>(std::time(nullptr));
      r.workload_text = t.gw.workload.text;
      r.features = res[i].features;
      r.feature_version = r.features.empty() ? 0 : kFeatureVersion;
      r.evict_bytes = mo.flush ? mo.flush_bytes : 0;
      if (auto sample = sample_of(r)) samples.push_back(std::move(*sample));
      records.push_back(std::move(r));
    }
    KILN_RETURN_IF_ERROR(database->commit(records));
    summary.committed += static_cast<int64_t>(records.size());
    return Status::ok();
  };
  auto report = [&](const char* phase) {
    double total_default = 0, total_best = 0;
    for (const Task& t : tasks) {
      total_default += t.count * t.default_s();
      total_best += t.count * t.best_s();
    }
    if (options.live) log << "\033[H\033[J";
    log << std::fixed << std::setprecision(1) << "[" << elapsed() << " s] " << phase << ": " << summary.trials
        << " trials (" << summary.failed << " failed" << (summary.confirmed ? ", " + std::to_string(summary.confirmed) + " points confirmed" : "") << "), kernels tuned " << format_ms(total_default)
        << " -> " << format_ms(total_best) << " ms\n";
    if (!options.live && std::string(phase) != "done" && std::string(phase) != "stopped") return;
    log << "  workload      op         x  trials  default ms  best ms  share\n";
    for (const Task& t : tasks) {
      double share = total_best > 0 ? 100.0 * t.count * t.best_s() / total_best : 0;
      log << "  " << t.gw.workload.key.substr(0, 12) << "  " << std::left << std::setw(10) << t.gw.workload.anchor_op
          << std::right << std::setw(2) << t.count << std::setw(8) << t.trials << std::setw(12)
          << format_ms(t.default_s()) << std::setw(9) << format_ms(t.best_s()) << std::setw(6) << std::setprecision(0)
          << share << "%" << std::setprecision(1) << (t.skipped.empty() ? "" : "  skipped: " + t.skipped) << "\n";
    }
  };

  // Every candidate's default point, spelled in full; the first is the
  // priority choice's: what a compile without the database runs.
  for (Task& t : tasks) {
    if (!t.skipped.empty()) continue;
    const Node& anchor = *t.graph->nodes()[t.anchor_index];
    std::vector<Trial>& d = t.defaults;
    for (const strategy::Candidate* c : t.candidates)
      d.push_back({c->name, tir::knobs_to_string(t.spaces[c->name].complete(
                                c->default_knobs ? c->default_knobs(anchor, target) : tir::Knobs{}))});
    if (t.gw.generic)
      d.push_back({strategy::kGenericCandidate,
                   tir::knobs_to_string(strategy::generic_defaults(t.spaces[strategy::kGenericCandidate]))});
    if (!d.empty()) t.default_point = d.front();
  }
  // Round 0: every candidate at its default knobs.
  for (Task& t : tasks) {
    if (!t.skipped.empty()) {
      log << "  skipping " << t.gw.anchor->describe() << ": " << t.skipped << "\n";
      continue;
    }
    if (out_of_budget()) break;
    std::vector<Trial> batch;
    for (const Trial& tr : t.defaults)
      if (!t.tried.count({tr.candidate, tr.knobs})) batch.push_back(tr);
    KILN_RETURN_IF_ERROR(run_batch(t, batch));
  }
  report("defaults");

  // Search rounds, scheduled by expected gain.
  while (!search_over()) {
    Task* pick = nullptr;
    double best_weight = -1;
    for (Task& t : tasks) {
      if (!t.skipped.empty() || t.exhausted || t.results.empty()) continue;
      double w = t.count * t.best_s() / std::sqrt(1.0 + t.trials);
      if (w > best_weight) {
        best_weight = w;
        pick = &t;
      }
    }
    if (pick == nullptr) break;
    std::vector<Trial> batch;
    if (model.trained()) {
      // Evolutionary search on the model's scores (evolve.h); its best are
      // measured, and two points drawn blind keep exploring where the model
      // may be wrong.
      Task& t = *pick;
      ScoreFn score = [&](const std::vector<Trial>& trials) {
        std::vector<std::vector<float>> feats;
        std::vector<size_t> where;
        for (size_t i = 0; i < trials.size(); ++i) {
          auto key = std::make_pair(trials[i].candidate, trials[i].knobs);
          auto it = t.features.find(key);
          if (it == t.features.end()) {
            auto f = trial_features(*t.graph, t.anchor_index, trials[i], options.threads);
            it = t.features.emplace(key, f.is_ok() ? std::move(*f) : std::vector<float>{}).first;
          }
          if (it->second.empty()) continue;
          feats.push_back(it->second);
          where.push_back(i);
        }
        std::vector<float> out(trials.size(), -std::numeric_limits<float>::infinity());
        auto pred = model.predict(feats);
        if (pred.is_ok())
          for (size_t j = 0; j < where.size(); ++j) out[where[j]] = (*pred)[j];
        return out;
      };
      const int want = options.batch;
      batch = evolve(t.spaces, t.results, t.tried, score, want > 2 ? want - 2 : want, rng);
      for (const Trial& tr : propose(t, want, rng)) {
        if (static_cast<int>(batch.size()) >= want) break;
        bool dup = false;
        for (const Trial& b : batch) dup = dup || (b.candidate == tr.candidate && b.knobs == tr.knobs);
        if (!dup) batch.push_back(tr);
      }
    } else {
      batch = propose(*pick, options.batch, rng);
    }
    if (batch.empty()) {
      pick->exhausted = true;
      continue;
    }
    KILN_RETURN_IF_ERROR(run_batch(*pick, batch));
    retrain();
    report("search");
  }

  // Confirmation. The best of hundreds of noisy measurements is likely one
  // that was measured fast by chance; a point that beats the default only by
  // chance would make the model slower than without the database. So where
  // a workload's best point is not its default, the best few and the default
  // are measured again, side by side (interleaved, MeasureOptions), and each
  // point is judged on all its measurements pooled, as db::best_record judges
  // it. Workloads go by the model time their best claims to save, largest
  // first; one confirmed again if its best is then a point not yet confirmed
  // (each confirmation takes the best unconfirmed points, so this ends).
  auto needs_confirmation = [&](const Task& t) {
    const Trial* b = t.best_point();
    // Without a measured default there is nothing to confirm against (and a
    // compile keeps the priority choice: database_source.cc).
    return t.skipped.empty() && b != nullptr && t.point_s(t.default_point) > 0 && t.confirmations < kMaxConfirmations &&
           !(b->candidate == t.default_point.candidate && b->knobs == t.default_point.knobs) &&
           !t.confirmed.count({b->candidate, b->knobs});
  };
  while (options.confirm && !g_stop && elapsed() < options.time_budget_s) {
    Task* pick = nullptr;
    double most = 0;
    for (Task& t : tasks) {
      if (!needs_confirmation(t)) continue;
      const double gain = t.count * (t.point_s(t.default_point) - t.best_s());
      if (pick == nullptr || gain > most) {
        pick = &t;
        most = gain;
      }
    }
    if (pick == nullptr) break;
    Task& t = *pick;
    std::vector<std::pair<double, Trial>> ranked = t.results;
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    // The default, then the best points not confirmed yet (the best among
    // them), then confirmed ones, best first, up to kConfirmPoints besides the default.
    std::vector<Trial> batch = {t.default_point}, again;
    for (const auto& [sec, tr] : ranked) {
      if (tr.candidate == t.default_point.candidate && tr.knobs == t.default_point.knobs) continue;
      (t.confirmed.count({tr.candidate, tr.knobs}) ? again : batch).push_back(tr);
    }
    const size_t limit = static_cast<size_t>(kConfirmPoints) + 1;
    for (const Trial& tr : again) batch.push_back(tr);
    if (batch.size() > limit) batch.resize(limit);
    ++t.confirmations;
    KILN_RETURN_IF_ERROR(run_batch(t, batch, /*confirm=*/true));
    report("confirm");
  }
  // The model goes with the database it was trained on.
  if (model.trained()) {
    std::vector<Sample> used(samples.begin(), samples.begin() + static_cast<long>(trained_on));
    if (Status st = store_model(*database, model, used); !st.is_ok())
      log << "the cost model was not stored: " << st.to_string() << "\n";
  }
  summary.seconds = elapsed();
  report(g_stop ? "stopped" : "done");
  return summary;
}

}  // namespace kiln::tune
