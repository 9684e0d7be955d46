#include "db/database.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <tuple>
#include <istream>
#include <ostream>

namespace kiln::db {

Result<std::unique_ptr<Database>> open_sqlite(const std::string& path, bool create);
Result<std::unique_ptr<Database>> open_postgres(const std::string& url);

Result<std::unique_ptr<Database>> open_database(const std::string& where, bool create) {
  if (where.empty()) return invalid_argument() << "no tuning database named";
  if (where.rfind("postgresql://", 0) == 0 || where.rfind("postgres://", 0) == 0) return open_postgres(where);
  return open_sqlite(where, create);
}

std::string default_database_path() {
  if (const char* env = std::getenv("KILN_DB"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kiln/tuning.db";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln/tuning.db";
  return std::string();
}

std::optional<tune::Record> best_record(const std::vector<tune::Record>& records, const tune::TargetKey& host,
                                        int threads, tune::TargetMatch* match) {
  // Per slot [exact?][same threads?], every point's records (a point: the
  // candidate and knobs on one target at one thread count), pooled.
  std::map<std::tuple<std::string, std::string, std::string, int>, PooledPoint> points[2][2];
  for (const tune::Record& r : records) {
    auto key = tune::TargetKey::parse(r.target);
    if (!key.is_ok() || r.latencies_s.empty()) continue;
    tune::TargetMatch m = tune::match(*key, host);
    if (m == tune::TargetMatch::kIncompatible) continue;
    points[m == tune::TargetMatch::kExact ? 1 : 0][r.threads == threads ? 1 : 0]
          [{r.candidate, r.knobs, r.target, r.threads}]
              .add(r);
  }
  // Exact before compatible; the model's thread count before others.
  for (int exact : {1, 0})
    for (int same : {1, 0}) {
      const PooledPoint* best = nullptr;
      double best_s = 0;
      for (auto& [key, p] : points[exact][same]) {
        const double s = tune::median_of(p.latencies);
        if (best == nullptr || s < best_s) {
          best = &p;
          best_s = s;
        }
      }
      if (best == nullptr) continue;
      if (match) *match = exact ? tune::TargetMatch::kExact : tune::TargetMatch::kCompatible;
      return best->record();
    }
  return std::nullopt;
}

std::vector<tune::Record> timed_alike(std::vector<tune::Record> records) {
  const bool evicted = std::any_of(records.begin(), records.end(), [](const tune::Record& r) { return !r.timed_warm(); });
  records.erase(std::remove_if(records.begin(), records.end(),
                               [&](const tune::Record& r) { return r.timed_warm() == evicted; }),
                records.end());
  return records;
}

void PooledPoint::add(const tune::Record& r) {
  latencies.insert(latencies.end(), r.latencies_s.begin(), r.latencies_s.end());
  if (latest == nullptr || r.time > latest->time || (r.time == latest->time && r.id >= latest->id)) latest = &r;
}

tune::Record PooledPoint::record() const {
  tune::Record out = *latest;
  out.latencies_s = latencies;
  return out;
}

Status export_records(Database& db, std::ostream& out, int64_t* count) {
  int64_t n = 0;
  KILN_RETURN_IF_ERROR(db.for_each([&](const tune::Record& r) -> Status {
    out << r.to_json() << "\n";
    ++n;
    return out ? Status::ok() : io_error() << "writing the export failed";
  }));
  if (count) *count = n;
  return Status::ok();
}

Status import_records(Database& db, std::istream& in, int64_t* count) {
  std::vector<tune::Record> records;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = tune::Record::from_json(line);
    if (!r.is_ok()) return r.status().with_context("line " + std::to_string(number));
    records.push_back(std::move(*r));
  }
  KILN_RETURN_IF_ERROR(db.commit(records));
  if (count) *count = static_cast<int64_t>(records.size());
  return Status::ok();
}

}  // namespace kiln::db
