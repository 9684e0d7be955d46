// The tuner end to end on small graphs: workload keys, measurement in child
// processes (a trial that crashes or hangs costs that trial only), and a
// tuned database whose records a compile then uses.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>
#include <thread>

#include "db/database.h"
#include "driver/compile.h"
#include "frontend/onnx/export.h"
#include "kernels/kernels.h"
#include "ops/registry.h"
#include "runtime/vm.h"
#include "strategy/strategy.h"
#include "tune/cost_model.h"
#include "tune/features.h"
#include "tune/measure.h"
#include "tune/tuner.h"

namespace kiln::tune {
namespace {

namespace fs = std::filesystem;

// A MatMul by a constant with a Relu tail: matmul.packed and matmul.default apply.
std::unique_ptr<Graph> mlp(const std::string& batch, int64_t k, int64_t n, uint32_t seed) {
  auto g = std::make_unique<Graph>();
  g->name = "mlp";
  g->source = "mlp";
  g->opsets[""] = 17;
  Shape xs = {batch.empty() ? Expr(int64_t{8}) : var(batch), Expr(k)};
  if (!batch.empty()) g->bounds[batch].lo = 1;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, xs});
  Tensor w(DType::kFloat32, {k, n});
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = dist(rng);
  Value* wv = g->add_constant("w", w);
  Node* mm = g->add_node("MatMul", {x, wv}, {"h"}, "", "mm");
  Node* relu = g->add_node("Relu", {mm->output(0)}, {"y"}, "", "relu");
  g->set_outputs({relu->output(0)});
  return g;
}

std::vector<kernels::GroupWorkload> workloads_of(Graph& g) {
  CompileOptions o;
  driver::KernelEvaluator ev(o);
  auto ctx = driver::pass_context(g, o, &ev);
  EXPECT_TRUE(ctx.is_ok());
  EXPECT_TRUE(driver::run_graph_passes(g, o, *ctx).is_ok());
  return kernels::candidate_workloads(g, ctx->infer.bounds, true);
}

// `g` inferred and written as DIR/NAME; its path ("" on an error, reported).
std::string write_model(Graph& g, const std::string& dir, const std::string& name) {
  ops::InferContext ictx;
  ictx.graph = &g;
  EXPECT_TRUE(ops::infer_shapes(g, ictx).is_ok());
  auto bytes = export_onnx_bytes(g);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  if (!bytes.is_ok()) return "";
  std::string path = dir + "/" + name;
  std::ofstream f(path, std::ios::binary);
  f << *bytes;
  return path;
}

// MODEL compiled for one thread, asking the database at DB.
Result<driver::CompiledProgram> compile_with_db(const std::string& model, const std::string& db) {
  driver::ModelSource src;
  src.path = model;
  CompileOptions o;
  o.threads = 1;
  o.db = db;
  return driver::compile_model(src, o);
}

// A fresh directory, removed with everything in it when the test ends
// (an ASSERT that returns early included).
struct TempDir {
  std::string path;
  TempDir() : path((fs::temp_directory_path() / "kiln_tuner_test_XXXXXX").string()) {
    EXPECT_NE(mkdtemp(path.data()), nullptr);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(Workload, KeysFollowTheComputationNotTheNames) {
  auto a = mlp("batch", 64, 32, 1), b = mlp("N", 64, 32, 2), c = mlp("batch", 64, 48, 1);
  auto wa = workloads_of(*a), wb = workloads_of(*b), wc = workloads_of(*c);
  ASSERT_EQ(wa.size(), 1u);
  ASSERT_EQ(wb.size(), 1u);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wa[0].workload.anchor_op, "MatMul");
  EXPECT_EQ(wa[0].workload.key.size(), 64u);
  EXPECT_EQ(wa[0].group.size(), 2u) << "the Relu tail belongs to the MatMul's workload";
  // Another symbol name and other weights: the same workload.
  EXPECT_EQ(wa[0].workload.key, wb[0].workload.key);
  // Another shape: another workload.
  EXPECT_NE(wa[0].workload.key, wc[0].workload.key);
  // The key hashes the canonicalizer's version with the text.
  EXPECT_EQ(wa[0].workload.key, Workload::make("MatMul", wa[0].workload.text).key);
  EXPECT_NE(wa[0].workload.key, Workload::make("Gemm", wa[0].workload.text).key);
}

// Cache sizes as the kernel lists them (sysfs), which target keys, the cost
// model's features and the measurement's eviction use.
TEST(TargetKeys, CacheSizesParseAsTheKernelWritesThem) {
  EXPECT_EQ(parse_cache_size("48K"), int64_t{48} << 10);
  EXPECT_EQ(parse_cache_size("32768K"), int64_t{32} << 20);
  EXPECT_EQ(parse_cache_size("2M"), int64_t{2} << 20);
  EXPECT_EQ(parse_cache_size("1024"), int64_t{1024});
  for (const char* bad : {"", "K", "12X", "1.5M", "-4K", "48KB", "99999999999999999M"})
    EXPECT_EQ(parse_cache_size(bad), std::nullopt) << bad;
  // This host's, where it can tell, and the key's fields follow them.
  const TargetKey key = TargetKey::host(Target::host());
  EXPECT_EQ(key.l1d_bytes, host_cache_bytes(1));
  EXPECT_EQ(key.l3_bytes, host_cache_bytes(3));
}

// The eviction before each timed run is what a run of the model touches:
// its constants and its activations at their peak.
TEST(Measure, ModelFootprintCountsConstantsAndPeakActivations) {
  auto f32 = [](int64_t r, int64_t c) { return TensorType{DType::kFloat32, Shape{Expr(r), Expr(c)}}; };
  Graph g;
  g.opsets[""] = 17;
  Value* x = g.add_input("x", f32(4, 100));                              // 1600 bytes, live throughout
  Value* w = g.add_constant("w", Tensor(DType::kFloat32, {100, 1000}));  // 400000 bytes
  Node* a = g.add_node("MatMul", {x, w}, {"a"});                         // 16000 bytes each
  Node* b = g.add_node("Relu", {a->output(0)}, {"b"});
  Node* c = g.add_node("Relu", {b->output(0)}, {"c"});                   // b's last reader
  Node* d = g.add_node("Add", {c->output(0), a->output(0)}, {"d"});      // a's and c's
  for (Node* n : {a, b, c, d}) n->output(0)->set_type(f32(4, 1000));         // as inference types them
  g.set_outputs({d->output(0)});
  // Peak: x + a + b + c at c (b's last reader), then x + a + c + d at d.
  EXPECT_EQ(model_footprint_bytes(g), 400000 + 1600 + 3 * 16000);
  // A value of symbolic shape is left out.
  Graph h;
  h.opsets[""] = 17;
  Value* y = h.add_input("y", TensorType{DType::kFloat32, Shape{var("n"), Expr(int64_t{8})}});
  Node* r = h.add_node("Relu", {y}, {"r"});
  r->output(0)->set_type(y->type());
  h.set_outputs({r->output(0)});
  EXPECT_EQ(model_footprint_bytes(h), 0);
}

// The one group of a 64 x 32 MLP, alone (measure.h), and its anchor's index.
Result<std::unique_ptr<Graph>> mlp_group(size_t* anchor) {
  auto g = mlp("", 64, 32, 3);
  auto wl = workloads_of(*g);
  if (wl.size() != 1) return internal_error() << wl.size() << " workloads, not one";
  return group_graph(*g, wl[0], anchor);
}

TEST(Measure, CrashesAndHangsCostOnlyTheirTrial) {
  size_t anchor = 99;
  auto group = mlp_group(&anchor);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  EXPECT_EQ(anchor, 0u);
  std::vector<Trial> trials = {{"matmul.default", ""},
                               {"matmul.packed", "kc=0 mr=4 nr=16 prefetch=0"},
                               {"matmul.packed", "kc=0 mr=2 nr=16 prefetch=0"},
                               {"matmul.packed", "kc=0 mr=1 nr=16 prefetch=0"},
                               {"no.such.candidate", ""}};
  MeasureOptions mo;
  mo.worker = KILN_BINARY;
  mo.min_seconds = 0.01;
  mo.timeout_s = 20;
  // The child crashes on the second trial and hangs on the third.
  ASSERT_EQ(setenv("KILN_TUNE_FAULT", "crash:kc=0 mr=4 nr=16 prefetch=0", 1), 0);
  auto first = measure_trials(**group, anchor, {trials[0], trials[1], trials[3]}, mo);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_TRUE((*first)[0].ok) << (*first)[0].error;
  EXPECT_FALSE((*first)[1].ok);
  EXPECT_NE((*first)[1].error.find("crashed (signal"), std::string::npos) << (*first)[1].error;
  EXPECT_TRUE((*first)[2].ok) << "the trial after the crash runs in a new child: " << (*first)[2].error;
  ASSERT_EQ(setenv("KILN_TUNE_FAULT", "hang:kc=0 mr=2 nr=16 prefetch=0", 1), 0);
  mo.timeout_s = 10;  // the hang costs this much; a slow (sanitized) build must still finish a real trial within it
  auto second = measure_trials(**group, anchor, {trials[2], trials[3], trials[4]}, mo);
  unsetenv("KILN_TUNE_FAULT");
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_NE((*second)[0].error.find("timed out"), std::string::npos) << (*second)[0].error;
  EXPECT_TRUE((*second)[1].ok) << (*second)[1].error;
  EXPECT_GE((*second)[1].latencies_s.size(), 5u);
  EXPECT_FALSE((*second)[1].schedule.empty());
  EXPECT_FALSE((*second)[2].ok);
  EXPECT_NE((*second)[2].error.find("no candidate"), std::string::npos) << (*second)[2].error;
}

// Interleaved timing: every trial prepared, then timed round by round, each
// with at least the minimum count; a child that dies falls back to trials one
// by one, so the crash is still the crashing trial's own.
TEST(Measure, InterleavedTrialsAreTimedSideBySide) {
  size_t anchor = 99;
  auto group = mlp_group(&anchor);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  std::vector<Trial> trials = {{"matmul.default", ""},
                               {"matmul.packed", "kc=0 mr=4 nr=16 prefetch=0"},
                               {"no.such.candidate", ""},
                               {"matmul.packed", "kc=0 mr=1 nr=16 prefetch=0"}};
  MeasureOptions mo;
  mo.worker = KILN_BINARY;
  mo.min_seconds = 0.01;
  mo.min_repeats = 7;
  mo.timeout_s = 60;  // per trial; a slow (sanitized) build must prepare them all within it
  mo.interleave = true;
  auto res = measure_trials(**group, anchor, trials, mo);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  for (size_t i : {0, 1, 3}) {
    EXPECT_TRUE((*res)[i].ok) << i << ": " << (*res)[i].error;
    EXPECT_GE((*res)[i].latencies_s.size(), 7u) << i;
    EXPECT_FALSE((*res)[i].schedule.empty()) << i;
  }
  // Round by round: the timed trials got the same number of runs.
  EXPECT_EQ((*res)[0].latencies_s.size(), (*res)[3].latencies_s.size());
  EXPECT_FALSE((*res)[2].ok);
  EXPECT_NE((*res)[2].error.find("no candidate"), std::string::npos) << (*res)[2].error;

  ASSERT_EQ(setenv("KILN_TUNE_FAULT", "crash:kc=0 mr=4 nr=16 prefetch=0", 1), 0);
  auto crashed = measure_trials(**group, anchor, {trials[0], trials[1], trials[3]}, mo);
  unsetenv("KILN_TUNE_FAULT");
  ASSERT_TRUE(crashed.is_ok()) << crashed.status().to_string();
  EXPECT_TRUE((*crashed)[0].ok) << (*crashed)[0].error;
  EXPECT_FALSE((*crashed)[1].ok);
  EXPECT_NE((*crashed)[1].error.find("crashed (signal"), std::string::npos) << (*crashed)[1].error;
  EXPECT_TRUE((*crashed)[2].ok) << (*crashed)[2].error;
}

// Ctrl-C on a terminal reaches the whole process group, the measuring child
// included: the call ends there, the trials left failing as interrupted,
// instead of a new child measuring them. The test runs in a process group of
// its own (so the signal reaches nothing else), catches SIGINT itself, and
// sends it while the child hangs on the second trial.
void note_sigint(int) {}

TEST(Measure, CtrlCEndsTheCall) {
  size_t anchor = 99;
  auto group = mlp_group(&anchor);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  if (getpgrp() != getpid()) ASSERT_EQ(setpgid(0, 0), 0);  // a session leader already leads its group
  ASSERT_EQ(getpgrp(), getpid());
  struct sigaction sa = {}, old = {};
  sa.sa_handler = note_sigint;
  ASSERT_EQ(sigaction(SIGINT, &sa, &old), 0);
  MeasureOptions mo;
  mo.worker = KILN_BINARY;
  mo.min_seconds = 0.01;
  mo.timeout_s = 120;  // far beyond the test: only the signal ends the hang
  ASSERT_EQ(setenv("KILN_TUNE_FAULT", "hang:kc=0 mr=2 nr=16 prefetch=0", 1), 0);
  std::thread stopper([] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    kill(0, SIGINT);
  });
  const auto start = std::chrono::steady_clock::now();
  auto res = measure_trials(**group, anchor,
                            {{"matmul.default", ""},
                             {"matmul.packed", "kc=0 mr=2 nr=16 prefetch=0"},
                             {"matmul.packed", "kc=0 mr=1 nr=16 prefetch=0"}},
                            mo);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stopper.join();
  unsetenv("KILN_TUNE_FAULT");
  sigaction(SIGINT, &old, nullptr);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  EXPECT_LT(took, 60) << "the hang ended by the signal, not the timeout";
  EXPECT_EQ((*res)[1].error, "interrupted");
  EXPECT_EQ((*res)[2].error, "interrupted") << "no new child measured the rest";
  EXPECT_FALSE((*res)[2].ok);
}

// Every record of a database, oldest first.
std::vector<Record> all_records(db::Database& d) {
  std::vector<Record> out;
  EXPECT_TRUE(d.for_each([&](const Record& r) -> Status {
    out.push_back(r);
    return Status::ok();
  }).is_ok());
  return out;
}

// A short tuning run into dir/NAME with the test's worker binary; no
// confirmation (ConfirmationJudgesTheBestBesideTheDefault tests it), so
// every record is a search trial.
TuneOptions short_run(const std::string& dir, const std::string& name, int64_t trials) {
  TuneOptions to;
  to.db = dir + "/" + name;
  to.max_trials = trials;
  to.measure.worker = KILN_BINARY;
  to.measure.min_seconds = 0.01;
  to.confirm = false;
  return to;
}

// `trials` trials of a fresh MLP (k inputs, n outputs) into dir/tuning.db.
Result<TuneSummary> tune_mlp(const std::string& dir, int64_t k, int64_t n, int64_t trials, TuneOptions* to,
                             std::string* model, std::ostream& log) {
  auto g = mlp("", k, n, 6);
  *model = write_model(*g, dir, "mlp.onnx");
  *to = short_run(dir, "tuning.db", trials);
  return tune_model(*model, *to, log);
}

TEST(Tuner, TunedRecordsAreWhatTheNextCompileUses) {
  TempDir temp;
  const std::string& dir = temp.path;
  auto g = mlp("", 128, 64, 4);
  std::string model = write_model(*g, dir, "mlp.onnx");
  ASSERT_FALSE(model.empty());
  TuneOptions to = short_run(dir, "tuning.db", 10);
  std::ostringstream log;
  auto summary = tune_model(model, to, log);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string() << "\n" << log.str();
  EXPECT_EQ(summary->workloads, 1);
  EXPECT_EQ(summary->trials, 10) << log.str();
  EXPECT_EQ(summary->committed + summary->failed, 10);
  // Resumed: nothing measured twice.
  auto again = tune_model(model, to, log);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->resumed, summary->committed);
  // The records say how they were timed: after evicting the model's footprint.
  {
    auto database = db::open_database(to.db, false);
    ASSERT_TRUE(database.is_ok());
    ASSERT_TRUE((*database)->for_each([&](const Record& r) -> Status {
      EXPECT_GT(r.evict_bytes, 0);
      EXPECT_LE(r.evict_bytes, full_flush_bytes());
      return Status::ok();
    }).is_ok());
  }
  // Timed warm, the same points are measured again, not resumed.
  TuneOptions warm = to;
  warm.measure.flush = false;
  warm.max_trials = 2;
  auto warm_run = tune_model(model, warm, log);
  ASSERT_TRUE(warm_run.is_ok());
  EXPECT_EQ(warm_run->resumed, 0);
  EXPECT_EQ(warm_run->trials, 2);

  // Same results with the tuned database as without.
  auto tuned = compile_with_db(model, to.db);
  ASSERT_TRUE(tuned.is_ok()) << tuned.status().to_string();
  ASSERT_FALSE(tuned->kernel_choices.empty());
  EXPECT_EQ(tuned->kernel_choices[0].source, "database");
  driver::ModelSource src;
  src.path = model;
  CompileOptions plain;
  plain.threads = 1;
  plain.no_db = true;
  auto base = driver::compile_model(src, plain);
  ASSERT_TRUE(base.is_ok());
  EXPECT_NE(base->kernel_choices[0].source, "database");
  Tensor x(DType::kFloat32, {8, 128});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = d(rng);
  runtime::VM va(tuned->program, 1), vb(base->program, 1);
  auto ya = va.run({x}), yb = vb.run({x});
  ASSERT_TRUE(ya.is_ok() && yb.is_ok());
  double err = 0, scale = 0;
  for (int64_t i = 0; i < (*ya)[0].numel(); ++i) {
    err = std::max(err, std::fabs(double((*ya)[0].data_as<float>()[i]) - (*yb)[0].data_as<float>()[i]));
    scale = std::max(scale, std::fabs(double((*yb)[0].data_as<float>()[i])));
  }
  EXPECT_GT(scale, 1.0) << "outputs without spread prove nothing";
  EXPECT_LE(err, 1e-4 * scale);
  // A named database that is not there is an error, not a silent priority compile.
  CompileOptions missing;
  missing.db = dir + "/absent.db";
  EXPECT_FALSE(driver::compile_model(src, missing).is_ok());
}

// Past 32 records the cost model is trained and the search is evolutionary
// (evolve.h): its batches hold valid points, none measured twice.
TEST(Tuner, ModelGuidedSearchMeasuresEachPointOnce) {
  TempDir temp;
  TuneOptions to;
  std::string model;
  std::ostringstream log;
  auto summary = tune_mlp(temp.path, 256, 128, 56, &to, &model, log);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string() << "\n" << log.str();
  EXPECT_EQ(summary->trials, 56) << log.str();
  EXPECT_EQ(summary->failed, 0) << log.str();
  auto database = db::open_database(to.db, false);
  ASSERT_TRUE(database.is_ok());
  std::set<std::pair<std::string, std::string>> points;
  const std::vector<Record> records = all_records(**database);
  for (const Record& r : records)
    EXPECT_TRUE(points.insert({r.candidate, r.knobs}).second) << r.candidate << " " << r.knobs << " measured twice";
  EXPECT_EQ(records.size(), 56u);
  // The model was trained (stored with the database at the end).
  auto blob = (*database)->load_model(kModelName);
  ASSERT_TRUE(blob.is_ok());
  EXPECT_FALSE(blob->empty());
}

// kiln tune --refeature: records whose features are of an older definition
// get this Kiln's back, computed from their candidate and knobs, exactly what
// measuring them gave; records of another target keep theirs; the model then
// trains on all of them.
TEST(Tuner, RefeatureRecomputesStaleFeatures) {
  TempDir temp;
  TuneOptions to;
  std::string model;
  std::ostringstream log;
  auto summary = tune_mlp(temp.path, 128, 64, 6, &to, &model, log);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string() << "\n" << log.str();
  auto database = db::open_database(to.db, false);
  ASSERT_TRUE(database.is_ok());
  std::vector<Record> measured = all_records(**database), stale;
  ASSERT_GE(measured.size(), 2u);
  for (Record r : measured) {
    ASSERT_EQ(r.feature_version, kFeatureVersion);
    ASSERT_EQ(r.features.size(), static_cast<size_t>(kNumFeatures));
    r.features.assign(5, 1.f);
    r.feature_version = kFeatureVersion - 1;
    stale.push_back(r);
  }
  ASSERT_TRUE((*database)->update_features(stale).is_ok());
  Record elsewhere = stale[0];
  elsewhere.target = "isa=sse2 vec=16x16 fma=16 l1d=32768 l2=262144 l3=8388608 cores=4";
  ASSERT_TRUE((*database)->commit({elsewhere}).is_ok());
  std::vector<Sample> none;
  ASSERT_TRUE((*database)->for_each([&](const Record& r) -> Status {
    if (auto s = sample_of(r)) none.push_back(*s);
    return Status::ok();
  }).is_ok());
  EXPECT_TRUE(none.empty()) << "stale features train nothing";

  auto re = refeature_model(model, to, log);
  ASSERT_TRUE(re.is_ok()) << re.status().to_string();
  EXPECT_EQ(re->workloads, 1);
  EXPECT_EQ(re->updated, static_cast<int64_t>(measured.size()));
  EXPECT_EQ(re->other_target, 1);
  EXPECT_EQ(re->failed, 0);
  std::map<int64_t, Record> after;
  for (const Record& r : all_records(**database)) after[r.id] = r;
  for (const Record& m : measured) {
    ASSERT_TRUE(after.count(m.id));
    EXPECT_EQ(after[m.id].features, m.features) << m.candidate << " " << m.knobs;
    EXPECT_EQ(after[m.id].feature_version, kFeatureVersion);
    EXPECT_EQ(after[m.id].latencies_s, m.latencies_s);
  }
  auto again = refeature_model(model, to, log);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->updated, 0);
  EXPECT_EQ(again->current, static_cast<int64_t>(measured.size()));
  // kiln tune does the same for the records of the workloads it tunes, before it trains the model.
  ASSERT_TRUE((*database)->update_features(stale).is_ok());
  TuneOptions one = to;
  one.max_trials = 1;
  std::ostringstream tune_log;
  ASSERT_TRUE(tune_model(model, one, tune_log).is_ok()) << tune_log.str();
  EXPECT_NE(tune_log.str().find("recomputed the features of " + std::to_string(measured.size()) + " records"),
            std::string::npos)
      << tune_log.str();
  for (const Record& r : all_records(**database))
    if (r.target != elsewhere.target) EXPECT_EQ(r.feature_version, kFeatureVersion) << r.id;
}

// kiln tune --train: the workloads of the model's training step (the
// backward's products, whose B is computed, with matmul.dynamic among their
// candidates) are tuned, and compiling the same step with the database takes
// them; the inference graph has only its one MatMul.
TEST(Tuner, TrainingStepKernelsAreTunedAndServed) {
  TempDir temp;
  const std::string& dir = temp.path;
  auto g = mlp("", 128, 64, 4);
  std::string model = write_model(*g, dir, "mlp.onnx");
  ASSERT_FALSE(model.empty());
  TrainOptions t;
  t.loss_kind = "mse";
  t.loss = "kiln.loss";
  t.optimizer = "sgd";
  TuneOptions to = short_run(dir, "tuning.db", 24);
  to.train = t;
  std::ostringstream log;
  auto summary = tune_model(model, to, log);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string() << "\n" << log.str();
  EXPECT_GT(summary->workloads, 1) << log.str();
  EXPECT_GT(summary->committed, 0) << log.str();

  driver::ModelSource src;
  src.path = model;
  CompileOptions with_db;
  with_db.threads = 1;
  with_db.db = to.db;
  with_db.train = t;
  auto step = driver::compile_model(src, with_db);
  ASSERT_TRUE(step.is_ok()) << step.status().to_string();
  int from_db = 0, dynamic = 0;
  for (const auto& k : step->kernel_choices) from_db += k.source == "database";
  EXPECT_GT(from_db, 1) << "the forward's and the backward's products both come from the records";
  // Which candidate wins is the machine's to say; that matmul.dynamic was measured is not.
  auto database = db::open_database(to.db, false);
  ASSERT_TRUE(database.is_ok());
  for (const Record& r : all_records(**database)) dynamic += r.candidate == "matmul.dynamic" || r.candidate == "gemm.dynamic";
  EXPECT_GT(dynamic, 0) << "the backward multiplies two computed values";

  // The inference graph's workloads alone: one MatMul (and its generic kernels).
  TuneOptions inference = short_run(dir, "inference.db", 1);
  auto alone = tune_model(model, inference, log);
  ASSERT_TRUE(alone.is_ok()) << alone.status().to_string();
  EXPECT_LT(alone->workloads, summary->workloads);
}

// A 128 x 64 MLP written to a directory, and its one workload's applicable
// candidates, highest priority first, with the first one's default knobs.
struct MlpCandidates {
  std::string model;
  std::unique_ptr<Graph> shaped;  // after the graph passes: holds the anchor
  std::vector<kernels::GroupWorkload> wl;
  strategy::SelectOptions so;
  std::vector<const strategy::Candidate*> applicable;
  std::string def;
};

MlpCandidates mlp_candidates(const std::string& dir) {
  MlpCandidates m;
  auto g = mlp("", 128, 64, 6);
  m.model = write_model(*g, dir, "mlp.onnx");
  m.shaped = mlp("", 128, 64, 6);
  m.wl = workloads_of(*m.shaped);
  m.so.target = Target::host();
  if (m.wl.size() == 1) m.applicable = strategy::applicable_candidates(*m.shaped, *m.wl[0].anchor, m.so);
  if (!m.applicable.empty())
    m.def = tir::knobs_to_string(m.applicable.front()->default_knobs(*m.wl[0].anchor, m.so.target));
  return m;
}

// Which record a compile takes, on records of known latencies (no timing involved).
TEST(Tuner, CompileTakesTheFastestRecordBeyondNoise) {
  TempDir temp;
  const std::string& dir = temp.path;
  MlpCandidates m = mlp_candidates(dir);
  ASSERT_FALSE(m.model.empty());
  ASSERT_EQ(m.wl.size(), 1u);
  ASSERT_FALSE(m.applicable.empty());
  const std::string& model = m.model;
  const auto& wl = m.wl;
  const auto& so = m.so;
  const auto& applicable = m.applicable;
  const strategy::Candidate* first = applicable.front();
  const std::string& def = m.def;
  std::string other;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100 && (other.empty() || other == def); ++i)
    other = tir::knobs_to_string(*tir::sample_knobs(first->space(*wl[0].anchor, so.target), rng));
  ASSERT_NE(other, def);
  auto rec = [&](const std::string& knobs, double ms, const std::string& target) {
    Record r;
    r.workload = wl[0].workload.key;
    r.anchor_op = "MatMul";
    r.target = target;
    r.candidate = first->name;
    r.knobs = knobs;
    r.latencies_s = {ms * 1e-3, ms * 1e-3, ms * 1e-3};
    r.threads = 1;
    r.host = "test";
    return r;
  };
  const std::string here = TargetKey::host(so.target).text();
  std::string elsewhere = here;
  elsewhere.replace(elsewhere.find("isa="), 4, "isa=a-feature-no-cpu-has,");
  auto pick = [&](const std::vector<Record>& records) -> std::pair<std::string, std::string> {
    std::string path = dir + "/picks" + std::to_string(std::rand()) + ".db";
    auto database = db::open_database(path, true);
    EXPECT_TRUE(database.is_ok());
    EXPECT_TRUE((*database)->commit(records).is_ok());
    auto c = compile_with_db(model, path);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    if (!c.is_ok()) return {};
    return {c->kernel_choices[0].knobs, c->kernel_choices[0].source};
  };
  // Clearly faster than the default point: taken.
  EXPECT_EQ(pick({rec(def, 2.0, here), rec(other, 1.0, here)}), std::make_pair(other, std::string("database")));
  // Within the noise of the default point: the default point stays.
  EXPECT_EQ(pick({rec(def, 2.0, here), rec(other, 1.99, here)}), std::make_pair(def, std::string("database")));
  // A default point recorded before the knobs with an absent value existed is
  // the same point, spelled in full.
  tir::Knobs old_knobs = *tir::parse_knobs(def);
  for (const tir::Knob& k : first->space(*wl[0].anchor, so.target).knobs)
    if (k.absent && old_knobs.count(k.name) && old_knobs[k.name] == *k.absent) old_knobs.erase(k.name);
  const std::string old_def = tir::knobs_to_string(old_knobs);
  ASSERT_NE(old_def, def);
  EXPECT_EQ(pick({rec(old_def, 2.0, here), rec(other, 1.99, here)}), std::make_pair(def, std::string("database")));
  // A point fast once by chance and slow when measured again (the tuner's
  // confirmation) is judged on all its measurements: the default wins.
  Record again = rec(other, 3.0, here);
  again.latencies_s.assign(7, 3.0e-3);
  EXPECT_EQ(pick({rec(def, 2.0, here), rec(other, 1.0, here), again}), std::make_pair(def, std::string("database")));
  // And the default's records pool too: slow once, fast when measured again.
  Record def_again = rec(def, 1.0, here);
  def_again.latencies_s.assign(7, 1.0e-3);
  EXPECT_EQ(pick({rec(def, 3.0, here), rec(other, 1.5, here), def_again}), std::make_pair(def, std::string("database")));
  // Only another candidate was measured (the group alone, where the priority
  // candidate may not apply): nothing says it beats what runs without the
  // database, so the priority choice stays.
  ASSERT_GE(applicable.size(), 2u);
  Record second = rec("", 0.5, here);
  second.candidate = applicable[1]->name;
  second.knobs = tir::knobs_to_string(applicable[1]->default_knobs ? applicable[1]->default_knobs(*wl[0].anchor, so.target)
                                                                   : tir::Knobs{});
  EXPECT_EQ(pick({second}).second, "priority");
  EXPECT_EQ(pick({second, rec(def, 2.0, here)}), std::make_pair(second.knobs, std::string("database")));
  // A point timed warm is not compared with points timed after an eviction
  // (as the model runs them), however fast; among warm records alone, it is.
  Record warm = rec(other, 0.5, here), warm_def = rec(def, 2.0, here);
  warm.evict_bytes = warm_def.evict_bytes = 0;
  EXPECT_EQ(pick({rec(def, 2.0, here), warm}), std::make_pair(def, std::string("database")));
  EXPECT_EQ(pick({warm_def, warm}), std::make_pair(other, std::string("database")));
  // A target this host cannot run is never used, however fast; nothing else: priority.
  EXPECT_EQ(pick({rec(other, 0.1, elsewhere)}).second, "priority");
}

// Where the search's best point is not the default, the confirmation
// measures the default and the best points again, interleaved, and commits
// those records too; the compile then judges each point on all its records.
// The default point is made 2 ms slower per run (KILN_TUNE_FAULT=slow:), so
// the best is another point whatever the machine.
TEST(Tuner, ConfirmationJudgesTheBestBesideTheDefault) {
  TempDir temp;
  MlpCandidates m = mlp_candidates(temp.path);
  ASSERT_FALSE(m.model.empty());
  ASSERT_FALSE(m.applicable.empty());
  const std::string& model = m.model;
  const auto& applicable = m.applicable;
  const std::string& def = m.def;
  TuneOptions to = short_run(temp.path, "tuning.db", 12);
  to.confirm = true;
  ASSERT_EQ(setenv("KILN_TUNE_FAULT", ("slow:" + def).c_str(), 1), 0);
  std::ostringstream log;
  auto summary = tune_model(model, to, log);
  unsetenv("KILN_TUNE_FAULT");
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string() << "\n" << log.str();
  EXPECT_EQ(summary->trials, 12) << log.str();
  EXPECT_EQ(summary->failed, 0) << log.str();
  // The default and up to three best points, in each of at most eight confirmations; a
  // confirmation whose best is then a point not yet confirmed is followed by another, and
  // with 12 points, four confirm them all, so the point the compile takes was confirmed.
  EXPECT_GE(summary->confirmed, 2) << log.str();
  EXPECT_LE(summary->confirmed, 32) << log.str();
  EXPECT_EQ(summary->committed, 12 + summary->confirmed);
  auto database = db::open_database(to.db, false);
  ASSERT_TRUE(database.is_ok());
  std::map<std::pair<std::string, std::string>, int> count;
  for (const Record& r : all_records(**database)) ++count[{r.candidate, r.knobs}];
  EXPECT_GE((count[{applicable.front()->name, def}]), 2) << "the default measured again";
  int twice = 0;
  for (const auto& [point, n] : count) twice += n >= 2;
  EXPECT_GE(twice, 2) << "the default and the best measured again";
  // The compile takes a confirmed point, not the slowed default.
  auto c = compile_with_db(model, to.db);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_FALSE(c->kernel_choices.empty());
  EXPECT_EQ(c->kernel_choices[0].source, "database");
  const std::string chosen = c->kernel_choices[0].knobs;
  EXPECT_FALSE(c->kernel_choices[0].impl == applicable.front()->name && chosen == def);
  bool confirmed = false;
  for (const auto& [point, n] : count)
    if (point.first == c->kernel_choices[0].impl && point.second == chosen) confirmed = n >= 2;
  EXPECT_TRUE(confirmed) << c->kernel_choices[0].impl << " '" << chosen << "' was not measured again\n" << log.str();
}

// A kernel without a candidate (a Softmax) is tuned in the generic space,
// and the next compile serves its record; a record whose point is not in
// the kernel's space is skipped with a warning.
TEST(Tuner, GenericKernelsAreTunedAndServed) {
  TempDir temp;
  const std::string& dir = temp.path;
  auto g = std::make_unique<Graph>();
  g->name = "softmax";
  g->source = "softmax";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{Expr(int64_t{16}), Expr(int64_t{200})}});
  Node* sm = g->add_node("Softmax", {x}, {"y"}, "", "sm");
  g->set_outputs({sm->output(0)});
  std::string model = write_model(*g, dir, "softmax.onnx");
  ASSERT_FALSE(model.empty());
  TuneOptions to;
  to.db = dir + "/tuning.db";
  to.max_trials = 4;
  to.measure.worker = KILN_BINARY;
  to.measure.min_seconds = 0.01;
  to.confirm = false;
  std::ostringstream log;
  auto summary = tune_model(model, to, log);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string() << "\n" << log.str();
  EXPECT_EQ(summary->workloads, 1) << log.str();
  EXPECT_EQ(summary->committed, 4) << log.str();
  auto database = db::open_database(to.db, false);
  ASSERT_TRUE(database.is_ok());
  std::vector<Record> all;
  ASSERT_TRUE((*database)->for_each([&](const Record& r) -> Status {
    all.push_back(r);
    return Status::ok();
  }).is_ok());
  ASSERT_EQ(all.size(), 4u);
  for (const Record& r : all) {
    EXPECT_EQ(r.candidate, strategy::kGenericCandidate);
    EXPECT_EQ(r.anchor_op, "Softmax");
    EXPECT_FALSE(r.schedule.empty());
  }

  driver::ModelSource src;
  src.path = model;
  auto compile = [&](bool with_db) {
    CompileOptions o;
    o.threads = 1;
    if (with_db) o.db = to.db;
    else o.no_db = true;
    return driver::compile_model(src, o);
  };
  auto tuned = compile(true), plain = compile(false);
  ASSERT_TRUE(tuned.is_ok()) << tuned.status().to_string();
  ASSERT_TRUE(plain.is_ok());
  ASSERT_EQ(tuned->kernel_choices.size(), 1u);
  EXPECT_EQ(tuned->kernel_choices[0].impl, strategy::kGenericCandidate);
  EXPECT_EQ(tuned->kernel_choices[0].source, "database");
  EXPECT_EQ(plain->kernel_choices[0].impl, "default");
  Tensor in(DType::kFloat32, {16, 200});
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.f, 3.f);
  for (int64_t i = 0; i < in.numel(); ++i) in.data_as<float>()[i] = d(rng);
  runtime::VM va(tuned->program, 1), vb(plain->program, 1);
  auto ya = va.run({in}), yb = vb.run({in});
  ASSERT_TRUE(ya.is_ok() && yb.is_ok());
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < (*yb)[0].numel(); ++i) {
    float a = (*ya)[0].data_as<float>()[i], b = (*yb)[0].data_as<float>()[i];
    lo = std::min(lo, b);
    hi = std::max(hi, b);
    ASSERT_LE(std::fabs(a - b), 1e-6f) << i;
  }
  EXPECT_GT(hi - lo, 0.1f) << "outputs without spread prove nothing";

  // A record far faster than the others, at a point the space does not hold.
  Record stale = all[0];
  stale.knobs = "vec=3";
  stale.latencies_s = {1e-9, 1e-9, 1e-9};
  ASSERT_TRUE((*database)->commit({stale}).is_ok());
  auto again = compile(true);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->kernel_choices[0].source, "database") << "the stale record is skipped, the others still serve";
  EXPECT_NE(again->kernel_choices[0].knobs, "vec=3");
}

// --tune-missing: a compile queues what the database lacks; a worker tunes
// it; the next compile is served from the database and queues nothing.
TEST(Tuner, TuneMissingQueuesJobsThatAWorkerFills) {
  TempDir temp;
  const std::string& dir = temp.path;
  auto g = mlp("", 96, 48, 8);
  std::string model = write_model(*g, dir, "mlp.onnx");
  ASSERT_FALSE(model.empty());
  const std::string path = dir + "/tuning.db";
  ASSERT_TRUE(db::open_database(path, true).is_ok());
  driver::ModelSource src;
  src.path = model;
  CompileOptions o;
  o.threads = 1;
  o.db = path;
  o.tune_missing = true;
  auto first = driver::compile_model(src, o);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_NE(first->kernel_choices[0].source, "database");
  auto stats = [&] {
    auto database = db::open_database(path, false);
    EXPECT_TRUE(database.is_ok());
    auto st = (*database)->stats();
    EXPECT_TRUE(st.is_ok());
    return st.is_ok() ? *st : db::Stats{};
  };
  EXPECT_EQ(stats().jobs["queued"], 1) << "one kernel, one job";
  // Compiling again before a worker ran queues nothing new.
  ASSERT_TRUE(driver::compile_model(src, o).is_ok());
  EXPECT_EQ(stats().jobs["queued"], 1);

  WorkerOptions wo;
  wo.tune.db = path;
  wo.tune.max_trials = 3;
  wo.tune.measure.worker = KILN_BINARY;
  wo.tune.measure.min_seconds = 0.01;
  wo.tune.confirm = false;
  wo.exit_when_idle = true;
  wo.name = "test-worker";
  std::ostringstream log;
  auto w = run_worker(wo, log);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string() << "\n" << log.str();
  EXPECT_EQ(w->jobs, 1) << log.str();
  EXPECT_EQ(w->failed, 0) << log.str();
  db::Stats after = stats();
  EXPECT_EQ(after.jobs["done"], 1);
  EXPECT_EQ(after.jobs["queued"], 0);
  EXPECT_EQ(after.records, 3);
  auto second = driver::compile_model(src, o);
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(second->kernel_choices[0].source, "database");
  EXPECT_EQ(stats().jobs["queued"], 0) << "a hit queues nothing";
}

// A miss is the stored cost model's pick only when the model's held-out
// pairwise accuracy, stored beside it, reaches the bar.
TEST(Tuner, ZeroShotNeedsAModelThatCarriesOver) {
  TempDir temp;
  const std::string& dir = temp.path;
  auto g = mlp("", 128, 64, 10);
  std::string model = write_model(*g, dir, "mlp.onnx");
  ASSERT_FALSE(model.empty());
  // A model trained on made-up samples: it scores any features.
  std::vector<Sample> samples;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0, 1);
  for (int w = 0; w < 8; ++w)
    for (int p = 0; p < 10; ++p) {
      Sample s;
      s.workload = "w" + std::to_string(w);
      s.features.assign(kNumFeatures, 0.f);
      for (float& f : s.features) f = u(rng);
      s.seconds = 1e-3 * (1 + s.features[0]);
      samples.push_back(s);
    }
  CostModel cm;
  ASSERT_TRUE(cm.train(samples, Objective::kRegression).is_ok());
  auto blob = cm.save();
  ASSERT_TRUE(blob.is_ok());
  auto source_with = [&](const std::string& heldout) {
    std::string path = dir + "/zs" + std::to_string(std::rand()) + ".db";
    auto database = db::open_database(path, true);
    EXPECT_TRUE(database.is_ok());
    EXPECT_TRUE((*database)->save_model(kHeldoutName, heldout, 80).is_ok());
    EXPECT_TRUE((*database)->save_model(kModelName, *blob, 80).is_ok());
    driver::ModelSource src;
    src.path = model;
    CompileOptions o;
    o.threads = 1;
    o.db = path;
    auto c = driver::compile_model(src, o);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? c->kernel_choices[0].source : std::string();
  };
  EXPECT_EQ(source_with("pairwise=0.9000 peak1=0.9 peak5=0.95 workloads=30"), "predicted");
  EXPECT_EQ(source_with("pairwise=0.6000 peak1=0.9 peak5=0.95 workloads=30"), "priority");
  EXPECT_EQ(source_with(""), "priority") << "a model without held-out figures does not pick";
}

}  // namespace
}  // namespace kiln::tune
