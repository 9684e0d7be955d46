// The SQLite tuning database (db/database.h). The only file that includes sqlite3.h.
#include <sqlite3.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "db/columns.h"
#include "db/database.h"

namespace kiln::db {

namespace {

constexpr int kBusyTimeoutMs = 30000;

const char* const kSchemaV1[] = {
    "CREATE TABLE kiln_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE records ("
    " id INTEGER PRIMARY KEY, workload TEXT NOT NULL, anchor_op TEXT NOT NULL, target TEXT NOT NULL,"
    " candidate TEXT NOT NULL, knobs TEXT NOT NULL, schedule TEXT NOT NULL, latencies TEXT NOT NULL,"
    " median_s REAL NOT NULL, threads INTEGER NOT NULL, host TEXT NOT NULL, kiln_version TEXT NOT NULL,"
    " time INTEGER NOT NULL, workload_text TEXT NOT NULL)",
    "CREATE INDEX records_by_workload ON records (workload, target, median_s)",
    "CREATE TABLE jobs ("
    " id INTEGER PRIMARY KEY, workload TEXT NOT NULL, target TEXT NOT NULL, anchor_op TEXT NOT NULL,"
    " workload_text TEXT NOT NULL, model TEXT NOT NULL, state TEXT NOT NULL, worker TEXT,"
    " lease_until INTEGER, attempts INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL,"
    " UNIQUE (workload, target))",
    "INSERT INTO kiln_meta (key, value) VALUES ('application', 'kiln tuning database')",
    "INSERT INTO kiln_meta (key, value) VALUES ('schema_version', '1')",
};

// Version 1 to 2: the cost model's features per record (space-separated
// floats, empty where unknown) and the stored cost models.
const char* const kMigrateV1toV2[] = {
    "ALTER TABLE records ADD COLUMN features TEXT NOT NULL DEFAULT ''",
    "CREATE TABLE cost_models (name TEXT PRIMARY KEY, blob BLOB NOT NULL, trained_on INTEGER NOT NULL,"
    " time INTEGER NOT NULL)",
    "UPDATE kiln_meta SET value = '2' WHERE key = 'schema_version'",
};

// Version 2 to 3: the version of the features' definition (tune/features.h);
// features stored before it are version 1's.
const char* const kMigrateV2toV3[] = {
    "ALTER TABLE records ADD COLUMN feature_version INTEGER NOT NULL DEFAULT 1",
    "UPDATE records SET feature_version = 0 WHERE features = ''",
    "UPDATE kiln_meta SET value = '3' WHERE key = 'schema_version'",
};

// Version 3 to 4: how each record's runs were timed (tune::Record::evict_bytes);
// records stored before it did not say (-1).
const char* const kMigrateV3toV4[] = {
    "ALTER TABLE records ADD COLUMN evict_bytes INTEGER NOT NULL DEFAULT -1",
    "UPDATE kiln_meta SET value = '4' WHERE key = 'schema_version'",
};





class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  bool ok() const { return rc_ == SQLITE_OK && stmt_ != nullptr; }
  sqlite3_stmt* get() { return stmt_; }
  void bind(int i, const std::string& s) { sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  std::string text(int col) {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

class SqliteDatabase : public Database {
 public:
  SqliteDatabase(sqlite3* db, std::string path, bool read_only) : db_(db), path_(std::move(path)), read_only_(read_only) {}
  ~SqliteDatabase() override { sqlite3_close_v2(db_); }

  std::string location() const override { return path_; }

  Status error(const std::string& what) const {
    int code = sqlite3_errcode(db_);
    std::string msg = path_ + ": " + what + ": " + sqlite3_errmsg(db_);
    if (code == SQLITE_FULL) return resource_exhausted() << msg;
    if (code == SQLITE_READONLY || code == SQLITE_PERM || code == SQLITE_CANTOPEN) return io_error() << msg;
    if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) return invalid_argument() << msg << " (the file is left as it is)";
    return internal_error() << msg;
  }

  Status exec(const char* sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
    sqlite3_free(err);
    return rc == SQLITE_OK ? Status::ok() : error(std::string("'") + sql + "'");
  }

  // Brings a database of schema `from` to kSchemaVersion, one transaction per
  // step; another process migrating at the same time finds the step done.
  Status migrate(int from) {
    for (int v = from; v < kSchemaVersion; ++v) {
      KILN_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
      Statement cur(db_, "SELECT value FROM kiln_meta WHERE key = 'schema_version'");
      if (!cur.ok() || sqlite3_step(cur.get()) != SQLITE_ROW) {
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
        return error("reading the schema version");
      }
      bool done = std::atoi(cur.text(0).c_str()) > v;
      sqlite3_reset(cur.get());
      Status st;
      auto run_all = [&](const auto& statements) {
        for (const char* sql : statements) {
          st = exec(sql);
          if (!st.is_ok()) break;
        }
      };
      if (!done && v == 1) run_all(kMigrateV1toV2);
      if (!done && v == 2) run_all(kMigrateV2toV3);
      if (!done && v == 3) run_all(kMigrateV3toV4);
      if (!st.is_ok()) {
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
        return st.with_context("migrating schema " + std::to_string(v) + " to " + std::to_string(v + 1));
      }
      KILN_RETURN_IF_ERROR(exec("COMMIT"));
    }
    return Status::ok();
  }

  Status commit(const std::vector<tune::Record>& records) override {
    if (read_only_) return io_error() << path_ << ": the tuning database is read-only; nothing was committed";
    KILN_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
    Status st = insert_all(records);
    if (!st.is_ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    }
    Status done = exec("COMMIT");
    if (!done.is_ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return done;
  }

  Result<std::vector<tune::Record>> records_for(const std::string& workload) override {
    Statement s(db_, "SELECT workload, anchor_op, target, candidate, knobs, schedule, latencies, threads, host,"
                     " kiln_version, time, workload_text, features, feature_version, evict_bytes, id FROM records WHERE workload = ?1 ORDER BY median_s");
    if (!s.ok()) return error("reading records");
    s.bind(1, workload);
    std::vector<tune::Record> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) out.push_back(row(s));
    if (rc != SQLITE_DONE) return error("reading records");
    return out;
  }

  Status for_each(const std::function<Status(const tune::Record&)>& f) override {
    Statement s(db_, "SELECT workload, anchor_op, target, candidate, knobs, schedule, latencies, threads, host,"
                     " kiln_version, time, workload_text, features, feature_version, evict_bytes, id FROM records ORDER BY id");
    if (!s.ok()) return error("reading records");
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) KILN_RETURN_IF_ERROR(f(row(s)));
    if (rc != SQLITE_DONE) return error("reading records");
    return Status::ok();
  }

  Result<Stats> stats() override {
    Stats st;
    auto count = [&](const char* sql, int64_t& out) -> Status {
      Statement s(db_, sql);
      if (!s.ok() || sqlite3_step(s.get()) != SQLITE_ROW) return error(std::string("'") + sql + "'");
      out = sqlite3_column_int64(s.get(), 0);
      return Status::ok();
    };
    KILN_RETURN_IF_ERROR(count("SELECT COUNT(*) FROM records", st.records));
    KILN_RETURN_IF_ERROR(count("SELECT COUNT(DISTINCT workload) FROM records", st.workloads));
    KILN_RETURN_IF_ERROR(count("SELECT COUNT(DISTINCT target) FROM records", st.targets));
    for (const char* state : {"queued", "running", "done", "failed"}) st.jobs[state] = 0;
    Statement s(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
    if (!s.ok()) return error("counting jobs");
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) st.jobs[s.text(0)] = sqlite3_column_int64(s.get(), 1);
    if (rc != SQLITE_DONE) return error("counting jobs");
    return st;
  }

  Status save_model(const std::string& name, const std::string& blob, int64_t trained_on) override {
    if (read_only_) return io_error() << path_ << ": the tuning database is read-only; the cost model was not stored";
    Statement s(db_, "INSERT OR REPLACE INTO cost_models (name, blob, trained_on, time) VALUES (?1, ?2, ?3,"
                     " strftime('%s', 'now'))");
    if (!s.ok()) return error("storing the cost model");
    sqlite3_bind_blob(s.get(), 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    s.bind(1, name);
    s.bind(3, trained_on);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return error("storing the cost model");
    return Status::ok();
  }

  Result<std::string> load_model(const std::string& name, int64_t* trained_on) override {
    Statement s(db_, "SELECT blob, trained_on FROM cost_models WHERE name = ?1");
    if (!s.ok()) return error("reading the cost model");
    s.bind(1, name);
    int rc = sqlite3_step(s.get());
    if (rc == SQLITE_DONE) return std::string();
    if (rc != SQLITE_ROW) return error("reading the cost model");
    const void* p = sqlite3_column_blob(s.get(), 0);
    int n = sqlite3_column_bytes(s.get(), 0);
    if (trained_on) *trained_on = sqlite3_column_int64(s.get(), 1);
    return std::string(static_cast<const char*>(p), static_cast<size_t>(n));
  }

  Result<int64_t> enqueue(const std::vector<JobSpec>& jobs) override {
    if (read_only_) return io_error() << path_ << ": the tuning database is read-only; nothing was queued";
    KILN_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
    Statement s(db_,
                "INSERT INTO jobs (workload, target, anchor_op, workload_text, model, state, created)"
                " VALUES (?1, ?2, ?3, '', ?4, 'queued', strftime('%s', 'now'))"
                " ON CONFLICT (workload, target) DO UPDATE SET state = 'queued', attempts = 0, model = excluded.model"
                " WHERE jobs.state = 'failed'");
    int64_t n = 0;
    Status st = s.ok() ? Status::ok() : error("queueing jobs");
    for (size_t i = 0; st.is_ok() && i < jobs.size(); ++i) {
      sqlite3_reset(s.get());
      s.bind(1, jobs[i].workload);
      s.bind(2, jobs[i].target);
      s.bind(3, jobs[i].anchor_op);
      s.bind(4, jobs[i].model);
      if (sqlite3_step(s.get()) != SQLITE_DONE) st = error("queueing a job");
      else n += sqlite3_changes(db_);
    }
    if (!st.is_ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    }
    KILN_RETURN_IF_ERROR(exec("COMMIT"));
    return n;
  }

  Result<std::optional<Job>> claim(const std::string& worker, const std::string& target, int lease_s) override {
    if (read_only_) return io_error() << path_ << ": the tuning database is read-only";
    // One IMMEDIATE transaction: no other process writes between the pick and the update.
    KILN_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
    auto fail = [&](const char* what) {
      Status st = error(what);
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    };
    {
      Statement dead(db_, "UPDATE jobs SET state = 'failed' WHERE state = 'running' AND lease_until < strftime('%s', 'now')"
                          " AND attempts >= ?1");
      if (!dead.ok()) return fail("expiring jobs");
      dead.bind(1, static_cast<int64_t>(kMaxJobAttempts));
      if (sqlite3_step(dead.get()) != SQLITE_DONE) return fail("expiring jobs");
    }
    Statement pick(db_, "SELECT id, workload, target, model, attempts FROM jobs WHERE target = ?1 AND (state = 'queued'"
                        " OR (state = 'running' AND lease_until < strftime('%s', 'now'))) ORDER BY id LIMIT 1");
    if (!pick.ok()) return fail("claiming a job");
    pick.bind(1, target);
    int rc = sqlite3_step(pick.get());
    if (rc == SQLITE_DONE) {
      KILN_RETURN_IF_ERROR(exec("COMMIT"));
      return std::optional<Job>();
    }
    if (rc != SQLITE_ROW) return fail("claiming a job");
    Job job;
    job.id = sqlite3_column_int64(pick.get(), 0);
    job.workload = pick.text(1);
    job.target = pick.text(2);
    job.model = pick.text(3);
    job.attempts = static_cast<int>(sqlite3_column_int64(pick.get(), 4)) + 1;
    Statement take(db_, "UPDATE jobs SET state = 'running', worker = ?1, lease_until = strftime('%s', 'now') + ?2,"
                        " attempts = attempts + 1 WHERE id = ?3");
    if (!take.ok()) return fail("claiming a job");
    take.bind(1, worker);
    take.bind(2, static_cast<int64_t>(lease_s));
    take.bind(3, job.id);
    if (sqlite3_step(take.get()) != SQLITE_DONE) return fail("claiming a job");
    KILN_RETURN_IF_ERROR(exec("COMMIT"));
    return std::optional<Job>(job);
  }

  Status heartbeat(int64_t job, const std::string& worker, int lease_s) override {
    Statement s(db_, "UPDATE jobs SET lease_until = strftime('%s', 'now') + ?1 WHERE id = ?2 AND worker = ?3"
                     " AND state = 'running'");
    if (!s.ok()) return error("renewing a lease");
    s.bind(1, static_cast<int64_t>(lease_s));
    s.bind(2, job);
    s.bind(3, worker);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return error("renewing a lease");
    if (sqlite3_changes(db_) != 1) return io_error() << path_ << ": job " << job << " is no longer " << worker << "'s";
    return Status::ok();
  }

  Status finish(int64_t job, const std::string& worker, bool ok) override {
    Statement s(db_, "UPDATE jobs SET state = ?1, lease_until = NULL WHERE id = ?2 AND worker = ?3 AND state = 'running'");
    if (!s.ok()) return error("finishing a job");
    s.bind(1, std::string(ok ? "done" : "failed"));
    s.bind(2, job);
    s.bind(3, worker);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return error("finishing a job");
    if (sqlite3_changes(db_) != 1) return io_error() << path_ << ": job " << job << " is no longer " << worker << "'s";
    return Status::ok();
  }

  Status update_features(const std::vector<tune::Record>& records) override {
    if (read_only_) return io_error() << path_ << ": the tuning database is read-only; nothing was changed";
    KILN_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
    Status st;
    {
      Statement s(db_, "UPDATE records SET features = ?1, feature_version = ?2 WHERE id = ?3");
      if (!s.ok()) st = error("preparing the update");
      for (size_t i = 0; st.is_ok() && i < records.size(); ++i) {
        const tune::Record& r = records[i];
        if (r.id <= 0) {
          st = invalid_argument() << "a record of " << r.workload << " was not read from " << path_;
          break;
        }
        sqlite3_reset(s.get());
        s.bind(1, numbers_text(r.features, 7));
        s.bind(2, static_cast<int64_t>(r.features.empty() ? 0 : r.feature_version));
        s.bind(3, r.id);
        if (sqlite3_step(s.get()) != SQLITE_DONE) st = error("updating a record's features");
        else if (sqlite3_changes(db_) != 1) st = invalid_argument() << path_ << " has no record " << r.id;
      }
    }
    if (!st.is_ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    }
    return exec("COMMIT");
  }

  Result<int64_t> prune(int keep) override {
    if (read_only_) return io_error() << path_ << ": the tuning database is read-only";
    if (keep < 1) return invalid_argument() << "prune must keep at least 1 record per schedule";
    KILN_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
    Statement s(db_,
                "DELETE FROM records WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY"
                 " workload, target, threads, candidate, knobs, evict_bytes = 0 ORDER BY time DESC, id DESC) AS n FROM records)"
                " WHERE n > ?1)");
    if (!s.ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return error("pruning");
    }
    s.bind(1, static_cast<int64_t>(keep));
    if (sqlite3_step(s.get()) != SQLITE_DONE) {
      Status st = error("pruning");
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    }
    int64_t removed = sqlite3_changes64(db_);
    KILN_RETURN_IF_ERROR(exec("COMMIT"));
    return removed;
  }

 private:
  Status insert_all(const std::vector<tune::Record>& records) {
    Statement s(db_,
                "INSERT INTO records (workload, anchor_op, target, candidate, knobs, schedule, latencies, median_s,"
                " threads, host, kiln_version, time, workload_text, features, feature_version, evict_bytes)"
                " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)");
    if (!s.ok()) return error("preparing the insert");
    for (const tune::Record& r : records) {
      if (r.latencies_s.empty()) return invalid_argument() << "record of " << r.workload << " has no latencies";
      sqlite3_reset(s.get());
      s.bind(1, r.workload);
      s.bind(2, r.anchor_op);
      s.bind(3, r.target);
      s.bind(4, r.candidate);
      s.bind(5, r.knobs);
      s.bind(6, r.schedule);
      s.bind(7, numbers_text(r.latencies_s, 9));
      s.bind(8, r.median_s());
      s.bind(9, static_cast<int64_t>(r.threads));
      s.bind(10, r.host);
      s.bind(11, r.kiln_version);
      s.bind(12, r.time);
      s.bind(13, r.workload_text);
      s.bind(14, numbers_text(r.features, 7));
      s.bind(15, static_cast<int64_t>(r.features.empty() ? 0 : r.feature_version));
      s.bind(16, r.evict_bytes);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return error("inserting a record");
    }
    return Status::ok();
  }

  static tune::Record row(Statement& s) {
    tune::Record r;
    r.workload = s.text(0);
    r.anchor_op = s.text(1);
    r.target = s.text(2);
    r.candidate = s.text(3);
    r.knobs = s.text(4);
    r.schedule = s.text(5);
    r.latencies_s = parse_numbers<double>(s.text(6));
    r.threads = static_cast<int>(sqlite3_column_int64(s.get(), 7));
    r.host = s.text(8);
    r.kiln_version = s.text(9);
    r.time = sqlite3_column_int64(s.get(), 10);
    r.workload_text = s.text(11);
    r.features = parse_numbers<float>(s.text(12));
    r.feature_version = static_cast<int>(sqlite3_column_int64(s.get(), 13));
    r.evict_bytes = sqlite3_column_int64(s.get(), 14);
    r.id = sqlite3_column_int64(s.get(), 15);
    return r;
  }

  sqlite3* db_;
  std::string path_;
  bool read_only_;
};

// Whether the file starts with SQLite's header; an empty file counts as new.
Result<bool> is_new_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error() << path << ": cannot be read";
  char head[16] = {};
  in.read(head, sizeof head);
  std::streamsize n = in.gcount();
  if (n == 0) return true;
  if (n < 16 || std::memcmp(head, "SQLite format 3", 16) != 0)
    return invalid_argument() << path << ": not a SQLite file, so not a Kiln tuning database (the file is left as it is)";
  return false;
}

}  // namespace

Result<std::unique_ptr<Database>> open_sqlite(const std::string& path, bool create) {
  namespace fs = std::filesystem;
  std::error_code ec;
  bool exists = fs::exists(path, ec);
  if (!exists && !create) return not_found() << path << ": no tuning database here";
  if (exists && fs::is_directory(path, ec)) return invalid_argument() << path << ": is a directory, not a tuning database";
  bool fresh = !exists;
  if (exists) {
    KILN_ASSIGN_OR_RETURN(fresh, is_new_file(path));
  } else if (fs::path parent = fs::path(path).parent_path(); !parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) return io_error() << path << ": cannot create its directory: " << ec.message();
  }
  bool read_only = exists && ::access(path.c_str(), W_OK) != 0;
  sqlite3* raw = nullptr;
  int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | (exists ? 0 : SQLITE_OPEN_CREATE);
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_FULLMUTEX, nullptr);
  auto db = std::make_unique<SqliteDatabase>(raw, path, read_only);
  if (rc != SQLITE_OK) return db->error("opening");
  sqlite3_busy_timeout(raw, kBusyTimeoutMs);
  sqlite3_extended_result_codes(raw, 0);
  // A damaged file (truncated, overwritten) is found here, before anything is written.
  if (!fresh) {
    Statement check(raw, "PRAGMA quick_check");
    if (!check.ok()) return db->error("checking");
    int step = sqlite3_step(check.get());
    if (step != SQLITE_ROW) return db->error("checking");
    std::string verdict = check.text(0);
    if (verdict != "ok")
      return invalid_argument() << path << ": the tuning database is damaged (" << verdict << "); the file is left as it is";
    // Whose is it? A Kiln database has kiln_meta with its schema version.
    Statement meta(raw, "SELECT value FROM kiln_meta WHERE key = 'schema_version'");
    if (!meta.ok()) {
      Statement tables(raw, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'");
      bool empty = tables.ok() && sqlite3_step(tables.get()) == SQLITE_ROW && sqlite3_column_int64(tables.get(), 0) == 0;
      if (!empty)
        return invalid_argument() << path << ": a SQLite database of another program (no kiln_meta table), not a Kiln "
                                  << "tuning database; the file is left as it is";
      fresh = true;
    } else {
      if (sqlite3_step(meta.get()) != SQLITE_ROW) return invalid_argument() << path << ": kiln_meta has no schema_version";
      std::string v = meta.text(0);
      char* end = nullptr;
      long version = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') return invalid_argument() << path << ": schema version '" << v << "' is not a number";
      if (version > kSchemaVersion)
        return unsupported() << path << ": tuning database schema version " << version
                                     << " is newer than this Kiln's (" << kSchemaVersion << "); use a newer Kiln";
      if (version < 1) return invalid_argument() << path << ": schema version " << version << " is not one Kiln wrote";
      if (version < kSchemaVersion) {
        if (read_only) return io_error() << path << ": schema version " << version << " needs migrating, but the file is read-only";
        KILN_RETURN_IF_ERROR(db->migrate(static_cast<int>(version)));
      }
    }
  }
  if (fresh) {
    if (read_only) return io_error() << path << ": read-only, cannot create a tuning database in it";
    KILN_RETURN_IF_ERROR(db->exec("PRAGMA journal_mode = WAL"));
    KILN_RETURN_IF_ERROR(db->exec("BEGIN IMMEDIATE"));
    for (const char* sql : kSchemaV1) {
      Status st = db->exec(sql);
      if (!st.is_ok()) {
        sqlite3_exec(raw, "ROLLBACK", nullptr, nullptr, nullptr);
        return st;
      }
    }
    KILN_RETURN_IF_ERROR(db->exec("COMMIT"));
    KILN_RETURN_IF_ERROR(db->migrate(1));
  } else if (!read_only) {
    KILN_RETURN_IF_ERROR(db->exec("PRAGMA journal_mode = WAL"));
  }
  return std::unique_ptr<Database>(std::move(db));
}

}  // namespace kiln::db
