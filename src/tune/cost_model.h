// The cost model: gradient-boosted trees (XGBoost through its C API, Debian's
// libxgboost-dev) on the features of scheduled kernels (features.h), trained
// on the tuning database's records. Labels are normalized throughput: a
// record's workload's best latency over its latency (1 for the best point of
// each workload), so workloads of different sizes train one model. Two
// objectives: regression on that label (reg:squarederror) and pairwise
// ranking within each workload (rank:pairwise); `evaluate` measures both on
// workloads the model never saw and the caller keeps the better.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/status.h"
#include "tune/tune.h"

namespace kiln::db {
class Database;
}

namespace kiln::tune {

enum class Objective { kRegression, kRank };
const char* objective_name(Objective o);

struct Sample {
  std::string workload;
  std::vector<float> features;
  double seconds = 0;
};

// A record's sample (its workload on its target and thread count, timed warm
// or not, its features and median latency); nullopt for a record without features.
std::optional<Sample> sample_of(const Record& r);
// Samples of every record with features (records without are skipped).
std::vector<Sample> samples_of(const std::vector<Record>& records);

class CostModel {
 public:
  CostModel();
  ~CostModel();
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;

  Status train(const std::vector<Sample>& samples, Objective objective, int rounds = 200);
  // Higher is faster. Empty input gives an empty result.
  Result<std::vector<float>> predict(const std::vector<std::vector<float>>& features) const;
  bool trained() const { return booster_ != nullptr; }
  Objective objective() const { return objective_; }

  // The trained model as bytes (XGBoost's JSON) with the objective, and back.
  Result<std::string> save() const;
  Status load(const std::string& blob);

 private:
  void* booster_ = nullptr;
  Objective objective_ = Objective::kRegression;
};

// How well `model` orders the points of each workload of `test` (TenSet's
// metrics): pairwise accuracy over pairs of points of one workload with
// different latencies; top-k recall: the share of workloads whose best point
// is among the model's k highest; peak@k: the mean over workloads of best
// latency / latency of the best point among the model's k highest.
struct Evaluation {
  int workloads = 0;
  int64_t pairs = 0;
  double pairwise = 0, top1 = 0, top5 = 0, peak1 = 0, peak5 = 0;
};
Result<Evaluation> evaluate(const CostModel& model, const std::vector<Sample>& test);

// The same figures on workloads held out of training: the samples'
// workloads split into `folds` groups, a model trained on the others
// evaluated on each, pooled. An error when no held-out workload has two points.
Result<Evaluation> cross_validate(const std::vector<Sample>& samples, Objective objective, int folds = 4);

// The database's model and its held-out figures (stored beside it as
// "pairwise=0.8123 peak1=0.9100 peak5=0.9700 workloads=40"; empty when
// there were too few workloads to hold any out).
inline constexpr const char* kModelName = "cost_model";
inline constexpr const char* kHeldoutName = "cost_model.heldout";
std::string heldout_text(const Evaluation& e);
std::optional<Evaluation> parse_heldout(const std::string& text);
// Stores `model`, trained on `samples`, with its held-out figures (cross_validate).
Status store_model(db::Database& database, const CostModel& model, const std::vector<Sample>& samples);

}  // namespace kiln::tune
