#include "tune/tune.h"

#include "support/json.h"

#include <algorithm>
#include <cmath>
#include <cpuid.h>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "support/sha256.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::tune {

Workload Workload::make(std::string anchor_op, std::string canonical_text) {
  Workload w;
  w.anchor_op = std::move(anchor_op);
  w.text = std::move(canonical_text);
  w.key = sha256_hex("kiln workload v" + std::to_string(kCanonicalVersion) + "\nanchor " + w.anchor_op + "\n" + w.text);
  return w;
}

// ---- target keys -------------------------------------------------------

namespace {

// The x86 features code generation may use (LLVM's names), from CPUID.
std::vector<std::string> host_isa() {
  std::vector<std::string> out;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  auto bit = [](unsigned reg, int i) { return ((reg >> i) & 1u) != 0; };
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    if (bit(c, 20)) out.push_back("sse4.2");
    if (bit(c, 12)) out.push_back("fma");
    if (bit(c, 28)) out.push_back("avx");
    if (bit(c, 29)) out.push_back("f16c");
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    const std::pair<int, const char*> ebx[] = {{5, "avx2"},      {16, "avx512f"},  {17, "avx512dq"},
                                               {21, "avx512ifma"}, {28, "avx512cd"}, {30, "avx512bw"},
                                               {31, "avx512vl"}};
    for (auto [i, name] : ebx)
      if (bit(b, i)) out.push_back(name);
    const std::pair<int, const char*> ecx[] = {{1, "avx512vbmi"}, {11, "avx512vnni"}, {12, "avx512bitalg"},
                                               {14, "avx512vpopcntdq"}};
    for (auto [i, name] : ecx)
      if (bit(c, i)) out.push_back(name);
    const std::pair<int, const char*> edx[] = {{22, "amx-bf16"}, {23, "avx512fp16"}, {24, "amx-tile"}, {25, "amx-int8"}};
    for (auto [i, name] : edx)
      if (bit(d, i)) out.push_back(name);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    if (bit(a, 4)) out.push_back("avxvnni");
    if (bit(a, 5)) out.push_back("avx512bf16");
  }
#endif
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string TargetKey::text() const {
  std::ostringstream os;
  os << "isa=";
  for (size_t i = 0; i < isa.size(); ++i) os << (i ? "," : "") << isa[i];
  os << " vec=" << vector_bytes << "x" << vector_registers << " fma=" << fma_bytes << " l1d=" << l1d_bytes
     << " l2=" << l2_bytes << " l3=" << l3_bytes << " cores=" << cores;
  return os.str();
}

Result<TargetKey> TargetKey::parse(const std::string& text) {
  TargetKey k;
  std::istringstream is(text);
  std::string field;
  std::set<std::string> seen;
  auto number = [&](const std::string& v, int64_t& out) -> Status {
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < 0) return invalid_argument() << "target key: bad number '" << v << "'";
    out = x;
    return Status::ok();
  };
  while (is >> field) {
    size_t eq = field.find('=');
    if (eq == std::string::npos) return invalid_argument() << "target key: field '" << field << "' has no '='";
    std::string name = field.substr(0, eq), v = field.substr(eq + 1);
    if (!seen.insert(name).second) return invalid_argument() << "target key: field '" << name << "' twice";
    int64_t x = 0;
    if (name == "isa") {
      std::istringstream fs(v);
      std::string f;
      while (std::getline(fs, f, ','))
        if (!f.empty()) k.isa.push_back(f);
      std::sort(k.isa.begin(), k.isa.end());
    } else if (name == "vec") {
      size_t x_at = v.find('x');
      int64_t bytes = 0, regs = 0;
      if (x_at == std::string::npos) return invalid_argument() << "target key: vec '" << v << "' is not BYTESxCOUNT";
      KILN_RETURN_IF_ERROR(number(v.substr(0, x_at), bytes));
      KILN_RETURN_IF_ERROR(number(v.substr(x_at + 1), regs));
      k.vector_bytes = static_cast<int>(std::min<int64_t>(bytes, 1 << 20));
      k.vector_registers = static_cast<int>(std::min<int64_t>(regs, 1 << 20));
    } else if (name == "fma" || name == "cores") {
      KILN_RETURN_IF_ERROR(number(v, x));
      (name == "fma" ? k.fma_bytes : k.cores) = static_cast<int>(std::min<int64_t>(x, 1 << 20));
    } else if (name == "l1d" || name == "l2" || name == "l3") {
      KILN_RETURN_IF_ERROR(number(v, x));
      (name == "l1d" ? k.l1d_bytes : name == "l2" ? k.l2_bytes : k.l3_bytes) = x;
    } else {
      return invalid_argument() << "target key: unknown field '" << name << "'";
    }
  }
  for (const char* need : {"isa", "vec", "fma", "l1d", "l2", "l3", "cores"})
    if (!seen.count(need)) return invalid_argument() << "target key '" << text << "' lacks " << need;
  return k;
}

TargetKey TargetKey::host(const Target& target) {
  TargetKey k;
  k.isa = host_isa();
  k.vector_bytes = target.vector_bytes;
  k.vector_registers = target.vector_registers;
  k.fma_bytes = target.fma_bytes;
  k.l1d_bytes = host_cache_bytes(1);
  k.l3_bytes = host_cache_bytes(3);
  k.l2_bytes = target.l2_bytes;
  unsigned hw = std::thread::hardware_concurrency();
  k.cores = hw == 0 ? 1 : static_cast<int>(hw);
  return k;
}

TargetMatch match(const TargetKey& record, const TargetKey& host) {
  if (record.text() == host.text()) return TargetMatch::kExact;
  if (record.vector_bytes != host.vector_bytes || record.vector_registers != host.vector_registers)
    return TargetMatch::kIncompatible;
  for (const std::string& f : record.isa)
    if (!std::binary_search(host.isa.begin(), host.isa.end(), f)) return TargetMatch::kIncompatible;
  return TargetMatch::kCompatible;
}

const char* match_name(TargetMatch m) {
  switch (m) {
    case TargetMatch::kExact: return "exact";
    case TargetMatch::kCompatible: return "compatible";
    default: return "incompatible";
  }
}

// ---- records -------------------------------------------------------------

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Record::median_s() const { return median_of(latencies_s); }

namespace {

void put_string(std::ostringstream& os, const std::string& s) { os << json_quote(s); }

// A flat JSON object of strings, numbers and arrays of numbers: what
// Record::to_json writes. Anything else is an error naming the position.
class FlatJson {
 public:
  explicit FlatJson(const std::string& s) : s_(s) {}
  Status parse(std::map<std::string, std::string>& strings, std::map<std::string, double>& numbers,
               std::map<std::string, std::vector<double>>& arrays) {
    skip();
    KILN_RETURN_IF_ERROR(expect('{'));
    skip();
    if (peek() == '}') return end();
    while (true) {
      std::string key;
      KILN_RETURN_IF_ERROR(string(key));
      skip();
      KILN_RETURN_IF_ERROR(expect(':'));
      skip();
      if (peek() == '"') {
        std::string v;
        KILN_RETURN_IF_ERROR(string(v));
        strings[key] = v;
      } else if (peek() == '[') {
        ++i_;
        std::vector<double> v;
        skip();
        if (peek() != ']') {
          while (true) {
            double x = 0;
            KILN_RETURN_IF_ERROR(number(x));
            v.push_back(x);
            skip();
            if (peek() == ',') {
              ++i_;
              skip();
              continue;
            }
            break;
          }
        }
        KILN_RETURN_IF_ERROR(expect(']'));
        arrays[key] = v;
      } else {
        double x = 0;
        KILN_RETURN_IF_ERROR(number(x));
        numbers[key] = x;
      }
      skip();
      if (peek() == ',') {
        ++i_;
        skip();
        continue;
      }
      KILN_RETURN_IF_ERROR(expect('}'));
      return end();
    }
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  Status fail(const char* what) const { return invalid_argument() << what << " at character " << i_; }
  Status expect(char c) {
    if (peek() != c) return invalid_argument() << "expected '" << c << "' at character " << i_;
    ++i_;
    return Status::ok();
  }
  Status end() {
    skip();
    return i_ == s_.size() ? Status::ok() : fail("text after the object");
  }
  Status string(std::string& out) {
    KILN_RETURN_IF_ERROR(expect('"'));
    while (true) {
      if (i_ >= s_.size()) return fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return Status::ok();
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) return fail("short \\u escape");
          unsigned v = 0;
          for (int k = 0; k < 4; ++k) {
            char h = s_[i_++];
            v <<= 4;
            if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
            else return fail("bad \\u escape");
          }
          if (v >= 0x80) return fail("non-ASCII \\u escape");
          out += static_cast<char>(v);
          break;
        }
        default: return fail("bad escape");
      }
    }
  }
  Status number(double& out) {
    size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                              s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      ++i_;
    if (start == i_) return fail("expected a value");
    std::string t = s_.substr(start, i_ - start);
    char* endp = nullptr;
    out = std::strtod(t.c_str(), &endp);
    if (*endp != '\0' || !std::isfinite(out)) return fail("bad number");
    return Status::ok();
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

std::string Record::to_json() const {
  std::ostringstream os;
  os.precision(9);
  auto field = [&](const char* name, const std::string& v, bool first = false) {
    os << (first ? "" : ", ") << '"' << name << "\": ";
    put_string(os, v);
  };
  os << "{";
  field("workload", workload, true);
  field("anchor_op", anchor_op);
  field("target", target);
  field("candidate", candidate);
  field("knobs", knobs);
  field("schedule", schedule);
  os << ", \"latencies_s\": [";
  for (size_t i = 0; i < latencies_s.size(); ++i) os << (i ? ", " : "") << latencies_s[i];
  os << "], \"threads\": " << threads;
  field("host", host);
  field("kiln_version", kiln_version);
  os << ", \"time\": " << time;
  field("workload_text", workload_text);
  os << ", \"features\": [";
  for (size_t i = 0; i < features.size(); ++i) os << (i ? ", " : "") << features[i];
  os << "], \"feature_version\": " << feature_version << ", \"evict_bytes\": " << evict_bytes << "}";
  return os.str();
}

Result<Record> Record::from_json(const std::string& line) {
  std::map<std::string, std::string> s;
  std::map<std::string, double> n;
  std::map<std::string, std::vector<double>> a;
  KILN_RETURN_IF_ERROR(FlatJson(line).parse(s, n, a));
  Record r;
  auto str = [&](const char* k, std::string& out, bool required) -> Status {
    auto it = s.find(k);
    if (it == s.end()) return required ? invalid_argument() << "record lacks \"" << k << "\"" : Status::ok();
    out = it->second;
    return Status::ok();
  };
  KILN_RETURN_IF_ERROR(str("workload", r.workload, true));
  KILN_RETURN_IF_ERROR(str("target", r.target, true));
  KILN_RETURN_IF_ERROR(str("anchor_op", r.anchor_op, false));
  KILN_RETURN_IF_ERROR(str("candidate", r.candidate, false));
  KILN_RETURN_IF_ERROR(str("knobs", r.knobs, false));
  KILN_RETURN_IF_ERROR(str("schedule", r.schedule, false));
  KILN_RETURN_IF_ERROR(str("host", r.host, false));
  KILN_RETURN_IF_ERROR(str("kiln_version", r.kiln_version, false));
  KILN_RETURN_IF_ERROR(str("workload_text", r.workload_text, false));
  if (r.workload.size() != 64 || r.workload.find_first_not_of("0123456789abcdef") != std::string::npos)
    return invalid_argument() << "record's workload '" << r.workload << "' is not 64 hex digits";
  KILN_RETURN_IF_ERROR(TargetKey::parse(r.target).status());
  auto lat = a.find("latencies_s");
  if (lat == a.end() || lat->second.empty()) return invalid_argument() << "record lacks \"latencies_s\"";
  for (double x : lat->second)
    if (!(x > 0)) return invalid_argument() << "record has a latency of " << x << " s";
  r.latencies_s = lat->second;
  if (auto t = n.find("threads"); t != n.end()) {
    if (t->second < 1 || t->second > 1 << 16) return invalid_argument() << "record has " << t->second << " threads";
    r.threads = static_cast<int>(t->second);
  }
  if (auto t = n.find("time"); t != n.end()) {
    // Seconds since the epoch; anything outside +-2^53 is not a time (and would not convert).
    if (!(std::fabs(t->second) <= 9007199254740992.0)) return invalid_argument() << "record has a time of " << t->second;
    r.time = static_cast<int64_t>(t->second);
  }
  if (auto f = a.find("features"); f != a.end())
    for (double x : f->second) {
      if (!(std::fabs(x) <= std::numeric_limits<float>::max()))
        return invalid_argument() << "record has a feature of " << x << ", outside float's range";
      r.features.push_back(static_cast<float>(x));
    }
  // Files written before features were versioned hold version 1's.
  r.feature_version = r.features.empty() ? 0 : 1;
  if (auto v = n.find("feature_version"); v != n.end()) {
    if (!(v->second >= 0 && v->second <= 1 << 20) || v->second != std::floor(v->second))
      return invalid_argument() << "record has feature_version " << v->second;
    r.feature_version = static_cast<int>(v->second);
  }
  if (auto e = n.find("evict_bytes"); e != n.end()) {
    if (!(e->second >= -1 && e->second <= 9007199254740992.0) || e->second != std::floor(e->second))
      return invalid_argument() << "record has evict_bytes " << e->second;
    r.evict_bytes = static_cast<int64_t>(e->second);
  }
  return r;
}

const char* kiln_version() { return KILN_VERSION; }

std::string host_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string name = line.substr(colon + 1);
    name.erase(0, name.find_first_not_of(" \t"));
    return name;
  }
  return "unknown";
}

}  // namespace kiln::tune
