// The PostgreSQL tuning database (db/database.h), for a team or a fleet: the
// same records, cost models and job queue as the SQLite file, in tables
// prefixed kiln_ (a database may host other applications' tables). Jobs are
// claimed with SELECT ... FOR UPDATE SKIP LOCKED, so any number of workers on
// any number of machines take distinct jobs. Times are the server's. The only
// file that includes libpq's header.
#include <libpq-fe.h>

#include <cstdlib>
#include <memory>
#include <sstream>

#include "db/columns.h"
#include "db/database.h"

namespace kiln::db {

namespace {

const char* const kSchema[] = {
    "CREATE TABLE IF NOT EXISTS kiln_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS kiln_records ("
    " id BIGSERIAL PRIMARY KEY, workload TEXT NOT NULL, anchor_op TEXT NOT NULL, target TEXT NOT NULL,"
    " candidate TEXT NOT NULL, knobs TEXT NOT NULL, schedule TEXT NOT NULL, latencies TEXT NOT NULL,"
    " median_s DOUBLE PRECISION NOT NULL, threads INTEGER NOT NULL, host TEXT NOT NULL, kiln_version TEXT NOT NULL,"
    " time BIGINT NOT NULL, workload_text TEXT NOT NULL, features TEXT NOT NULL DEFAULT '',"
    " feature_version INTEGER NOT NULL DEFAULT 0, evict_bytes BIGINT NOT NULL DEFAULT -1)",
    "CREATE INDEX IF NOT EXISTS kiln_records_by_workload ON kiln_records (workload, target, median_s)",
    "CREATE TABLE IF NOT EXISTS kiln_jobs ("
    " id BIGSERIAL PRIMARY KEY, workload TEXT NOT NULL, target TEXT NOT NULL, anchor_op TEXT NOT NULL,"
    " model TEXT NOT NULL, state TEXT NOT NULL, worker TEXT, lease_until BIGINT, attempts INTEGER NOT NULL DEFAULT 0,"
    " created BIGINT NOT NULL, UNIQUE (workload, target))",
    "CREATE TABLE IF NOT EXISTS kiln_cost_models (name TEXT PRIMARY KEY, blob BYTEA NOT NULL,"
    " trained_on BIGINT NOT NULL, time BIGINT NOT NULL)",
};

const char kNow[] = "EXTRACT(EPOCH FROM clock_timestamp())::BIGINT";

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultDeleter>;

std::string without_password(const std::string& url) {
  size_t at = url.find('@');
  size_t scheme = url.find("://");
  if (at == std::string::npos || scheme == std::string::npos) return url;
  size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon) + ":***" + url.substr(at);
}

class PostgresDatabase : public Database {
 public:
  PostgresDatabase(PGconn* c, std::string where) : conn_(c), where_(std::move(where)) {}
  ~PostgresDatabase() override { PQfinish(conn_); }

  std::string location() const override { return where_; }

  // Runs one statement with text parameters. A lost connection is said so:
  // the caller's work since its last commit is gone, and a restart resumes.
  Result<PgResult> run(const std::string& sql, const std::vector<std::string>& params = {},
                       const std::vector<int>& binary = {}) {
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    for (size_t i = 0; i < params.size(); ++i) {
      values.push_back(params[i].c_str());
      lengths.push_back(static_cast<int>(params[i].size()));
      formats.push_back(i < binary.size() ? binary[i] : 0);
    }
    PgResult r(PQexecParams(conn_, sql.c_str(), static_cast<int>(params.size()), nullptr, values.data(),
                            lengths.data(), formats.data(), 0));
    if (PQstatus(conn_) != CONNECTION_OK)
      return io_error() << where_ << ": the PostgreSQL server went away (" << PQerrorMessage(conn_)
                        << "); committed records are kept, run again to resume";
    ExecStatusType st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
      return io_error() << where_ << ": " << (r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn_));
    return r;
  }
  Status exec(const std::string& sql) { return run(sql).status(); }
  void rollback() { PgResult(PQexec(conn_, "ROLLBACK")); }

  // Creates the tables once (an advisory lock orders concurrent first opens)
  // and checks the schema version.
  Status init() {
    KILN_RETURN_IF_ERROR(exec("BEGIN"));
    Status st = exec("SELECT pg_advisory_xact_lock(hashtext('kiln tuning database'))");
    for (const char* sql : kSchema)
      if (st.is_ok()) st = exec(sql);
    if (st.is_ok())
      st = exec("INSERT INTO kiln_meta (key, value) VALUES ('schema_version', '" + std::to_string(kSchemaVersion) +
                "') ON CONFLICT (key) DO NOTHING");
    Result<PgResult> v = st.is_ok() ? run("SELECT value FROM kiln_meta WHERE key = 'schema_version'")
                                    : Result<PgResult>(st);
    if (!v.is_ok()) {
      rollback();
      return v.status();
    }
    int version = PQntuples(v->get()) == 1 ? std::atoi(PQgetvalue(v->get(), 0, 0)) : 0;
    if (version == 2) {
      // 2 to 3: the version of the features' definition; features stored before it are version 1's.
      st = exec("ALTER TABLE kiln_records ADD COLUMN IF NOT EXISTS feature_version INTEGER NOT NULL DEFAULT 0");
      if (st.is_ok()) st = exec("UPDATE kiln_records SET feature_version = 1 WHERE features <> ''");
      if (st.is_ok()) st = exec("UPDATE kiln_meta SET value = '3' WHERE key = 'schema_version'");
      if (!st.is_ok()) {
        rollback();
        return st.with_context("migrating schema 2 to 3");
      }
      version = 3;
    }
    if (version == 3) {
      // 3 to 4: how each record's runs were timed; records stored before it did not say (-1).
      st = exec("ALTER TABLE kiln_records ADD COLUMN IF NOT EXISTS evict_bytes BIGINT NOT NULL DEFAULT -1");
      if (st.is_ok()) st = exec("UPDATE kiln_meta SET value = '4' WHERE key = 'schema_version'");
      if (!st.is_ok()) {
        rollback();
        return st.with_context("migrating schema 3 to 4");
      }
      version = 4;
    }
    if (version > kSchemaVersion) {
      rollback();
      return unsupported() << where_ << ": tuning database schema version " << version << " is newer than this Kiln's ("
                           << kSchemaVersion << "); use a newer Kiln";
    }
    if (version < kSchemaVersion) {
      rollback();
      return unsupported() << where_ << ": tuning database schema version " << version << " is not one Kiln wrote";
    }
    return exec("COMMIT");
  }

  Status commit(const std::vector<tune::Record>& records) override {
    KILN_RETURN_IF_ERROR(exec("BEGIN"));
    for (const tune::Record& r : records) {
      if (r.latencies_s.empty()) {
        rollback();
        return invalid_argument() << "record of " << r.workload << " has no latencies";
      }
      std::ostringstream med;
      med.precision(17);
      med << r.median_s();
      auto st = run("INSERT INTO kiln_records (workload, anchor_op, target, candidate, knobs, schedule, latencies, median_s,"
                    " threads, host, kiln_version, time, workload_text, features, feature_version, evict_bytes)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
                    {r.workload, r.anchor_op, r.target, r.candidate, r.knobs, r.schedule, numbers_text(r.latencies_s, 9), med.str(),
                     std::to_string(r.threads), r.host, r.kiln_version, std::to_string(r.time), r.workload_text,
                     numbers_text(r.features, 7), std::to_string(r.features.empty() ? 0 : r.feature_version),
                     std::to_string(r.evict_bytes)});
      if (!st.is_ok()) {
        rollback();
        return st.status();
      }
    }
    return exec("COMMIT");
  }

  static tune::Record row(PGresult* r, int i) {
    tune::Record rec;
    rec.workload = PQgetvalue(r, i, 0);
    rec.anchor_op = PQgetvalue(r, i, 1);
    rec.target = PQgetvalue(r, i, 2);
    rec.candidate = PQgetvalue(r, i, 3);
    rec.knobs = PQgetvalue(r, i, 4);
    rec.schedule = PQgetvalue(r, i, 5);
    rec.latencies_s = parse_numbers<double>(PQgetvalue(r, i, 6));
    rec.threads = std::atoi(PQgetvalue(r, i, 7));
    rec.host = PQgetvalue(r, i, 8);
    rec.kiln_version = PQgetvalue(r, i, 9);
    rec.time = std::atoll(PQgetvalue(r, i, 10));
    rec.workload_text = PQgetvalue(r, i, 11);
    rec.features = parse_numbers<float>(PQgetvalue(r, i, 12));
    rec.feature_version = std::atoi(PQgetvalue(r, i, 13));
    rec.evict_bytes = std::atoll(PQgetvalue(r, i, 14));
    rec.id = std::atoll(PQgetvalue(r, i, 15));
    return rec;
  }

  static constexpr const char* kColumns =
      "SELECT workload, anchor_op, target, candidate, knobs, schedule, latencies, threads, host, kiln_version, time,"
      " workload_text, features, feature_version, evict_bytes, id FROM kiln_records";

  Result<std::vector<tune::Record>> records_for(const std::string& workload) override {
    KILN_ASSIGN_OR_RETURN(PgResult r, run(std::string(kColumns) + " WHERE workload = $1 ORDER BY median_s", {workload}));
    std::vector<tune::Record> out;
    for (int i = 0; i < PQntuples(r.get()); ++i) out.push_back(row(r.get(), i));
    return out;
  }

  Status for_each(const std::function<Status(const tune::Record&)>& f) override {
    KILN_ASSIGN_OR_RETURN(PgResult r, run(std::string(kColumns) + " ORDER BY id"));
    for (int i = 0; i < PQntuples(r.get()); ++i) KILN_RETURN_IF_ERROR(f(row(r.get(), i)));
    return Status::ok();
  }

  Result<Stats> stats() override {
    Stats st;
    KILN_ASSIGN_OR_RETURN(PgResult r, run("SELECT COUNT(*), COUNT(DISTINCT workload), COUNT(DISTINCT target) FROM kiln_records"));
    st.records = std::atoll(PQgetvalue(r.get(), 0, 0));
    st.workloads = std::atoll(PQgetvalue(r.get(), 0, 1));
    st.targets = std::atoll(PQgetvalue(r.get(), 0, 2));
    for (const char* state : {"queued", "running", "done", "failed"}) st.jobs[state] = 0;
    KILN_ASSIGN_OR_RETURN(PgResult j, run("SELECT state, COUNT(*) FROM kiln_jobs GROUP BY state"));
    for (int i = 0; i < PQntuples(j.get()); ++i) st.jobs[PQgetvalue(j.get(), i, 0)] = std::atoll(PQgetvalue(j.get(), i, 1));
    return st;
  }

  Status update_features(const std::vector<tune::Record>& records) override {
    KILN_RETURN_IF_ERROR(exec("BEGIN"));
    for (const tune::Record& r : records) {
      Status st = update_one(r);
      if (!st.is_ok()) {
        rollback();
        return st;
      }
    }
    return exec("COMMIT");
  }

  // One record's features, inside update_features' transaction.
  Status update_one(const tune::Record& r) {
    if (r.id <= 0) return invalid_argument() << "a record of " << r.workload << " was not read from " << where_;
    KILN_ASSIGN_OR_RETURN(PgResult u, run("UPDATE kiln_records SET features = $1, feature_version = $2 WHERE id = $3",
                                          {numbers_text(r.features, 7),
                                           std::to_string(r.features.empty() ? 0 : r.feature_version),
                                           std::to_string(r.id)}));
    if (std::atoll(PQcmdTuples(u.get())) != 1) return invalid_argument() << where_ << " has no record " << r.id;
    return Status::ok();
  }

  Result<int64_t> prune(int keep) override {
    if (keep < 1) return invalid_argument() << "prune must keep at least 1 record per schedule";
    KILN_ASSIGN_OR_RETURN(PgResult r, run("DELETE FROM kiln_records WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER()"
                                          " OVER (PARTITION BY workload, target, threads, candidate, knobs, evict_bytes = 0 ORDER BY time DESC, id DESC)"
                                          " AS n FROM kiln_records) ranked WHERE n > $1)",
                                          {std::to_string(keep)}));
    return static_cast<int64_t>(std::atoll(PQcmdTuples(r.get())));
  }

  Status save_model(const std::string& name, const std::string& blob, int64_t trained_on) override {
    return run(std::string("INSERT INTO kiln_cost_models (name, blob, trained_on, time) VALUES ($1, $2, $3, ") + kNow +
                   ") ON CONFLICT (name) DO UPDATE SET blob = excluded.blob, trained_on = excluded.trained_on,"
                   " time = excluded.time",
               {name, blob, std::to_string(trained_on)}, {0, 1, 0})
        .status();
  }

  Result<std::string> load_model(const std::string& name, int64_t* trained_on) override {
    std::vector<const char*> values = {name.c_str()};
    PgResult r(PQexecParams(conn_, "SELECT blob, trained_on FROM kiln_cost_models WHERE name = $1", 1, nullptr,
                            values.data(), nullptr, nullptr, 1));
    if (!r || PQresultStatus(r.get()) != PGRES_TUPLES_OK)
      return io_error() << where_ << ": reading the cost model: " << PQerrorMessage(conn_);
    if (PQntuples(r.get()) == 0) return std::string();
    if (trained_on) {
      // Binary int8: big-endian.
      const unsigned char* p = reinterpret_cast<const unsigned char*>(PQgetvalue(r.get(), 0, 1));
      int64_t v = 0;
      for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
      *trained_on = v;
    }
    return std::string(PQgetvalue(r.get(), 0, 0), static_cast<size_t>(PQgetlength(r.get(), 0, 0)));
  }

  Result<int64_t> enqueue(const std::vector<JobSpec>& jobs) override {
    KILN_RETURN_IF_ERROR(exec("BEGIN"));
    int64_t n = 0;
    for (const JobSpec& j : jobs) {
      auto r = run(std::string("INSERT INTO kiln_jobs (workload, target, anchor_op, model, state, created) VALUES"
                               " ($1, $2, $3, $4, 'queued', ") + kNow +
                       ") ON CONFLICT (workload, target) DO UPDATE SET state = 'queued', attempts = 0,"
                       " model = excluded.model WHERE kiln_jobs.state = 'failed'",
                   {j.workload, j.target, j.anchor_op, j.model});
      if (!r.is_ok()) {
        rollback();
        return r.status();
      }
      n += std::atoll(PQcmdTuples(r->get()));
    }
    KILN_RETURN_IF_ERROR(exec("COMMIT"));
    return n;
  }

  Result<std::optional<Job>> claim(const std::string& worker, const std::string& target, int lease_s) override {
    KILN_RETURN_IF_ERROR(run(std::string("UPDATE kiln_jobs SET state = 'failed' WHERE state = 'running' AND lease_until < ") +
                             kNow + " AND attempts >= $1",
                             {std::to_string(kMaxJobAttempts)})
                             .status());
    KILN_ASSIGN_OR_RETURN(
        PgResult r,
        run(std::string("UPDATE kiln_jobs SET state = 'running', worker = $1, lease_until = ") + kNow +
                " + $2, attempts = attempts + 1 WHERE id = (SELECT id FROM kiln_jobs WHERE target = $3 AND"
                " (state = 'queued' OR (state = 'running' AND lease_until < " + kNow +
                ")) ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id, workload, target, model, attempts",
            {worker, std::to_string(lease_s), target}));
    if (PQntuples(r.get()) == 0) return std::optional<Job>();
    Job j;
    j.id = std::atoll(PQgetvalue(r.get(), 0, 0));
    j.workload = PQgetvalue(r.get(), 0, 1);
    j.target = PQgetvalue(r.get(), 0, 2);
    j.model = PQgetvalue(r.get(), 0, 3);
    j.attempts = std::atoi(PQgetvalue(r.get(), 0, 4));
    return std::optional<Job>(j);
  }

  Status heartbeat(int64_t job, const std::string& worker, int lease_s) override {
    KILN_ASSIGN_OR_RETURN(PgResult r, run(std::string("UPDATE kiln_jobs SET lease_until = ") + kNow +
                                              " + $1 WHERE id = $2 AND worker = $3 AND state = 'running'",
                                          {std::to_string(lease_s), std::to_string(job), worker}));
    if (std::atoll(PQcmdTuples(r.get())) != 1) return io_error() << where_ << ": job " << job << " is no longer " << worker << "'s";
    return Status::ok();
  }

  Status finish(int64_t job, const std::string& worker, bool ok) override {
    KILN_ASSIGN_OR_RETURN(PgResult r, run("UPDATE kiln_jobs SET state = $1, lease_until = NULL WHERE id = $2 AND"
                                          " worker = $3 AND state = 'running'",
                                          {ok ? "done" : "failed", std::to_string(job), worker}));
    if (std::atoll(PQcmdTuples(r.get())) != 1) return io_error() << where_ << ": job " << job << " is no longer " << worker << "'s";
    return Status::ok();
  }

 private:
  PGconn* conn_;
  std::string where_;
};

}  // namespace

Result<std::unique_ptr<Database>> open_postgres(const std::string& url) {
  PGconn* c = PQconnectdb(url.c_str());
  // The server's notices ("relation already exists, skipping") are not the user's business.
  if (c != nullptr) PQsetNoticeProcessor(c, [](void*, const char*) {}, nullptr);
  auto db = std::make_unique<PostgresDatabase>(c, without_password(url));
  if (c == nullptr || PQstatus(c) != CONNECTION_OK)
    return io_error() << without_password(url) << ": cannot connect to PostgreSQL: "
                      << (c ? PQerrorMessage(c) : "out of memory");
  KILN_RETURN_IF_ERROR(db->init());
  return std::unique_ptr<Database>(std::move(db));
}

}  // namespace kiln::db
