// The only file that includes XGBoost's header.
#include "tune/cost_model.h"

#include <xgboost/c_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>

#include "db/database.h"
#include "tune/features.h"

namespace kiln::tune {

namespace {

Status xgb(int rc, const char* what) {
  if (rc == 0) return Status::ok();
  return internal_error() << "XGBoost " << what << ": " << XGBGetLastError();
}

// Rows grouped by workload (ranking needs each group contiguous).
struct Matrix {
  std::vector<float> data;
  std::vector<float> labels;
  std::vector<unsigned> groups;
  size_t rows = 0;
};

Matrix matrix_of(const std::vector<Sample>& samples) {
  std::map<std::string, std::vector<const Sample*>> by_workload;
  for (const Sample& s : samples)
    if (s.features.size() == static_cast<size_t>(kNumFeatures) && s.seconds > 0) by_workload[s.workload].push_back(&s);
  Matrix m;
  for (const auto& [w, rows] : by_workload) {
    double best = rows.front()->seconds;
    for (const Sample* s : rows) best = std::min(best, s->seconds);
    for (const Sample* s : rows) {
      m.data.insert(m.data.end(), s->features.begin(), s->features.end());
      m.labels.push_back(static_cast<float>(best / s->seconds));
      ++m.rows;
    }
    m.groups.push_back(static_cast<unsigned>(rows.size()));
  }
  return m;
}

}  // namespace

const char* objective_name(Objective o) { return o == Objective::kRank ? "rank:pairwise" : "reg:squarederror"; }

std::optional<Sample> sample_of(const Record& r) {
  if (r.features.size() != static_cast<size_t>(kNumFeatures) || r.feature_version != kFeatureVersion ||
      r.latencies_s.empty())
    return std::nullopt;
  // Normalized per group: a workload on one target at one thread count, timed warm or not.
  return Sample{r.workload + "|" + r.target + "|" + std::to_string(r.threads) + (r.timed_warm() ? "|warm" : ""),
                r.features, r.median_s()};
}

std::vector<Sample> samples_of(const std::vector<Record>& records) {
  std::vector<Sample> out;
  for (const Record& r : records)
    if (auto s = sample_of(r)) out.push_back(std::move(*s));
  return out;
}

CostModel::CostModel() = default;
CostModel::~CostModel() {
  if (booster_) XGBoosterFree(booster_);
}

Status CostModel::train(const std::vector<Sample>& samples, Objective objective, int rounds) {
  Matrix m = matrix_of(samples);
  if (m.rows < 2) return invalid_argument() << "the cost model needs at least 2 records with features, has " << m.rows;
  DMatrixHandle d = nullptr;
  KILN_RETURN_IF_ERROR(xgb(XGDMatrixCreateFromMat(m.data.data(), m.rows, kNumFeatures, NAN, &d), "matrix"));
  struct Free {
    DMatrixHandle d;
    ~Free() { XGDMatrixFree(d); }
  } free_d{d};
  KILN_RETURN_IF_ERROR(xgb(XGDMatrixSetFloatInfo(d, "label", m.labels.data(), m.rows), "labels"));
  if (objective == Objective::kRank)
    KILN_RETURN_IF_ERROR(xgb(XGDMatrixSetUIntInfo(d, "group", m.groups.data(), m.groups.size()), "groups"));
  BoosterHandle b = nullptr;
  KILN_RETURN_IF_ERROR(xgb(XGBoosterCreate(&d, 1, &b), "booster"));
  auto set = [&](const char* k, const char* v) { return xgb(XGBoosterSetParam(b, k, v), k); };
  Status st = set("objective", objective_name(objective));
  if (st.is_ok()) st = set("max_depth", "6");
  if (st.is_ok()) st = set("eta", "0.2");
  if (st.is_ok()) st = set("min_child_weight", "2");
  if (st.is_ok()) st = set("subsample", "0.8");
  if (st.is_ok()) st = set("nthread", "1");
  if (st.is_ok()) st = set("seed", "1");
  if (st.is_ok()) st = set("verbosity", "0");
  for (int i = 0; st.is_ok() && i < rounds; ++i) st = xgb(XGBoosterUpdateOneIter(b, i, d), "training");
  if (!st.is_ok()) {
    XGBoosterFree(b);
    return st;
  }
  if (booster_) XGBoosterFree(booster_);
  booster_ = b;
  objective_ = objective;
  return Status::ok();
}

Result<std::vector<float>> CostModel::predict(const std::vector<std::vector<float>>& features) const {
  if (!booster_) return invalid_argument() << "the cost model is not trained";
  if (features.empty()) return std::vector<float>{};
  std::vector<float> data;
  for (const auto& f : features) {
    if (f.size() != static_cast<size_t>(kNumFeatures))
      return invalid_argument() << "a feature vector of " << f.size() << " values, not " << kNumFeatures;
    data.insert(data.end(), f.begin(), f.end());
  }
  DMatrixHandle d = nullptr;
  KILN_RETURN_IF_ERROR(xgb(XGDMatrixCreateFromMat(data.data(), features.size(), kNumFeatures, NAN, &d), "matrix"));
  bst_ulong n = 0;
  const float* out = nullptr;
  Status st = xgb(XGBoosterPredict(booster_, d, 0, 0, 0, &n, &out), "prediction");
  std::vector<float> result;
  if (st.is_ok()) result.assign(out, out + n);
  XGDMatrixFree(d);
  KILN_RETURN_IF_ERROR(st);
  return result;
}

Result<std::string> CostModel::save() const {
  if (!booster_) return invalid_argument() << "the cost model is not trained";
  bst_ulong n = 0;
  const char* p = nullptr;
  KILN_RETURN_IF_ERROR(xgb(XGBoosterSaveModelToBuffer(booster_, "{\"format\": \"json\"}", &n, &p), "saving"));
  // The objective, then the version of the features it was trained on, then XGBoost's JSON.
  return std::string(objective_ == Objective::kRank ? "R" : "G") + "f" + std::to_string(kFeatureVersion) + ":" +
         std::string(p, n);
}

Status CostModel::load(const std::string& blob) {
  if (blob.size() < 2 || (blob[0] != 'R' && blob[0] != 'G')) return invalid_argument() << "not a stored cost model";
  // Models stored before features were versioned ("R{...") were trained on version 1's.
  int version = 1;
  size_t json = 1;
  if (blob[1] == 'f') {
    size_t colon = blob.find(':');
    char* end = nullptr;
    long v = colon == std::string::npos ? 0 : std::strtol(blob.c_str() + 2, &end, 10);
    if (colon == std::string::npos || end != blob.c_str() + colon || v < 1)
      return invalid_argument() << "not a stored cost model";
    version = static_cast<int>(v);
    json = colon + 1;
  }
  if (version != kFeatureVersion)
    return unsupported() << "the stored cost model was trained on features of version " << version
                                 << ", this Kiln computes version " << kFeatureVersion
                                 << "; retrain it (kiln db train, or kiln tune)";
  BoosterHandle b = nullptr;
  KILN_RETURN_IF_ERROR(xgb(XGBoosterCreate(nullptr, 0, &b), "booster"));
  Status st = xgb(XGBoosterLoadModelFromBuffer(b, blob.data() + json, blob.size() - json), "loading");
  if (!st.is_ok()) {
    XGBoosterFree(b);
    return st;
  }
  if (booster_) XGBoosterFree(booster_);
  booster_ = b;
  objective_ = blob[0] == 'R' ? Objective::kRank : Objective::kRegression;
  return Status::ok();
}

Result<Evaluation> evaluate(const CostModel& model, const std::vector<Sample>& test) {
  std::map<std::string, std::vector<const Sample*>> by_workload;
  for (const Sample& s : test)
    if (s.features.size() == static_cast<size_t>(kNumFeatures) && s.seconds > 0) by_workload[s.workload].push_back(&s);
  Evaluation e;
  int64_t right = 0;
  for (const auto& entry : by_workload) {
    const std::vector<const Sample*>& rows = entry.second;
    if (rows.size() < 2) continue;
    std::vector<std::vector<float>> f;
    for (const Sample* s : rows) f.push_back(s->features);
    KILN_ASSIGN_OR_RETURN(std::vector<float> score, model.predict(f));
    double best = rows.front()->seconds;
    for (const Sample* s : rows) best = std::min(best, s->seconds);
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t j = i + 1; j < rows.size(); ++j) {
        if (rows[i]->seconds == rows[j]->seconds) continue;
        ++e.pairs;
        bool faster_i = rows[i]->seconds < rows[j]->seconds;
        if ((score[i] > score[j]) == faster_i && score[i] != score[j]) ++right;
      }
    std::vector<size_t> order(rows.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
    auto top = [&](size_t k, double* recall, double* peak) {
      double best_in = INFINITY;
      bool hit = false;
      for (size_t i = 0; i < std::min(k, order.size()); ++i) {
        best_in = std::min(best_in, rows[order[i]]->seconds);
        hit = hit || rows[order[i]]->seconds == best;
      }
      *recall += hit ? 1 : 0;
      *peak += best / best_in;
    };
    top(1, &e.top1, &e.peak1);
    top(5, &e.top5, &e.peak5);
    ++e.workloads;
  }
  if (e.workloads == 0) return invalid_argument() << "no workload of the test set has two measured points";
  e.pairwise = e.pairs ? static_cast<double>(right) / static_cast<double>(e.pairs) : 0;
  e.top1 /= e.workloads;
  e.top5 /= e.workloads;
  e.peak1 /= e.workloads;
  e.peak5 /= e.workloads;
  return e;
}

Result<Evaluation> cross_validate(const std::vector<Sample>& samples, Objective objective, int folds) {
  if (folds < 2) return invalid_argument() << "cross-validation needs at least 2 folds";
  // A workload's fold from its key (the sample's workload up to '|'), so its
  // records on every target and thread count are held out together.
  auto fold_of = [folds](const Sample& s) {
    return static_cast<int>(std::hash<std::string>{}(s.workload.substr(0, s.workload.find('|'))) %
                            static_cast<size_t>(folds));
  };
  Evaluation total;
  double right = 0;
  for (int f = 0; f < folds; ++f) {
    std::vector<Sample> train, test;
    for (const Sample& s : samples) (fold_of(s) == f ? test : train).push_back(s);
    if (train.empty() || test.empty()) continue;
    CostModel m;
    KILN_RETURN_IF_ERROR(m.train(train, objective));
    auto e = evaluate(m, test);
    if (!e.is_ok()) continue;  // no workload of this fold has two points
    total.workloads += e->workloads;
    total.pairs += e->pairs;
    right += e->pairwise * static_cast<double>(e->pairs);
    total.top1 += e->top1 * e->workloads;
    total.top5 += e->top5 * e->workloads;
    total.peak1 += e->peak1 * e->workloads;
    total.peak5 += e->peak5 * e->workloads;
  }
  if (total.workloads == 0) return invalid_argument() << "no held-out workload has two measured points";
  total.pairwise = total.pairs ? right / static_cast<double>(total.pairs) : 0;
  total.top1 /= total.workloads;
  total.top5 /= total.workloads;
  total.peak1 /= total.workloads;
  total.peak5 /= total.workloads;
  return total;
}

std::string heldout_text(const Evaluation& e) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "pairwise=%.4f peak1=%.4f peak5=%.4f workloads=%d", e.pairwise, e.peak1, e.peak5,
                e.workloads);
  return buf;
}

std::optional<Evaluation> parse_heldout(const std::string& text) {
  Evaluation e;
  if (std::sscanf(text.c_str(), "pairwise=%lf peak1=%lf peak5=%lf workloads=%d", &e.pairwise, &e.peak1, &e.peak5,
                  &e.workloads) != 4 ||
      !(e.pairwise >= 0 && e.pairwise <= 1) || e.workloads < 0)
    return std::nullopt;
  return e;
}

Status store_model(db::Database& database, const CostModel& model, const std::vector<Sample>& samples) {
  KILN_ASSIGN_OR_RETURN(std::string blob, model.save());
  auto cv = cross_validate(samples, model.objective());
  // Figures cleared, model, figures: a reader (or a write that fails
  // between them) sees no figures, so no picks, rather than one model's
  // figures beside another model.
  const int64_t n = static_cast<int64_t>(samples.size());
  KILN_RETURN_IF_ERROR(database.save_model(kHeldoutName, std::string(), n));
  KILN_RETURN_IF_ERROR(database.save_model(kModelName, blob, n));
  return database.save_model(kHeldoutName, cv.is_ok() ? heldout_text(*cv) : std::string(), n);
}

}  // namespace kiln::tune
