// The SQLite tuning database: records in and out, the best record per
// target, concurrent writers in separate processes, kill -9 during commits,
// and files that are not (or no longer) Kiln tuning databases.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "db/database.h"

namespace kiln::db {
namespace {

namespace fs = std::filesystem;

// Directories the tests made, removed when the binary exits (children leave with _exit).
struct TempDirs {
  ~TempDirs() {
    std::error_code ec;
    for (const std::string& d : dirs) fs::remove_all(d, ec);
  }
  std::vector<std::string> dirs;
} g_temp_dirs;

std::string temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "kiln_db_test_XXXXXX").string();
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  g_temp_dirs.dirs.push_back(tmpl);
  return tmpl;
}

const char kTarget[] = "isa=avx,avx2,fma vec=32x16 fma=32 l1d=32768 l2=1048576 l3=33554432 cores=2";

tune::Record record(int workload, double seconds, const std::string& knobs = "mr=4 nr=32",
                    const std::string& target = kTarget, int threads = 1) {
  tune::Record r;
  r.workload = tune::Workload::make("MatMul", "kernel " + std::to_string(workload)).key;
  r.anchor_op = "MatMul";
  r.target = target;
  r.candidate = "matmul.packed";
  r.knobs = knobs;
  r.schedule = "split(a0, 4)\n";
  r.latencies_s = {seconds * 1.01, seconds, seconds * 0.99 + 1e-9};
  r.threads = threads;
  r.host = "test host";
  r.kiln_version = "0.1.0";
  r.time = 1700000000;
  r.workload_text = "kernel " + std::to_string(workload);
  return r;
}

// Runs SQL on the file directly (to stage an older schema).
::testing::AssertionResult raw_exec(const std::string& path, const char* sql) {
  sqlite3* raw = nullptr;
  if (sqlite3_open(path.c_str(), &raw) != SQLITE_OK) return ::testing::AssertionFailure() << "cannot open " << path;
  char* err = nullptr;
  int rc = sqlite3_exec(raw, sql, nullptr, nullptr, &err);
  std::string message = err ? err : "";
  sqlite3_free(err);
  sqlite3_close(raw);
  if (rc != SQLITE_OK) return ::testing::AssertionFailure() << message;
  return ::testing::AssertionSuccess();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

TEST(TuningDatabase, CommitsAndReadsBack) {
  std::string path = temp_dir() + "/sub/dir/tuning.db";
  EXPECT_FALSE(open_database(path, false).is_ok());  // not created unless asked
  auto db = open_database(path, true);
  ASSERT_TRUE(db.is_ok()) << db.status().to_string();
  ASSERT_TRUE((*db)->commit({record(1, 3e-3), record(1, 1e-3, "mr=8 nr=32"), record(2, 5e-3)}).is_ok());
  auto recs = (*db)->records_for(record(1, 1).workload);
  ASSERT_TRUE(recs.is_ok());
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ((*recs)[0].knobs, "mr=8 nr=32");  // fastest first
  EXPECT_EQ((*recs)[0].latencies_s.size(), 3u);
  EXPECT_EQ((*recs)[0].schedule, "split(a0, 4)\n");
  auto st = (*db)->stats();
  ASSERT_TRUE(st.is_ok());
  EXPECT_EQ(st->records, 3);
  EXPECT_EQ(st->workloads, 2);
  EXPECT_EQ(st->jobs.at("queued"), 0);
  // Reopened: still there.
  db->reset();
  auto again = open_database(path, false);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ((*again)->stats()->records, 3);
}

TEST(TuningDatabase, ExportImportRoundTripAndBadLines) {
  std::string dir = temp_dir();
  auto a = open_database(dir + "/a.db", true);
  ASSERT_TRUE(a.is_ok());
  tune::Record odd = record(3, 2e-3);
  odd.schedule = "line \"one\"\n\tline\\two\n";
  ASSERT_TRUE((*a)->commit({record(1, 1e-3), odd}).is_ok());
  std::stringstream text;
  int64_t n = 0;
  ASSERT_TRUE(export_records(**a, text, &n).is_ok());
  EXPECT_EQ(n, 2);
  auto b = open_database(dir + "/b.db", true);
  ASSERT_TRUE(b.is_ok());
  std::stringstream in(text.str());
  ASSERT_TRUE(import_records(**b, in, &n).is_ok());
  EXPECT_EQ(n, 2);
  auto back = (*b)->records_for(odd.workload);
  ASSERT_TRUE(back.is_ok());
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].schedule, odd.schedule);
  EXPECT_EQ((*back)[0].to_json(), odd.to_json());
  // A bad line is named and nothing of the file is committed.
  // A time or a feature no number type holds is refused (it would not convert).
  std::string huge_time = record(7, 1e-3).to_json();
  huge_time.replace(huge_time.find("\"time\": 1700000000"), 18, "\"time\": 1e300");
  std::string huge_feature = record(7, 1e-3).to_json();
  huge_feature.replace(huge_feature.find("\"features\": []"), 14, "\"features\": [1e300]");
  for (const std::string& bad : {std::string("{\"workload\": \"abc\"}"), std::string("{\"workload\": "),
                                 std::string("not json"), std::string("{}"), huge_time, huge_feature}) {
    std::stringstream mixed(record(9, 1e-3).to_json() + "\n" + bad + "\n");
    Status st = import_records(**b, mixed, &n);
    EXPECT_FALSE(st.is_ok()) << bad;
    EXPECT_NE(st.to_string().find("line 2"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ((*b)->records_for(record(9, 1).workload)->size(), 0u);
}

TEST(TuningDatabase, BestRecordMatchesTargets) {
  auto host = tune::TargetKey::parse(kTarget);
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  // Same ISA and registers on a host with another L2: compatible.
  std::string other_l2 = "isa=avx,avx2,fma vec=32x16 fma=32 l1d=32768 l2=2097152 l3=33554432 cores=2";
  // Features this host lacks: never used.
  std::string wider = "isa=avx,avx2,avx512f,fma vec=32x16 fma=32 l1d=32768 l2=1048576 l3=33554432 cores=2";
  std::vector<tune::Record> recs = {record(1, 1e-3, "a", other_l2), record(1, 0.5e-3, "b", wider),
                                    record(1, 2e-3, "c", kTarget)};
  tune::TargetMatch m;
  auto best = best_record(recs, *host, 1, &m);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->knobs, "c");  // an exact record wins over a faster compatible one
  EXPECT_EQ(m, tune::TargetMatch::kExact);
  recs.pop_back();
  best = best_record(recs, *host, 1, &m);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->knobs, "a");
  EXPECT_EQ(m, tune::TargetMatch::kCompatible);
  recs.erase(recs.begin());
  EXPECT_FALSE(best_record(recs, *host, 1).has_value());  // no nearest-record fallback
  // The model's thread count first.
  recs = {record(1, 1e-3, "t2", kTarget, 2), record(1, 2e-3, "t1", kTarget, 1)};
  EXPECT_EQ(best_record(recs, *host, 1)->knobs, "t1");
  EXPECT_EQ(best_record(recs, *host, 4)->knobs, "t2");
}

TEST(TuningDatabase, TargetKeysParseAndRefuseGarbage) {
  auto k = tune::TargetKey::parse(kTarget);
  ASSERT_TRUE(k.is_ok());
  EXPECT_EQ(k->text(), kTarget);
  EXPECT_EQ(tune::TargetKey::parse(tune::TargetKey::host().text())->text(), tune::TargetKey::host().text());
  for (const char* bad : {"", "isa=avx", "isa=avx vec=32 fma=32 l1d=1 l2=1 l3=1 cores=1", "bogus=1",
                          "isa=a vec=32x16 fma=-3 l1d=1 l2=1 l3=1 cores=1", "isa=a isa=b"})
    EXPECT_FALSE(tune::TargetKey::parse(bad).is_ok()) << bad;
}

TEST(TuningDatabase, ConcurrentProcessesLoseNothing) {
  std::string path = temp_dir() + "/shared.db";
  ASSERT_TRUE(open_database(path, true).is_ok());
  constexpr int kProcs = 4, kEach = 40;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto db = open_database(path, false);
      if (!db.is_ok()) _exit(3);
      for (int i = 0; i < kEach; ++i)
        if (!(*db)->commit({record(p * 1000 + i, 1e-3)}).is_ok()) _exit(4);
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer exited with " << status;
  }
  auto db = open_database(path, false);
  ASSERT_TRUE(db.is_ok());
  EXPECT_EQ((*db)->stats()->records, kProcs * kEach);
}

TEST(TuningDatabase, KillDuringCommitsKeepsEveryCommittedRecord) {
  std::string path = temp_dir() + "/killed.db";
  ASSERT_TRUE(open_database(path, true).is_ok());
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    auto db = open_database(path, false);
    if (!db.is_ok()) _exit(3);
    for (int i = 0;; ++i) {
      std::vector<tune::Record> batch;
      for (int j = 0; j < 5; ++j) batch.push_back(record(i * 5 + j, 1e-3));
      if (!(*db)->commit(batch).is_ok()) _exit(4);
      int32_t done = (i + 1) * 5;
      if (write(fds[1], &done, sizeof done) != sizeof done) _exit(5);
    }
  }
  close(fds[1]);
  int32_t committed = 0, v = 0;
  while (committed < 200 && read(fds[0], &v, sizeof v) == sizeof v) committed = v;
  kill(pid, SIGKILL);  // mid-commit, most likely
  int status = 0;
  waitpid(pid, &status, 0);
  while (read(fds[0], &v, sizeof v) == sizeof v) committed = v;  // reported before it died
  close(fds[0]);
  auto db = open_database(path, false);
  ASSERT_TRUE(db.is_ok()) << db.status().to_string();
  auto st = (*db)->stats();
  ASSERT_TRUE(st.is_ok());
  EXPECT_GE(st->records, committed);
  EXPECT_EQ(st->records % 5, 0) << "a batch was half committed";
}

TEST(TuningDatabase, ForeignCorruptAndTruncatedFilesAreRefusedUntouched) {
  std::string dir = temp_dir();
  // Not SQLite at all.
  std::string junk = dir + "/junk.db";
  std::ofstream(junk) << "these are someone's notes, not a database\n";
  std::string before = file_bytes(junk);
  auto r = open_database(junk, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("not a SQLite file"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(file_bytes(junk), before);
  // Another program's SQLite database.
  std::string foreign = dir + "/foreign.db";
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "CREATE TABLE accounts (id INTEGER, name TEXT); INSERT INTO accounts VALUES (1, 'x')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  before = file_bytes(foreign);
  r = open_database(foreign, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("another program"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(file_bytes(foreign), before);
  // A Kiln database cut in half.
  std::string cut = dir + "/cut.db";
  {
    auto db = open_database(cut, true);
    ASSERT_TRUE(db.is_ok());
    std::vector<tune::Record> many;
    for (int i = 0; i < 400; ++i) many.push_back(record(i, 1e-3));
    ASSERT_TRUE((*db)->commit(many).is_ok());
    (*db).reset();
  }
  // Fold the WAL into the main file first, so the cut is of the database itself.
  ASSERT_EQ(sqlite3_open(cut.c_str(), &raw), SQLITE_OK);
  sqlite3_exec(raw, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode = DELETE", nullptr, nullptr, nullptr);
  sqlite3_close(raw);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  before = file_bytes(cut);
  r = open_database(cut, false);
  ASSERT_FALSE(r.is_ok()) << "a truncated database opened";
  EXPECT_NE(r.status().to_string().find(cut), std::string::npos) << r.status().to_string();
  EXPECT_EQ(file_bytes(cut), before);
}

TEST(TuningDatabase, NewerSchemaIsRefusedWithItsVersion) {
  std::string path = temp_dir() + "/newer.db";
  ASSERT_TRUE(open_database(path, true).is_ok());
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "UPDATE kiln_meta SET value = '7' WHERE key = 'schema_version'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  auto r = open_database(path, false);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("schema version 7"), std::string::npos) << r.status().to_string();
}

TEST(TuningDatabase, SchemaOneIsMigratedKeepingItsRecords) {
  std::string path = temp_dir() + "/v1.db";
  {
    auto db = open_database(path, true);
    ASSERT_TRUE(db.is_ok());
    ASSERT_TRUE((*db)->commit({record(1, 1e-3)}).is_ok());
  }
  // Back to what schema 1 was: no features column, no cost models.
  sqlite3* raw = nullptr;
  ASSERT_TRUE(raw_exec(path, "ALTER TABLE records DROP COLUMN evict_bytes; ALTER TABLE records DROP COLUMN feature_version;"
                             " ALTER TABLE records DROP COLUMN features;"
                             " DROP TABLE cost_models; UPDATE kiln_meta SET value = '1' WHERE key = 'schema_version'"));
  auto db = open_database(path, false);
  ASSERT_TRUE(db.is_ok()) << db.status().to_string();
  auto recs = (*db)->records_for(record(1, 1).workload);
  ASSERT_TRUE(recs.is_ok()) << recs.status().to_string();
  ASSERT_EQ(recs->size(), 1u);
  EXPECT_TRUE((*recs)[0].features.empty());
  tune::Record with = record(2, 1e-3);
  with.features = {1.5f, -2.f, 0.f};
  ASSERT_TRUE((*db)->commit({with}).is_ok());
  auto back = (*db)->records_for(with.workload);
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].features, with.features);
  // Cost models are stored and read back whole (bytes, zeros included).
  const std::string blob("G{\"x\":\0\1}", 9);
  ASSERT_TRUE((*db)->save_model("cost_model", blob, 42).is_ok());
  int64_t trained_on = 0;
  auto loaded = (*db)->load_model("cost_model", &trained_on);
  ASSERT_TRUE(loaded.is_ok());
  EXPECT_EQ(*loaded, blob);
  EXPECT_EQ(trained_on, 42);
  EXPECT_TRUE((*db)->load_model("other")->empty());
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT value FROM kiln_meta WHERE key = 'schema_version'", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 0))), std::to_string(kSchemaVersion));
  sqlite3_finalize(st);
  sqlite3_close(raw);
}

// Per point and thread count the latest records stay: a point measured fast
// once and again, slower, by the tuner's confirmation keeps the later
// measurement, not the lucky one.
TEST(TuningDatabase, PruneKeepsTheLatest) {
  auto db = open_database(temp_dir() + "/prune.db", true);
  ASSERT_TRUE(db.is_ok());
  tune::Record lucky = record(1, 1e-3), again = record(1, 3e-3), older = record(1, 2e-3);
  older.time -= 20;
  lucky.time -= 10;
  ASSERT_TRUE((*db)->commit({older, lucky, again, record(1, 5e-3, "other"), record(1, 4e-3, "mr=4 nr=32", kTarget, 2)})
                  .is_ok());
  auto removed = (*db)->prune(1);
  ASSERT_TRUE(removed.is_ok()) << removed.status().to_string();
  EXPECT_EQ(*removed, 2);
  auto recs = (*db)->records_for(record(1, 1).workload);
  ASSERT_EQ(recs->size(), 3u);
  for (const tune::Record& r : *recs)
    if (r.knobs == "mr=4 nr=32" && r.threads == 1) EXPECT_DOUBLE_EQ(r.median_s(), 3e-3);
}

// Records say how their runs were timed (schema 4): the bytes evicted before
// each, 0 for none, -1 where a record from before schema 4 does not say;
// export and import keep it; warm and evicted points are not compared.
TEST(TuningDatabase, TimingIsRecordedMigratedAndKeptApart) {
  std::string path = temp_dir() + "/v3.db";
  tune::Record evicted = record(1, 2e-3), warm = record(1, 1e-3, "mr=8 nr=32");
  evicted.evict_bytes = int64_t{419} << 20;
  warm.evict_bytes = 0;
  {
    auto db = open_database(path, true);
    ASSERT_TRUE(db.is_ok());
    ASSERT_TRUE((*db)->commit({evicted, warm}).is_ok());
    auto back = (*db)->records_for(evicted.workload);
    ASSERT_EQ(back->size(), 2u);
    EXPECT_EQ((*back)[0].evict_bytes, 0);  // by median: the warm one first
    EXPECT_EQ((*back)[1].evict_bytes, evicted.evict_bytes);
    // Export and import keep it; a line without it (an older file) did not say.
    std::ostringstream out;
    ASSERT_TRUE(export_records(**db, out).is_ok());
    EXPECT_NE(out.str().find("\"evict_bytes\": 439353344"), std::string::npos) << out.str();
    std::string older = evicted.to_json();
    older.erase(older.find(", \"evict_bytes\""), std::string(", \"evict_bytes\": 439353344").size());
    auto parsed = tune::Record::from_json(older);
    ASSERT_TRUE(parsed.is_ok()) << older;
    EXPECT_EQ(parsed->evict_bytes, -1);
    for (const char* bad : {"-2", "1.5", "1e300"}) {
      std::string line = evicted.to_json();
      line.replace(line.find("439353344"), 9, bad);
      EXPECT_FALSE(tune::Record::from_json(line).is_ok()) << bad;
    }
  }
  // Warm points are compared among themselves only: with an evicted record
  // of the workload, the warm one is left out however fast.
  auto db = open_database(path, false);
  ASSERT_TRUE(db.is_ok());
  auto both = (*db)->records_for(evicted.workload);
  std::vector<tune::Record> alike = timed_alike(*both);
  ASSERT_EQ(alike.size(), 1u);
  EXPECT_EQ(alike[0].knobs, evicted.knobs);
  alike = timed_alike({warm, record(2, 1e-3)});  // -1 (did not say) counts as evicted
  ASSERT_EQ(alike.size(), 1u);
  EXPECT_EQ(alike[0].evict_bytes, -1);
  alike = timed_alike({warm, warm});  // warm only: those
  EXPECT_EQ(alike.size(), 2u);
  db->reset();
  // Back to schema 3: no evict_bytes column; its records then do not say.
  ASSERT_TRUE(raw_exec(path, "ALTER TABLE records DROP COLUMN evict_bytes;"
                             " UPDATE kiln_meta SET value = '3' WHERE key = 'schema_version'"));
  db = open_database(path, false);
  ASSERT_TRUE(db.is_ok()) << db.status().to_string();
  auto migrated = (*db)->records_for(evicted.workload);
  ASSERT_TRUE(migrated.is_ok());
  ASSERT_EQ(migrated->size(), 2u);
  for (const tune::Record& r : *migrated) EXPECT_EQ(r.evict_bytes, -1);
  EXPECT_EQ(timed_alike(*migrated).size(), 2u);
}

// Features carry the version of their definition (schema 3); a database of
// schema 2 keeps its features, marked version 1's; update_features replaces
// the features of records read back, by row, all or nothing.
TEST(TuningDatabase, FeatureVersionsMigrateAndUpdate) {
  std::string path = temp_dir() + "/v2.db";
  tune::Record with = record(1, 1e-3);
  with.features = {0.25f, 2.f};
  with.feature_version = 7;
  {
    auto db = open_database(path, true);
    ASSERT_TRUE(db.is_ok());
    ASSERT_TRUE((*db)->commit({with, record(2, 1e-3)}).is_ok());
    auto back = (*db)->records_for(with.workload);
    ASSERT_EQ(back->size(), 1u);
    EXPECT_EQ((*back)[0].feature_version, 7);
    EXPECT_GT((*back)[0].id, 0);
  }
  // Back to schema 2: no feature_version column.
  ASSERT_TRUE(raw_exec(path, "ALTER TABLE records DROP COLUMN evict_bytes; ALTER TABLE records DROP COLUMN feature_version;"
                             " UPDATE kiln_meta SET value = '2' WHERE key = 'schema_version'"));
  auto db = open_database(path, false);
  ASSERT_TRUE(db.is_ok()) << db.status().to_string();
  auto one = (*db)->records_for(with.workload);
  auto two = (*db)->records_for(record(2, 1).workload);
  ASSERT_TRUE(one.is_ok() && two.is_ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].features, with.features);
  EXPECT_EQ((*one)[0].feature_version, 1);
  EXPECT_EQ((*two)[0].feature_version, 0);  // no features, no version

  tune::Record updated = (*one)[0];
  updated.features = {9.f, 8.f, 7.f};
  updated.feature_version = 3;
  ASSERT_TRUE((*db)->update_features({updated}).is_ok());
  auto after = (*db)->records_for(with.workload);
  EXPECT_EQ((*after)[0].features, updated.features);
  EXPECT_EQ((*after)[0].feature_version, 3);
  EXPECT_EQ((*after)[0].latencies_s, with.latencies_s);  // nothing else changes
  // A record not read from this database, or a row that is not there: an error, and nothing changes.
  tune::Record fresh = record(1, 1e-3);
  fresh.features = {1.f};
  tune::Record gone = updated;
  gone.id = 999999;
  for (const tune::Record& bad : {fresh, gone}) {
    tune::Record first = updated;
    first.features = {5.f};
    EXPECT_FALSE((*db)->update_features({first, bad}).is_ok());
    EXPECT_EQ((*(*db)->records_for(with.workload))[0].features, updated.features);
  }
  // Export and import keep the version; a line without one holds version 1's features.
  std::stringstream out;
  ASSERT_TRUE(export_records(**db, out).is_ok());
  EXPECT_NE(out.str().find("\"feature_version\": 3"), std::string::npos) << out.str();
  std::string line = (*after)[0].to_json();
  auto back = tune::Record::from_json(line);
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->feature_version, 3);
  line.replace(line.find(", \"feature_version\": 3"), 22, "");
  back = tune::Record::from_json(line);
  ASSERT_TRUE(back.is_ok()) << line;
  EXPECT_EQ(back->feature_version, 1);
  std::string negative = (*after)[0].to_json();
  negative.replace(negative.find("\"feature_version\": 3"), 20, "\"feature_version\": -1");
  EXPECT_FALSE(tune::Record::from_json(negative).is_ok()) << negative;
}

}  // namespace
}  // namespace kiln::db
