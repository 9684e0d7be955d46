// How both databases store a record's latencies and features: numbers
// separated by spaces in one text column (db/sqlite.cc, db/postgres.cc).
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace kiln::db {

// Enough digits to read the same value back: 9 for latencies (nanosecond
// resolution is noise already), 7 for float features.
template <typename T>
std::string numbers_text(const std::vector<T>& v, int precision) {
  std::ostringstream os;
  os.precision(precision);
  for (size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
  return os.str();
}

template <typename T>
std::vector<T> parse_numbers(const std::string& s) {
  std::vector<T> out;
  std::istringstream is(s);
  T x{};
  while (is >> x) out.push_back(x);
  return out;
}

}  // namespace kiln::db
