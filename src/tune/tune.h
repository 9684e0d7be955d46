// The tuner's vocabulary, shared by kernel choice, measurement and the tuning
// database (src/db): what a kernel computes (Workload), the machine a
// measurement holds for (TargetKey), and one measured schedule (Record).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/status.h"
#include "support/target.h"

namespace kiln::tune {

// The version of tir::canonicalize's text that workload keys hash. Raise it
// when the text of an unchanged computation changes (a printer change), so
// that records keyed by the old text are never matched by accident; keys of
// other versions are simply never asked for.
inline constexpr int kCanonicalVersion = 1;

// A fused kernel's computation: the canonical text of its compute definition
// (buffers, stages, axes and symbols named by position; params' shapes and
// dtypes; each symbol's bounds) and the op whose implementation the
// operator strategy chooses (its anchor: "MatMul", "Conv"; empty for a kernel
// with no candidates). The key is the SHA-256 of both and kCanonicalVersion.
struct Workload {
  std::string anchor_op;
  std::string text;
  std::string key;  // 64 hex digits

  static Workload make(std::string anchor_op, std::string canonical_text);
};

// The machine a record holds for: the instruction-set features generated code
// may use, the vector registers the schedule's knobs assume, the caches and
// the core count. Text form (canonical, what the database stores):
//   "isa=avx,avx2,avx512f,fma vec=64x32 fma=32 l1d=32768 l2=1048576 l3=33554432 cores=2"
struct TargetKey {
  std::vector<std::string> isa;  // sorted
  int vector_bytes = 0, vector_registers = 0, fma_bytes = 0;
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  int cores = 0;

  std::string text() const;
  static Result<TargetKey> parse(const std::string& text);
  // This host, with the vector machine of `target` (Target::host() unless a
  // test names another).
  static TargetKey host(const Target& target = Target::host());
};

enum class TargetMatch {
  kExact,         // the same key
  kCompatible,    // the code a record implies runs here and its knobs fit the registers: its features
                  // are a subset of this host's, with the same vector registers (caches or cores differ)
  kIncompatible,  // never used
};
TargetMatch match(const TargetKey& record, const TargetKey& host);
const char* match_name(TargetMatch m);

// One measured schedule of one workload on one target.
struct Record {
  std::string workload;  // Workload::key
  std::string anchor_op;
  std::string target;  // TargetKey::text
  std::string candidate;  // "matmul.packed"; empty for a kernel without candidates
  std::string knobs;      // "mr=8 nr=32"
  std::string schedule;   // the schedule as text (tir::Schedule::to_string), replayable
  std::vector<double> latencies_s;  // every measured run, seconds
  int threads = 1;
  std::string host;          // the CPU's model name
  std::string kiln_version;  // of the Kiln that measured it
  int64_t time = 0;          // seconds since the epoch
  std::string workload_text;  // the canonical text (kept for the cost model and for inspection)
  std::vector<float> features;  // the cost model's features of the measured kernel (features.h); empty: unknown
  int feature_version = 0;      // features.h's kFeatureVersion when they were computed (0: none)
  // How the runs were timed: the bytes written through the caches before
  // each (MeasureOptions::flush_bytes); 0: none, runs back to back (kiln tune
  // --warm-caches); -1: not recorded (records from before schema 4, which
  // were timed after an eviction unless tuned with --warm-caches).
  int64_t evict_bytes = -1;
  int64_t id = 0;               // the database's row, for records read from one (0: not stored yet)

  double median_s() const;
  // Timed with the caches warm (no eviction before its runs): such records
  // are compared only with each other (db::timed_alike).
  bool timed_warm() const { return evict_bytes == 0; }
  // One JSON object on one line (the export format of `kiln db export`).
  std::string to_json() const;
  static Result<Record> from_json(const std::string& line);
};

// The median of measured latencies (the upper one of an even count; 0: none).
double median_of(std::vector<double> latencies);

// The version string records carry (CMake's project version).
const char* kiln_version();
// The host CPU's model name (/proc/cpuinfo), "unknown" where there is none.
std::string host_name();

}  // namespace kiln::tune
