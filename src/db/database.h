// The tuning database: measured records (tune::Record) keyed by workload and
// target, kept forever (history), the best per workload and target served.
//
// SQLite (db/sqlite.cc) is the default: one file, WAL mode, a schema version
// in table kiln_meta with migrations from older versions, safe while several
// processes commit at once (each commit one IMMEDIATE transaction, waiting
// for the others up to a busy timeout). A file that is not a Kiln tuning
// database (corrupt, truncated, another program's) is an error and is never
// written; one of a newer schema is refused with its version.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/status.h"
#include "tune/tune.h"

namespace kiln::db {

// The schema this Kiln writes (older ones are migrated on open).
inline constexpr int kSchemaVersion = 4;  // 2: records' cost-model features, stored cost models; 3: their version;
                                          // 4: how records were timed (evict_bytes)

struct Stats {
  int64_t records = 0;
  int64_t workloads = 0;
  int64_t targets = 0;
  std::map<std::string, int64_t> jobs;  // by state: queued, running, done, failed
};

// A tuning job: one workload of a model to tune on one target. Workers on
// machines of that target claim jobs; `model` is the model file (and
// --dim bindings, as "path|name=value,...") a worker reads, so workers
// must reach the same path.
struct JobSpec {
  std::string workload, target, anchor_op, model;
};
struct Job {
  int64_t id = 0;
  std::string workload, target, model;
  int attempts = 0;
};
// A job whose worker stops heartbeating is claimed again when its lease
// expires; after this many claims it is marked failed.
inline constexpr int kMaxJobAttempts = 3;

class Database {
 public:
  virtual ~Database() = default;
  // Where it is (a path or a URL without its password), for messages.
  virtual std::string location() const = 0;
  // Adds records in one transaction: all of them or none.
  virtual Status commit(const std::vector<tune::Record>& records) = 0;
  // Every record of a workload, on any target (the caller matches targets).
  virtual Result<std::vector<tune::Record>> records_for(const std::string& workload) = 0;
  // Every record, oldest first (export, the cost model's training set).
  virtual Status for_each(const std::function<Status(const tune::Record&)>& f) = 0;
  virtual Result<Stats> stats() = 0;
  // Replaces the features and their version of records read from this
  // database (by Record::id), all in one transaction; nothing else changes.
  virtual Status update_features(const std::vector<tune::Record>& records) = 0;
  // Keeps, per workload, target and candidate with knobs, the `keep` fastest
  // records; returns how many were removed.
  virtual Result<int64_t> prune(int keep) = 0;
  // The cost model trained on this database's records (tune/cost_model.h),
  // by name; an empty blob when there is none.
  virtual Status save_model(const std::string& name, const std::string& blob, int64_t trained_on) = 0;
  virtual Result<std::string> load_model(const std::string& name, int64_t* trained_on = nullptr) = 0;

  // The job queue. enqueue: jobs not yet queued, running or done for their
  // workload and target are queued (a failed one again); returns how many.
  virtual Result<int64_t> enqueue(const std::vector<JobSpec>& jobs) = 0;
  // Claims the oldest queued job of `target` (or one whose lease expired),
  // for `lease_s` seconds; none when the queue is empty.
  virtual Result<std::optional<Job>> claim(const std::string& worker, const std::string& target, int lease_s) = 0;
  // Extends the lease; an error when the job is no longer this worker's.
  virtual Status heartbeat(int64_t job, const std::string& worker, int lease_s) = 0;
  virtual Status finish(int64_t job, const std::string& worker, bool ok) = 0;
};

// Opens a database: a path (SQLite) or a postgresql:// URL. `create`: a
// missing SQLite file is created (with its directory); otherwise it is an error.
Result<std::unique_ptr<Database>> open_database(const std::string& where, bool create);

// The database a compile uses when none is named: $KILN_DB, else
// $XDG_CACHE_HOME/kiln/tuning.db (~/.cache/kiln/tuning.db).
std::string default_database_path();

// The best record for `workload` usable on `host`: the fastest point
// (candidate and knobs) on an exactly equal target, else the fastest on a
// compatible one (*match says which); none on an incompatible target. Records
// with other thread counts count only where none has `threads`. A point (a
// candidate and knobs on one target at one thread count) measured more than
// once (the tuner's confirmation measures its best points again, side by side
// with the default) is judged on the median of all its latencies, so one
// lucky measurement does not make it the best; the record returned is the
// point's latest, with every latency of the point.
std::optional<tune::Record> best_record(const std::vector<tune::Record>& records, const tune::TargetKey& host,
                                        int threads, tune::TargetMatch* match = nullptr);

// The records of one workload that are compared with each other: points
// timed with the caches warm (tune::Record::timed_warm) are not compared with
// points timed after an eviction, as a model runs them; where a workload has
// records of both, those timed after an eviction.
std::vector<tune::Record> timed_alike(std::vector<tune::Record> records);

// One point's records pooled, as best_record judges a point: every latency,
// and the latest record (by time, then row) to stand for the point.
struct PooledPoint {
  std::vector<double> latencies;
  const tune::Record* latest = nullptr;  // points into the records added
  void add(const tune::Record& r);
  // The latest record with every latency of the point.
  tune::Record record() const;
};

// `kiln db export` / `import`: one JSON object per line (tune::Record::to_json).
Status export_records(Database& db, std::ostream& out, int64_t* count = nullptr);
// Reads every line first: a malformed line is an error naming its number and
// nothing is committed.
Status import_records(Database& db, std::istream& in, int64_t* count = nullptr);

}  // namespace kiln::db
