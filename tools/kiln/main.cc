// The `kiln` command line: inspect, run and benchmark ONNX models.
//
//   kiln info MODEL [--kernels [--threads N] [--passes a,b]]
//   kiln run MODEL [--input NAME=FILE.npy ...] [--dim NAME=VALUE ...] [--test-data DIR]
//                  [--threads N] [--atol A] [--rtol R] [--naive] [--output-dir DIR]
//   kiln bench MODEL [--threads N] [--runs N] [--warmup N] [--dim NAME=VALUE ...] [--json]
//
// Exit codes: 0 success, 1 outputs differ from --test-data, 2 any error (message on stderr).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "compare.h"
#include "db.h"
#include "kiln/kiln.h"
#include "mpi.h"
#include "npy.h"
#include "opt.h"
#include "progress.h"
#include "train.h"
#include "support/json.h"
#include "support/memory_limit.h"
#include "test_data.h"
#include "frontend/onnx/export.h"
#include "frontend/onnx/import.h"
#include "ops/registry.h"
#include "train/algorithm.h"
#include "train/step.h"

namespace kiln::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitError = 2;
// Random inputs larger than this are refused (a typo in --dim must not exhaust memory).
constexpr int64_t kMaxRandomInputBytes = int64_t{4} << 30;

// The compile options run, bench, profile and info --kernels share (their
// meaning is the same in each, and in Python's kiln.compile).
const char kCompileOptionsHelp[] =
    "  --threads N             worker threads (0: all hardware threads; Python threads=)\n"
    "  --passes a,b,c          graph passes instead of the default pipeline ('none': no passes; passes=)\n"
    "  --select measure        time every applicable implementation of each MatMul/Gemm/Conv at compile\n"
    "                          time and keep the fastest (default: priority; select=)\n"
    "  --impl NAME[:KNOBS]     prefer an implementation where it applies (repeatable; prefer=), e.g.\n"
    "                          --impl conv.panels or --impl 'matmul.packed:mr=6 nr=64'\n"
    "  --db PATH|URL           the tuning database kernel choice asks first (default: $KILN_DB, else\n"
    "                          ~/.cache/kiln/tuning.db where it exists; db=)\n"
    "  --no-db                 ask no tuning database (db=\"\")\n"
    "  --tune-missing          queue the kernels the database has no record of for kiln tune-worker\n"
    "  --max-memory BYTES      memory one run may allocate, e.g. 4G (default: 80% of RAM; max_memory=)\n";

// Inputs for run, bench and profile.
const char kInputOptionsHelp[] =
    "  --input NAME=FILE.npy   value of one input (repeatable); the others are random\n"
    "  --dim NAME=VALUE        bind a symbolic input dimension for random inputs (default 1)\n"
    "  --naive                 reference schedules (no fusion of loops, serial)\n";

// `kiln COMMAND --help`: usage, options and an example.
std::string command_help(const std::string& command) {
  std::string compile = kCompileOptionsHelp, inputs = kInputOptionsHelp;
  if (command == "info")
    return "usage: kiln info MODEL [--kernels] [--memory] [--train [training options]] [--graph -o graph.html]\n"
           "                 [compile options]\n"
           "  without --kernels: inputs, outputs, op histogram and the inferred (symbolic) type of every value;\n"
           "  with --kernels: compile, then list every kernel: its implementation, knobs and where the choice\n"
           "  came from (database, compatible target, predicted, priority);\n"
           "  with --graph -o FILE: the optimized graph as one self-contained HTML page (fused kernels in\n"
           "  colours, each node's kernel choice shown when clicked)\n"
           "  with --memory: compile, then what one run allocates from the static plan: activations (every\n"
           "  intermediate at the peak), outputs, the kernels' scratch, the peak of all together;\n"
           "  with --train: of MODEL's training step, taking kiln train's --loss, --target, --prediction,\n"
           "  --optimizer, --momentum, --nesterov, --weight-decay, --clip-norm, --memory-budget SIZE and\n"
           "  --recompute dp|sqrt (automatic checkpointing: what is recomputed to fit is reported)\n"
           "  --dump-ir               with --kernels or --memory: every kernel's loop IR and LLVM IR to stderr\n" +
           compile +
           "  example: kiln info resnet50.onnx --kernels --threads 2 --db tuning.db\n"
           "  example: kiln info bert.onnx --graph -o bert.html\n"
           "  example: kiln info resnet18.onnx --train --loss cross-entropy --optimizer adamw --memory\n"
           "           --memory-budget 512MB\n";
  if (command == "run")
    return "usage: kiln run MODEL [options]\n"
           "  compile MODEL, run it once and print each output's dtype, shape and first values\n" +
           inputs +
           "  --test-data DIR         compare with an ONNX test_data_set (input_N.pb, output_N.pb) or a directory\n"
           "                          of test_data_set_* directories; exit 1 when an output differs\n"
           "  --atol A --rtol R       pass iff |actual - expected| <= A + R*|expected| (defaults 1e-4, 1e-3)\n"
           "  --output-dir DIR        write every output as DIR/NAME.npy\n" +
           compile + "  example: kiln run model.onnx --input input=x.npy --output-dir out/\n";
  if (command == "bench")
    return "usage: kiln bench MODEL [options]\n"
           "  compile MODEL, warm up, time repeated runs; print the median, p10/p90 and min\n"
           "  --runs N --warmup N     timed runs (default 20) and untimed ones before them (default 3)\n"
           "  --json                  one JSON object (latencies, compile time per stage)\n"
           "  --dump-ir               every kernel's loop IR and optimized LLVM IR to stderr\n" +
           inputs + compile + "  example: kiln bench resnet50.onnx --threads 1 --runs 50 --json\n";
  if (command == "profile")
    return "usage: kiln profile MODEL [options] [-o trace.json]\n"
           "  time every instruction (kernel) over N runs; print the most expensive first\n"
           "  --runs N                timed runs (default 10)\n"
           "  --top N                 rows printed (default 25)\n"
           "  -o, --output FILE       also write a Chrome trace / Perfetto JSON of every kernel call on every\n"
           "                          thread (node, implementation, knobs, workload key); open it in\n"
           "                          https://ui.perfetto.dev or chrome://tracing\n" +
           inputs + compile + "  example: kiln profile bert.onnx --threads 2 --runs 20 -o bert_trace.json\n";
  if (command == "train")
    return "usage: kiln train MODEL --data DIR [--loss NAME|mse|l1|bce|cross-entropy [--target NAME]\n"
           "                  [--prediction NAME]] [--optimizer sgd|adam|adamw] [--lr X] [--momentum X]\n"
           "                  [--nesterov] [--weight-decay X] [--clip-norm X] [--epochs N] [--threads N]\n"
           "                  [--checkpoint FILE [--resume]] [--memory-budget SIZE [--recompute dp|sqrt]]\n"
           "                  [-o trained.onnx] [--export-training FILE]\n"
           "  train MODEL, whose output --loss (default 'loss') is the value to minimize: forward, backward,\n"
           "  clipping and the update compiled as one graph (docs/training.md), run over the batches of\n"
           "  DIR (one directory per batch, in name order, NAME.npy per input the loss needs). --loss mse,\n"
           "  l1, bce (binary cross-entropy of logits) or cross-entropy (of logits [N, C, ...] against i64\n"
           "  class indices [N, ...]): that loss, the mean over its elements, of the output --prediction\n"
           "  (default: the first) against the input --target (default 'target', a TARGET.npy per batch); the loss of\n"
           "  every step is printed. --checkpoint FILE: parameters and optimizer state saved after every\n"
           "  epoch (replaced only by a complete file); --resume continues from it, bit for bit as if never\n"
           "  stopped. -o: the trained model for inference (the model with its trained initializers).\n"
           "  A model in ONNX's training form (training_info: loss, Gradient and optimizer ops) trains by its\n"
           "  own algorithm unless a loss or optimizer option is given (its input kiln.lr, if any, takes\n"
           "  --lr; its other inputs come from the batches). --export-training FILE: the model with its\n"
           "  training algorithm and state (trained, or as given without --data) in ONNX's training form.\n"
           "  --memory-budget SIZE (512MB, 2G): the step's activations kept under SIZE by recomputing forward\n"
           "  values in the backward (automatic checkpointing; --recompute sqrt: Chen et al.'s segments);\n"
           "  kiln info MODEL --train --memory shows the plan.\n"
           "  example: kiln train mlp.onnx --data batches/ --optimizer adamw --lr 0.001 --epochs 3 -o mlp.trained.onnx\n";
  if (command == "compile")
    return "usage: kiln compile MODEL -o model.kiln [compile options]\n"
           "  compile MODEL ahead of time into one package file: bytecode, kernels as a shared library,\n"
           "  weights (memory-mapped when loaded), memory plan, signatures, target and kernel choices;\n"
           "  kiln run/bench/profile/info and Python's kiln.load take it, as does libkiln_runtime's C API\n"
           "  (no compiler on that machine). Linking the kernels needs a C compiler driver ($KILN_CC, else cc).\n"
           "  -o, --output FILE       the package to write (replaced only by a complete one)\n" +
           compile + "  example: kiln compile resnet50.onnx -o resnet50.kiln && kiln bench resnet50.kiln --threads 1\n";
  if (command == "opt")
    return "usage: kiln opt FILE [--PASS ...] [--passes=a,b] [--default-pipeline] [--disable=a,b]\n"
           "                [--print-after-all] [--print-after=PASS] [--verify-each] [--time-passes]\n"
           "                [-o OUT.kir|OUT.onnx] [--fuse-elementwise] [--lower [--naive]]\n"
           "                [--check-equiv[=PASS]] [--dim NAME=VALUE] | --list-passes [--markdown]\n"
           "  run graph passes on FILE (.onnx, or Kiln's text IR .kir) and print the result or write it;\n"
           "  `kiln opt MODEL -o out.onnx` alone writes the optimized model: the default pipeline without the\n"
           "  passes whose layouts ONNX cannot express (select-kernels, project-rnn-inputs, block-layout);\n"
           "  --lower prints every kernel's compute definition, schedule and loop IR; --check-equiv compares\n"
           "  default against naive schedules (=PASS: the pipeline with and without PASS) on random inputs\n"
           "  example: kiln opt bert.onnx -o bert.opt.onnx\n"
           "  example: kiln opt model.onnx --default-pipeline --print-after=simplify-algebra\n";
  if (command == "ops")
    return "usage: kiln ops\n"
           "  list the supported ONNX ops and how each runs (compiled, runtime kernel, view; fusable;\n"
           "  differentiable: has a gradient rule)\n"
           "  example: kiln ops | grep -i conv\n";
  return "";
}

// Model::compile_file with the stages shown on a terminal; a package
// (`kiln compile`) is loaded instead, with the options that apply to it.
Result<Model> compile_with_progress(const std::string& path, CompileOptions options) {
  if (Model::is_package_file(path)) {
    const CompileOptions defaults;
    const char* compile_only = options.select != defaults.select ? "--select"
                               : !options.prefer_impls.empty()   ? "--impl"
                               : options.passes                  ? "--passes"
                               : !options.db.empty()             ? "--db"
                               : options.naive                   ? "--naive"
                               : options.tune_missing            ? "--tune-missing"
                                                                 : nullptr;
    if (compile_only != nullptr)
      return invalid_argument() << compile_only << " does not apply to the package '" << path << "' (it is compiled)";
    return Model::load(path, options);
  }
  if (progress().enabled()) {
    std::string name = std::filesystem::path(path).filename().string();
    options.on_stage = [name](const std::string& stage) { progress().show("kiln: compiling " + name + ": " + stage); };
  }
  auto model = Model::compile_file(path, options);
  progress().clear();
  return model;
}

const char kUsage[] =
    "usage:\n"
    "  kiln info MODEL\n"
    "      print inputs, outputs, op histogram and the inferred type of every value\n"
    "  kiln info MODEL --kernels [--threads N] [--passes a,b]\n"
    "      compile, then list every kernel: the implementation chosen, its knobs and why\n"
    "  kiln run MODEL [options]\n"
    "      --input NAME=FILE.npy   value of one input (repeatable); others are random\n"
    "      --dim NAME=VALUE        bind a symbolic input dimension for random inputs (default 1)\n"
    "      --test-data DIR         compare with an ONNX test_data_set (input_N.pb, output_N.pb)\n"
    "                              or a directory of test_data_set_* directories\n"
    "      --atol A --rtol R       pass iff |actual - expected| <= A + R*|expected|\n"
    "                              (defaults 1e-4 and 1e-3)\n"
    "      --threads N             worker threads (0: all hardware threads)\n"
    "      --naive                 reference schedules (no fusion of loops, serial)\n"
    "      --max-memory BYTES      memory one run may allocate, e.g. 4G (default: 80% of RAM)\n"
    "      --output-dir DIR        write every output as DIR/NAME.npy\n"
    "      --passes a,b,c          graph passes instead of the default pipeline ('none': no passes)\n"
    "      --select measure        time every applicable implementation of each MatMul/Gemm/Conv at\n"
    "                              compile time and keep the fastest (default: priority)\n"
    "      --impl NAME[:KNOBS]     prefer an implementation where it applies (repeatable), e.g.\n"
    "                              --impl conv.panels or --impl 'matmul.packed:mr=6 nr=64'\n"
    "      --db PATH|URL           the tuning database kernel choice asks first (default: $KILN_DB,\n"
    "                              else ~/.cache/kiln/tuning.db where it exists; KILN_DB=off: none)\n"
    "      --no-db                 ask no tuning database\n"
    "      --tune-missing          queue the kernels the database has no record of as jobs for\n"
    "                              kiln tune-worker (the compile still runs without waiting)\n"
    "      (--select, --impl, --db, --no-db and --tune-missing also apply to bench, profile and\n"
    "       info --kernels)\n"
    "  kiln bench MODEL [--threads N] [--runs N] [--warmup N] [--dim NAME=VALUE] [--passes a,b] [--json] [--dump-ir]\n"
    "      compile, warm up, time repeated runs; print median, p10/p90, min\n"
    "      (--dump-ir: the loop IR and optimized LLVM IR of every kernel to stderr)\n"
    "  kiln train MODEL --data DIR [--optimizer sgd|adam|adamw] [--lr X] [--epochs N] [-o trained.onnx]\n"
    "      train the model's loss output over .npy batches (kiln train --help)\n"
    "  kiln compile MODEL -o model.kiln [compile options]\n"
    "      compile ahead of time into one package file, which run, bench, profile and info take\n"
    "      in place of MODEL (then only --threads and --max-memory apply)\n"
    "  kiln opt FILE [--PASS ...] [--passes=a,b] [--default-pipeline] [--print-after-all] [--print-after=PASS]\n"
    "           [--disable=a,b] [--verify-each] [--time-passes] [--fuse-elementwise] [--lower] [--naive]\n"
    "           [-o OUT.kir|OUT.onnx] [--list-passes [--markdown]]\n"
    "           [--check-equiv[=PASS]] [--dim NAME=VALUE]\n"
    "      run compiler steps on a graph (.kir text or .onnx) and print the result;\n"
    "      --check-equiv compares default against naive schedules on random inputs;\n"
    "      --check-equiv=PASS compares the pipeline with and without PASS\n"
    "      (symbols not fixed by --dim are bound to 1, 3 and 8 in turn)\n"
    "  kiln profile MODEL [--threads N] [--runs N] [--top N] [--dim NAME=VALUE] [--input NAME=FILE.npy] [--passes a,b]\n"
    "               [-o trace.json]\n"
    "      time every instruction (kernel) over N runs; print the most expensive first; -o: also a\n"
    "      Chrome trace / Perfetto JSON of every kernel call on every thread (node, implementation,\n"
    "      knobs, workload key)\n"
    "  kiln tune MODEL [--db PATH] [--time-budget 600|10m] [--trials N] [--threads T] [--dim NAME=VALUE]\n"
    "      search every kernel's schedules and commit them to the tuning database (kiln tune --help)\n"
    "  kiln tune MODEL --db URL --enqueue;  kiln tune-worker --db URL [--threads T] [--exit-when-idle]\n"
    "      queue a model's workloads as jobs; workers on machines of one target claim and tune them\n"
    "  kiln db stats|export|import|prune [DB] ...\n"
    "      the tuning database (kiln db --help)\n"
    "  kiln ops\n"
    "      list the supported ONNX ops and how each runs (compiled, runtime kernel, view)\n"
    "kiln COMMAND --help: a command's options and an example\n"
    "exit codes: 0 ok, 1 outputs differ from --test-data (or --check-equiv), 2 error\n";

// ---------------------------------------------------------------------------
// Command-line parsing.

struct OptionSpec {
  std::set<std::string> with_value;  // --name VALUE or --name=VALUE
  std::set<std::string> flags;       // --name
  std::set<std::string> repeatable;  // subset of with_value
};

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;
  std::set<std::string> flags;

  std::optional<std::string> get(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return std::nullopt;
    return it->second.back();
  }
  std::vector<std::string> get_all(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
};

Result<ParsedArgs> parse_args(const std::vector<std::string>& args, const OptionSpec& spec) {
  ParsedArgs out;
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    // -o FILE is --output FILE.
    const std::string a = !only_positional && args[i] == "-o" ? "--output" : args[i];
    if (only_positional || a.size() < 2 || a.rfind("--", 0) != 0) {
      if (!only_positional && a.size() > 1 && a[0] == '-') {
        return invalid_argument() << "unknown option '" << a << "'";
      }
      out.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (spec.flags.count(name)) {
      if (value) return invalid_argument() << "option '--" << name << "' takes no value";
      out.flags.insert(name);
      continue;
    }
    if (!spec.with_value.count(name)) return invalid_argument() << "unknown option '--" << name << "'";
    if (!value) {
      if (i + 1 >= args.size()) return invalid_argument() << "option '--" << name << "' needs a value";
      value = args[++i];
    }
    auto& slot = out.values[name];
    if (!slot.empty() && !spec.repeatable.count(name)) {
      return invalid_argument() << "option '--" << name << "' given more than once";
    }
    slot.push_back(*value);
  }
  return out;
}

Result<int64_t> parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < lo || v > hi) {
    return invalid_argument() << what << " must be an integer in [" << lo << ", " << hi
                              << "], got '" << text << "'";
  }
  return static_cast<int64_t>(v);
}

Result<double> parse_tolerance(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v) ||
      v < 0) {
    return invalid_argument() << what << " must be a finite non-negative number, got '" << text
                              << "'";
  }
  return v;
}

Result<std::pair<std::string, std::string>> split_assignment(const std::string& text,
                                                              const std::string& option) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return invalid_argument() << "--" << option << " expects NAME=VALUE, got '" << text << "'";
  }
  return std::make_pair(text.substr(0, eq), text.substr(eq + 1));
}

Result<std::string> single_model_argument(const ParsedArgs& args, const std::string& command) {
  if (args.positional.size() != 1) {
    return invalid_argument() << "'kiln " << command << "' takes exactly one MODEL argument, got "
                              << args.positional.size();
  }
  return args.positional[0];
}

Result<CompileOptions> compile_options(const ParsedArgs& args) {
  CompileOptions options;
  if (auto t = args.get("threads")) {
    KILN_ASSIGN_OR_RETURN(int64_t threads, parse_int(*t, "--threads", 0, 4096));
    options.threads = static_cast<int>(threads);
  }
  options.naive = args.has("naive");
  options.dump_ir = args.has("dump-ir");
  if (auto m = args.get("max-memory")) {
    KILN_ASSIGN_OR_RETURN(options.max_memory_bytes, parse_byte_size(*m));
    if (options.max_memory_bytes <= 0) return invalid_argument() << "--max-memory must be positive";
  }
  // --passes=a,b,c replaces the default pipeline ("none": no graph passes).
  if (auto p = args.get("passes")) {
    std::vector<std::string> list;
    if (*p != "none") {
      std::string cur;
      for (char c : *p + ",") {
        if (c != ',') {
          cur += c;
        } else if (!cur.empty()) {
          list.push_back(cur);
          cur.clear();
        }
      }
    }
    options.passes = list;
  }
  if (auto sel = args.get("select")) options.select = *sel;
  options.prefer_impls = args.get_all("impl");
  if (auto d = args.get("db")) options.db = *d;
  options.no_db = args.has("no-db");
  if (options.no_db && !options.db.empty()) return invalid_argument() << "--db and --no-db together";
  options.tune_missing = args.has("tune-missing");
  if (options.tune_missing && options.no_db) return invalid_argument() << "--tune-missing needs a database (not --no-db)";
  return options;
}

Result<std::map<std::string, int64_t>> parse_dims(const ParsedArgs& args) {
  std::map<std::string, int64_t> dims;
  for (const std::string& text : args.get_all("dim")) {
    KILN_ASSIGN_OR_RETURN(auto kv, split_assignment(text, "dim"));
    KILN_ASSIGN_OR_RETURN(int64_t v, parse_int(kv.second, "--dim " + kv.first, 0,
                                               int64_t{1} << 40));
    dims[kv.first] = v;
  }
  return dims;
}

// ---------------------------------------------------------------------------
// Inputs and outputs.

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

Result<std::vector<int64_t>> bind_dims(const TensorInfo& info,
                                       const std::map<std::string, int64_t>& dims,
                                       std::set<std::string>* used) {
  std::vector<int64_t> shape;
  for (const std::string& d : info.dims) {
    if (!d.empty() && std::all_of(d.begin(), d.end(), ::isdigit)) {
      KILN_ASSIGN_OR_RETURN(int64_t v, parse_int(d, "dimension of input '" + info.name + "'", 0,
                                                 std::numeric_limits<int64_t>::max()));
      shape.push_back(v);
    } else if (is_identifier(d)) {
      auto it = dims.find(d);
      shape.push_back(it == dims.end() ? 1 : it->second);
      used->insert(d);
    } else {
      return invalid_argument() << "input '" << info.name << "' has dimension '" << d
                                << "', which a random input cannot bind; pass --input "
                                << info.name << "=FILE.npy";
    }
  }
  return shape;
}

Result<Tensor> random_tensor(const TensorInfo& info, const std::vector<int64_t>& shape,
                             std::mt19937_64& rng) {
  int64_t size = dtype_size(info.dtype);
  int64_t bytes = size;
  for (int64_t d : shape) {
    if (d != 0 && bytes > kMaxRandomInputBytes / d) {
      bytes = kMaxRandomInputBytes + 1;
      break;
    }
    bytes *= d;
  }
  if (bytes > kMaxRandomInputBytes) {
    return invalid_argument() << "random input '" << info.name << "' of shape "
                              << shape_to_string(shape) << " would need more than "
                              << (kMaxRandomInputBytes >> 30)
                              << " GiB; bind smaller symbolic dims with --dim or pass --input";
  }
  bool numeric = dtype_is_float(info.dtype) || dtype_is_int(info.dtype) || info.dtype == DType::kBool;
  if (!numeric || !dtype_is_compilable(info.dtype)) {
    return unsupported() << "cannot generate a random " << dtype_name(info.dtype) << " value for input '"
                         << info.name << "'; pass --input " << info.name << "=FILE.npy";
  }
  Tensor t(info.dtype, shape);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small_int(0, 9);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype_is_float(info.dtype)) {
      t.set_f64(i, real(rng));
    } else if (info.dtype == DType::kBool) {
      t.set_f64(i, small_int(rng) % 2);
    } else {
      t.set_f64(i, small_int(rng));
    }
  }
  return t;
}

// Inputs from --input files; the others random (fixed seed).
Result<std::map<std::string, Tensor>> build_inputs(const Model& model, const ParsedArgs& args) {
  std::map<std::string, Tensor> inputs;
  std::set<std::string> names;
  for (const TensorInfo& info : model.inputs()) names.insert(info.name);
  for (const std::string& text : args.get_all("input")) {
    KILN_ASSIGN_OR_RETURN(auto kv, split_assignment(text, "input"));
    if (!names.count(kv.first)) {
      std::string known;
      for (const TensorInfo& info : model.inputs()) known += (known.empty() ? "" : ", ") + info.name;
      return invalid_argument() << "the model has no input '" << kv.first << "' (inputs: " << known
                                << ")";
    }
    if (inputs.count(kv.first)) return invalid_argument() << "input '" << kv.first << "' given twice";
    KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(kv.second));
    inputs[kv.first] = std::move(t);
  }
  KILN_ASSIGN_OR_RETURN(auto dims, parse_dims(args));
  std::set<std::string> used;
  std::mt19937_64 rng(20240229);
  for (const TensorInfo& info : model.inputs()) {
    if (inputs.count(info.name)) continue;
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, bind_dims(info, dims, &used));
    KILN_ASSIGN_OR_RETURN(Tensor t, random_tensor(info, shape, rng));
    inputs[info.name] = std::move(t);
  }
  for (const auto& [name, value] : dims) {
    if (!used.count(name)) {
      std::cerr << "kiln: warning: --dim " << name
                << " matches no symbolic dimension of a randomly generated input\n";
    }
  }
  return inputs;
}

std::string format_number(double v) {
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

void print_summary(const Model& model, const std::map<std::string, Tensor>& outputs) {
  for (const TensorInfo& info : model.outputs()) {
    auto it = outputs.find(info.name);
    if (it == outputs.end()) {
      std::cout << info.name << ": (missing)\n";
      continue;
    }
    const Tensor& t = it->second;
    std::cout << info.name << ": " << t.describe();
    bool numeric = dtype_is_float(t.dtype()) || dtype_is_int(t.dtype()) || t.dtype() == DType::kBool;
    if (numeric && t.defined()) {
      double sum = 0;
      for (int64_t i = 0; i < t.numel(); ++i) sum += t.get_f64(i);
      std::cout << "  mean " << format_number(t.numel() ? sum / t.numel() : 0.0) << "  first [";
      int64_t shown = std::min<int64_t>(t.numel(), 8);
      for (int64_t i = 0; i < shown; ++i) std::cout << (i ? ", " : "") << format_number(t.get_f64(i));
      std::cout << (t.numel() > shown ? ", ...]" : "]");
    }
    std::cout << "\n";
  }
}

std::string file_name_for(const std::string& output_name) {
  std::string s = output_name;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  if (s.empty() || s[0] == '.') s = "_" + s;
  return s + ".npy";
}

Status write_outputs(const std::string& dir, const std::map<std::string, Tensor>& outputs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error() << "cannot create output directory '" << dir << "': " << ec.message();
  for (const auto& [name, tensor] : outputs) {
    std::string path = (std::filesystem::path(dir) / file_name_for(name)).string();
    KILN_RETURN_IF_ERROR(write_npy(path, tensor).with_context("output '" + name + "'"));
    std::cout << "wrote " << path << "\n";
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Subcommands. Each returns an exit code or an error Status (exit code 2).

// `kiln info MODEL --memory [--train ...]`: CompileStats' memory figures.
std::string memory_report(const Model& model, bool train) {
  const CompileStats& s = model.stats();
  std::ostringstream os;
  int64_t inputs = 0;
  for (const TensorInfo& info : model.inputs()) {
    int64_t n = dtype_size(info.dtype);
    for (const std::string& d : info.dims) {
      char* end = nullptr;
      long long v = std::strtoll(d.c_str(), &end, 10);
      n = end != d.c_str() && *end == '\0' ? n * v : -1;
      if (n < 0) break;
    }
    inputs = n < 0 || inputs < 0 ? -1 : inputs + n;
  }
  os << (train ? "training step" : "model") << " memory (static plan):\n";
  if (!s.memory_known) {
    os << "  not known at compile time: shapes are symbolic or the program has control flow\n";
    return os.str();
  }
  auto row = [&](const std::string& what, int64_t bytes, const std::string& note) {
    os << "  " << std::left << std::setw(30) << what << std::right << std::setw(12) << format_bytes(bytes) << "  "
       << note << "\n";
  };
  if (inputs >= 0)
    row("inputs", inputs, train ? "(the caller's: data, parameters, optimizer state)" : "(the caller's)");
  row("activations", s.activation_bytes, "every intermediate at the peak (arena " + format_bytes(s.arena_bytes) + ")");
  if (!s.peak_at.empty()) {
    os << "  " << std::left << std::setw(44) << "largest at the peak" << std::right << s.peak_at << ": ";
    for (size_t i = 0; i < s.peak_values.size(); ++i)
      os << (i ? ", " : "") << s.peak_values[i].first << " " << format_bytes(s.peak_values[i].second);
    os << "\n";
  }
  row("outputs", s.output_bytes, "");
  row("kernel scratch", s.scratch_bytes, "the kernels' own buffers, kept per thread across runs");
  row("peak a run allocates", s.peak_bytes, "all of these at their peak together");
  if (s.unbudgeted_activation_bytes > 0) {
    row("activations without budget", s.unbudgeted_activation_bytes, "");
    std::ostringstream share;
    share << std::fixed << std::setprecision(1) << 100 * s.recompute_share;
    os << "  recomputed: " << s.recomputed_segments << " forward segment" << (s.recomputed_segments == 1 ? "" : "s")
       << ", " << s.recomputed_values << " value" << (s.recomputed_values == 1 ? "" : "s") << " alone, " << s.recomputed_calls << " kernel call" << (s.recomputed_calls == 1 ? "" : "s") << ", "
       << share.str() << "% of the forward's estimated compute\n";
  }
  return os.str();
}

// The training step's settings `kiln train` and `kiln info --train` share.
const std::vector<std::string> kTrainValueOptions = {"loss", "target", "prediction", "optimizer", "momentum",
                                                     "weight-decay", "clip-norm", "memory-budget", "recompute"};

// model_algorithm: the model carries its own training algorithm (ONNX
// training_info), used unless a loss or optimizer option replaces it.
Result<TrainOptions> train_options(const ParsedArgs& args, bool model_algorithm) {
  TrainOptions t;
  const char* replacing[] = {"loss", "target", "prediction", "optimizer", "momentum", "weight-decay", "clip-norm"};
  t.model_algorithm = model_algorithm && !args.has("nesterov") &&
                      std::none_of(std::begin(replacing), std::end(replacing), [&](const char* o) { return args.get(o).has_value(); });
  t.loss = args.get("loss").value_or("loss");
  std::string kind = t.loss == "cross-entropy" ? "cross_entropy" : t.loss;
  if (std::find(std::begin(train::kLossKinds), std::end(train::kLossKinds), kind) != std::end(train::kLossKinds)) {
    t.loss_kind = kind;
    t.loss = train::kLossOutput;
    t.target = args.get("target").value_or("target");
    t.prediction = args.get("prediction").value_or("");
  } else if (args.get("target") || args.get("prediction")) {
    return invalid_argument() << "--target and --prediction go with --loss mse, l1, bce or cross-entropy";
  }
  t.optimizer = args.get("optimizer").value_or("sgd");
  t.nesterov = args.has("nesterov");
  if (auto v = args.get("momentum")) {
    KILN_ASSIGN_OR_RETURN(t.momentum, parse_tolerance(*v, "--momentum"));
  }
  if (auto v = args.get("weight-decay")) {
    KILN_ASSIGN_OR_RETURN(t.weight_decay, parse_tolerance(*v, "--weight-decay"));
  }
  if (auto v = args.get("clip-norm")) {
    KILN_ASSIGN_OR_RETURN(t.clip_norm, parse_tolerance(*v, "--clip-norm"));
  }
  if (auto v = args.get("memory-budget")) {
    KILN_ASSIGN_OR_RETURN(t.memory_budget, parse_byte_size(*v));
    if (t.memory_budget <= 0) return invalid_argument() << "--memory-budget must be positive";
  }
  t.checkpoint_policy = args.get("recompute").value_or("dp");
  if (args.get("recompute") && t.memory_budget <= 0) return invalid_argument() << "--recompute goes with --memory-budget";
  return t;
}

// kiln tune: --train and kiln train's step options are taken out here (the
// same parsing as kiln train's) and the rest goes to tools/kiln/tune.cc.
Result<int> cmd_tune_command(const std::vector<std::string>& argv) {
  std::vector<std::string> rest, step_args;
  bool train = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    std::string name = a.rfind("--", 0) == 0 ? a.substr(2) : "";
    name = name.substr(0, name.find('='));  // --loss=mse names loss
    if (a == "--train") {
      train = true;
    } else if (a == "--nesterov") {
      step_args.push_back(a);
    } else if (!name.empty() && std::find(kTrainValueOptions.begin(), kTrainValueOptions.end(), name) != kTrainValueOptions.end()) {
      step_args.push_back(a);
      if (a.find('=') == std::string::npos && i + 1 < argv.size()) step_args.push_back(argv[++i]);
    } else {
      rest.push_back(a);
    }
  }
  if (!train) {
    if (!step_args.empty()) return invalid_argument() << step_args[0] << " goes with --train";
    return cmd_tune(rest, nullptr);
  }
  OptionSpec spec;
  spec.with_value.insert(kTrainValueOptions.begin(), kTrainValueOptions.end());
  spec.flags = {"nesterov"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs step, parse_args(step_args, spec));
  // The model's own training algorithm (training_info) applies unless a loss
  // or optimizer option replaces it, as in kiln train.
  return cmd_tune(rest, [step](const std::string& model) -> Result<TrainOptions> {
    bool model_algorithm = false;
    if (!Model::is_package_file(model)) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(model));
      model_algorithm = !g->training_info.empty();
    }
    return train_options(step, model_algorithm);
  });
}

Result<int> cmd_info(const std::vector<std::string>& argv) {
  OptionSpec spec;
  spec.with_value = {"threads", "select", "impl", "passes", "max-memory", "db", "output"};
  spec.with_value.insert(kTrainValueOptions.begin(), kTrainValueOptions.end());
  spec.repeatable = {"impl"};
  spec.flags = {"kernels", "graph", "no-db", "tune-missing", "train", "memory", "nesterov", "dump-ir"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs args, parse_args(argv, spec));
  KILN_ASSIGN_OR_RETURN(std::string path, single_model_argument(args, "info"));
  const bool train = args.has("train");
  for (const std::string& o : kTrainValueOptions)
    if (args.get(o) && !train) return invalid_argument() << "--" << o << " goes with --train";
  if (args.has("nesterov") && !train) return invalid_argument() << "--nesterov goes with --train";
  if (train && (args.flags.count("graph") || Model::is_package_file(path)))
    return invalid_argument() << "--train goes with --memory or --kernels on a model file";
  if (args.has("memory")) {
    // What a run allocates, from the static memory plan: for a training
    // step, with checkpointing under --memory-budget.
    KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
    if (train) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(path));
      KILN_ASSIGN_OR_RETURN(options.train, train_options(args, !g->training_info.empty()));
    }
    KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
    std::cout << memory_report(model, train);
    if (args.flags.count("kernels")) std::cout << model.kernels_text();
    return kExitOk;
  }
  if (train && !args.flags.count("kernels")) return invalid_argument() << "--train goes with --memory or --kernels";
  if (args.flags.count("graph")) {
    // The optimized graph as a page: fusion groups and kernel choices.
    auto out = args.get("output");
    if (!out) return invalid_argument() << "info --graph writes a page: give -o graph.html";
    if (Model::is_package_file(path))
      return invalid_argument() << "a package keeps no graph: run info --graph on the model it was compiled from";
    KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
    KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
    std::ofstream f(*out, std::ios::binary | std::ios::trunc);
    if (!f) return io_error() << "cannot write '" << *out << "'";
    f << model.graph_html();
    f.close();
    if (!f) return io_error() << "writing '" << *out << "' failed";
    std::cout << "wrote " << *out << " (" << model.stats().num_nodes << " nodes, " << model.stats().num_kernels
              << " kernels)\n";
    if (args.flags.count("kernels")) std::cout << model.kernels_text();
    return kExitOk;
  }
  if (args.get("output")) return invalid_argument() << "info writes a file only with --graph (-o graph.html)";
  if (Model::is_package_file(path)) {
    KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
    KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
    std::cout << "package: " << path << "\n" << model.package_metadata() << "\n";
    if (args.flags.count("kernels")) std::cout << model.kernels_text();
    return kExitOk;
  }
  if (args.flags.count("kernels")) {
    // Compiles the model (or its training step) and lists every kernel with its implementation.
    KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
    if (train) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(path));
      KILN_ASSIGN_OR_RETURN(options.train, train_options(args, !g->training_info.empty()));
    }
    KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
    std::cout << model.kernels_text();
    return kExitOk;
  }
  KILN_ASSIGN_OR_RETURN(std::string text, describe_model_file(path));
  std::cout << text;
  if (!text.empty() && text.back() != '\n') std::cout << "\n";
  return kExitOk;
}

// Maps a test data set's tensors onto model names: by TensorProto name when it is one
// of `names`, else by position.
Result<std::vector<std::string>> match_names(const std::vector<NamedTensor>& tensors,
                                             const std::vector<TensorInfo>& infos,
                                             const std::string& kind, const std::string& dir) {
  std::vector<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& n = tensors[i].name;
    bool known = std::any_of(infos.begin(), infos.end(), [&](const TensorInfo& t) { return t.name == n; });
    if (!n.empty() && known) {
      names.push_back(n);
    } else if (i < infos.size()) {
      names.push_back(infos[i].name);
    } else {
      return invalid_argument() << dir << ": " << tensors[i].path << " is " << kind << " #" << i
                                << " but the model has only " << infos.size() << " " << kind
                                << "s";
    }
  }
  return names;
}

Result<int> run_test_data(Model& model, const std::string& dir, double atol, double rtol) {
  KILN_ASSIGN_OR_RETURN(std::vector<TestDataSet> sets, load_test_data(dir));
  int failures = 0;
  for (const TestDataSet& set : sets) {
    KILN_ASSIGN_OR_RETURN(auto in_names, match_names(set.inputs, model.inputs(), "input", set.dir));
    KILN_ASSIGN_OR_RETURN(auto out_names, match_names(set.outputs, model.outputs(), "output", set.dir));
    std::map<std::string, Tensor> inputs;
    for (size_t i = 0; i < set.inputs.size(); ++i) inputs[in_names[i]] = set.inputs[i].tensor;
    KILN_ASSIGN_OR_RETURN(auto outputs, model.run(inputs));
    std::cout << set.dir << ":\n";
    for (size_t i = 0; i < set.outputs.size(); ++i) {
      const Tensor& expected = set.outputs[i].tensor;
      std::cout << "  " << out_names[i] << "  " << expected.describe();
      auto it = outputs.find(out_names[i]);
      if (it == outputs.end()) {
        std::cout << "  FAIL: the model produced no output '" << out_names[i] << "'\n";
        ++failures;
        continue;
      }
      Comparison c = compare_tensors(it->second, expected, atol, rtol);
      if (!c.problem.empty()) {
        std::cout << "  FAIL: " << c.problem << "\n";
        ++failures;
        continue;
      }
      std::cout << "  max_abs_err " << format_number(c.max_abs_error) << "  max_rel_err "
                << format_number(c.max_rel_error);
      if (c.pass) {
        std::cout << "  PASS\n";
      } else {
        ++failures;
        std::cout << "  FAIL: " << c.mismatches << " of " << expected.numel()
                  << " elements outside atol " << atol << " + rtol " << rtol << " (first at "
                  << c.first_mismatch << ": got " << format_number(it->second.get_f64(c.first_mismatch))
                  << ", expected " << format_number(expected.get_f64(c.first_mismatch)) << ")\n";
      }
    }
  }
  std::cout << (failures ? "FAIL" : "PASS") << " (" << sets.size() << " data set"
            << (sets.size() == 1 ? "" : "s") << ", " << failures << " mismatching output"
            << (failures == 1 ? "" : "s") << ")\n";
  return failures ? kExitMismatch : kExitOk;
}

Result<int> cmd_run(const std::vector<std::string>& argv) {
  OptionSpec spec;
  spec.with_value = {"input", "dim", "test-data", "threads", "select", "impl", "atol", "rtol", "output-dir", "max-memory", "passes", "db"};
  spec.repeatable = {"input", "dim", "impl"};
  spec.flags = {"naive", "no-db", "tune-missing"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs args, parse_args(argv, spec));
  KILN_ASSIGN_OR_RETURN(std::string path, single_model_argument(args, "run"));
  KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
  double atol = 1e-4, rtol = 1e-3;
  if (auto a = args.get("atol")) {
    KILN_ASSIGN_OR_RETURN(atol, parse_tolerance(*a, "--atol"));
  }
  if (auto r = args.get("rtol")) {
    KILN_ASSIGN_OR_RETURN(rtol, parse_tolerance(*r, "--rtol"));
  }
  auto test_data = args.get("test-data");
  if (test_data && (!args.get_all("input").empty() || !args.get_all("dim").empty())) {
    return invalid_argument() << "--test-data provides the inputs; do not combine it with --input or --dim";
  }
  if (test_data && args.get("output-dir")) {
    return invalid_argument() << "--output-dir does not apply with --test-data";
  }
  if (!test_data && (args.get("atol") || args.get("rtol"))) {
    return invalid_argument() << "--atol and --rtol only apply with --test-data";
  }

  KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
  if (test_data) {
    KILN_ASSIGN_OR_RETURN(int code, run_test_data(model, *test_data, atol, rtol));
    return code;
  }
  KILN_ASSIGN_OR_RETURN(auto inputs, build_inputs(model, args));
  KILN_ASSIGN_OR_RETURN(auto outputs, model.run(inputs));
  print_summary(model, outputs);
  if (auto dir = args.get("output-dir")) KILN_RETURN_IF_ERROR(write_outputs(*dir, outputs));
  return kExitOk;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.size() == 1) return sorted[0];
  double pos = p * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::string json_string(const std::string& s) { return json_quote(s); }

Result<int> cmd_bench(const std::vector<std::string>& argv) {
  OptionSpec spec;
  spec.with_value = {"threads", "select", "impl", "runs", "warmup", "dim", "input", "max-memory", "passes", "db"};
  spec.repeatable = {"dim", "input", "impl"};
  spec.flags = {"json", "naive", "dump-ir", "no-db", "tune-missing"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs args, parse_args(argv, spec));
  KILN_ASSIGN_OR_RETURN(std::string path, single_model_argument(args, "bench"));
  KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
  int64_t runs = 20, warmup = 3;
  if (auto r = args.get("runs")) {
    KILN_ASSIGN_OR_RETURN(runs, parse_int(*r, "--runs", 1, 1000000));
  }
  if (auto w = args.get("warmup")) {
    KILN_ASSIGN_OR_RETURN(warmup, parse_int(*w, "--warmup", 0, 1000000));
  }
  bool json = args.has("json");

  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
  double compile_s = std::chrono::duration<double>(Clock::now() - t0).count();
  KILN_ASSIGN_OR_RETURN(auto inputs, build_inputs(model, args));

  for (int64_t i = 0; i < warmup; ++i) {
    progress().show("kiln: bench: warm-up " + std::to_string(i + 1) + "/" + std::to_string(warmup));
    auto out = model.run(inputs);
    if (!out) return out.status();
  }
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(runs));
  for (int64_t i = 0; i < runs; ++i) {
    progress().show("kiln: bench: run " + std::to_string(i + 1) + "/" + std::to_string(runs));
    auto start = Clock::now();
    auto out = model.run(inputs);
    double elapsed = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!out) return out.status();
    ms.push_back(elapsed);
  }
  progress().clear();
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double median = percentile(sorted, 0.5), p10 = percentile(sorted, 0.1),
         p90 = percentile(sorted, 0.9), min = sorted.front(), max = sorted.back();
  double mean = 0;
  for (double v : ms) mean += v / static_cast<double>(ms.size());
  int threads = options.threads > 0 ? options.threads
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const CompileStats& stats = model.stats();
  if (json) {
    std::cout << std::setprecision(9) << "{\"model\": " << json_string(path)
              << ", \"threads\": " << threads << ", \"runs\": " << runs << ", \"warmup\": " << warmup
              << ", \"naive\": " << (options.naive ? "true" : "false")
              << ", \"compile_s\": " << compile_s << ", \"median_ms\": " << median
              << ", \"p10_ms\": " << p10 << ", \"p90_ms\": " << p90 << ", \"min_ms\": " << min
              << ", \"max_ms\": " << max << ", \"mean_ms\": " << mean
              << ", \"num_kernels\": " << stats.num_kernels
              << ", \"num_runtime_kernels\": " << stats.num_runtime_kernels
              << ", \"arena_bytes\": " << stats.arena_bytes
              << ", \"num_nodes_imported\": " << stats.num_nodes_imported
              << ", \"num_nodes\": " << stats.num_nodes << ", \"compile_stages_s\": {";
    for (size_t i = 0; i < stats.stages.size(); ++i)
      std::cout << (i ? ", " : "") << json_string(stats.stages[i].first) << ": " << stats.stages[i].second;
    std::cout << "}}\n";
  } else {
    std::cout << std::fixed << std::setprecision(3);
    std::cout << "model      " << path << "\n"
              << "threads    " << threads << "\n"
              << "compile    " << compile_s << " s (" << stats.num_kernels << " kernels, "
              << stats.num_runtime_kernels << " runtime kernel calls; graph " << stats.num_nodes_imported
              << " -> " << stats.num_nodes << " nodes)\n"
              << "stages     " << [&] {
                   std::ostringstream os;
                   os << std::fixed << std::setprecision(3);
                   for (size_t i = 0; i < stats.stages.size(); ++i)
                     os << (i ? ", " : "") << stats.stages[i].first << " " << stats.stages[i].second;
                   return os.str();
                 }() << " s\n"
              << "runs       " << runs << " after " << warmup << " warm-up\n"
              << "median     " << median << " ms\n"
              << "p10 / p90  " << p10 << " / " << p90 << " ms (spread "
              << (median > 0 ? 100.0 * (p90 - p10) / median : 0.0) << "%)\n"
              << "min / max  " << min << " / " << max << " ms\n";
  }
  return kExitOk;
}

Result<int> cmd_compile(const std::vector<std::string>& argv) {
  OptionSpec spec;
  spec.with_value = {"threads", "select", "impl", "passes", "max-memory", "db", "output"};
  spec.repeatable = {"impl"};
  spec.flags = {"no-db", "tune-missing"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs args, parse_args(argv, spec));
  KILN_ASSIGN_OR_RETURN(std::string path, single_model_argument(args, "compile"));
  auto out = args.get("output");
  if (!out) return invalid_argument() << "compile writes a package: give -o model.kiln";
  if (Model::is_package_file(path)) return invalid_argument() << "'" << path << "' is a package already";
  KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
  KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
  progress().show("kiln: writing " + *out);
  Status st = model.save(*out);
  progress().clear();
  KILN_RETURN_IF_ERROR(st);
  std::error_code ec;
  auto bytes = std::filesystem::file_size(*out, ec);
  double kb = ec ? 0.0 : static_cast<double>(bytes) / 1024.0;
  std::cout << "wrote " << *out << " (" << std::fixed << std::setprecision(1) << (kb >= 1024 ? kb / 1024 : kb)
            << (kb >= 1024 ? " MB; " : " KB; ") << model.stats().num_kernels << " kernels, " << model.stats().num_runtime_kernels
            << " runtime kernel calls)\n";
  return kExitOk;
}

// kiln train: the model's training step (CompileOptions::train) run over
// the batches of --data for --epochs, the loss of every step printed.
// Rows [rank * n / size, (rank + 1) * n / size) of `t` along axis 0: this
// process's share of a batch in a data-parallel job.
Result<Tensor> batch_share(const Tensor& t, const Collective& world, const std::string& what) {
  if (t.rank() == 0 || t.shape()[0] % world.size != 0)
    return invalid_argument() << what << " has " << (t.rank() == 0 ? 0 : t.shape()[0]) << " rows along axis 0, not "
                              << "a multiple of the " << world.size << " processes";
  std::vector<int64_t> shape = t.shape();
  shape[0] /= world.size;
  Tensor out(t.dtype(), shape);
  const size_t bytes = static_cast<size_t>(out.numel()) * dtype_size(t.dtype());
  std::memcpy(out.data(), static_cast<const char*>(t.data()) + bytes * static_cast<size_t>(world.rank), bytes);
  return out;
}

Result<int> train_steps(const std::vector<std::string>& argv, const std::shared_ptr<const Collective>& world);

// The values the training algorithm's initialization graph gives the
// initializers it binds (ONNX runs it once, when training starts). `model`
// has its types inferred.
Result<std::map<std::string, Tensor>> run_initialization(Graph& model, const CompileOptions& options) {
  std::map<std::string, Tensor> out;
  if (model.training_info.empty() || model.training_info[0].initialization == nullptr) return out;
  const TrainingInfo& info = model.training_info[0];
  Graph& init = *info.initialization;
  if (!init.captures().empty())
    return unsupported() << model.source << ": the initialization graph reads the model's value '"
                         << init.captures()[0]->name() << "'; Kiln runs initialization graphs that stand alone";
  KILN_RETURN_IF_ERROR(train::infer_training_types(model));
  init.opsets = model.opsets;
  KILN_ASSIGN_OR_RETURN(std::string bytes, export_onnx_bytes(init));
  CompileOptions o = options;
  o.train.reset();
  auto compiled = Model::compile_bytes(bytes, o, model.source + " (initialization graph)");
  if (!compiled.is_ok()) return compiled.status();
  KILN_ASSIGN_OR_RETURN(auto values, compiled->run({}));
  for (const auto& [name, output] : info.initialization_binding) {
    const Tensor* current = train::training_initializer(model, name);
    const Tensor& v = values.at(output);
    if (current == nullptr || current->dtype() != v.dtype() || current->shape() != v.shape())
      return invalid_argument() << model.source << ": the initialization graph gives '" << name << "' " << v.describe()
                                << (current ? ", not " + current->describe() : std::string());
    out[name] = v;
  }
  return out;
}

Result<int> cmd_train(const std::vector<std::string>& argv) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const Collective> world, start_mpi_if_launched());
  Result<int> r = train_steps(argv, world);
  if (!r.is_ok() && world != nullptr && world->size > 1) {
    std::cerr << "kiln: error (process " << world->rank << " of " << world->size << "): " << r.status().to_string()
              << std::endl;
    abort_mpi_job(2);
  }
  return r;
}

Result<int> train_steps(const std::vector<std::string>& argv, const std::shared_ptr<const Collective>& world) {
  OptionSpec spec;
  spec.with_value = {"data", "lr", "epochs", "threads", "checkpoint", "output", "max-memory", "db", "export-training"};
  spec.with_value.insert(kTrainValueOptions.begin(), kTrainValueOptions.end());
  spec.flags = {"nesterov", "resume", "no-db"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs args, parse_args(argv, spec));
  KILN_ASSIGN_OR_RETURN(std::string path, single_model_argument(args, "train"));
  auto data = args.get("data");
  const std::string export_training = args.get("export-training").value_or("");
  if (!data && export_training.empty())
    return invalid_argument() << "train needs --data DIR (a directory per batch, NAME.npy per input)";
  KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, import_onnx_file(path));
  KILN_ASSIGN_OR_RETURN(TrainOptions t, train_options(args, !graph->training_info.empty()));
  double lr = 0.01;
  if (auto v = args.get("lr")) {
    KILN_ASSIGN_OR_RETURN(lr, parse_tolerance(*v, "--lr"));
  }
  int64_t epochs = 1;
  if (auto v = args.get("epochs")) {
    KILN_ASSIGN_OR_RETURN(epochs, parse_int(*v, "--epochs", 1, 1000000));
  }
  const std::string checkpoint = args.get("checkpoint").value_or("");
  if (args.has("resume") && checkpoint.empty()) return invalid_argument() << "--resume needs --checkpoint FILE";
  // Under mpirun: each process steps on its share of every batch, gradients
  // averaged; process 0 prints, checkpoints and exports.
  const bool parallel = world != nullptr && world->size > 1;
  const bool leader = !parallel || world->rank == 0;
  t.data_parallel = parallel;
  options.train = t;

  // The batches: one directory each, in name order.
  std::vector<std::filesystem::path> batches;
  if (data) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(*data, ec))
      if (entry.is_directory()) batches.push_back(entry.path());
    if (ec) return io_error() << "cannot list --data '" << *data << "': " << ec.message();
    if (batches.empty()) return invalid_argument() << "--data '" << *data << "' holds no batch directory";
    std::sort(batches.begin(), batches.end());
  }

  KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
  // The step's inputs: parameters (the model's initializers), optimizer
  // state, the learning rate and step count, and the data.
  std::map<std::string, Tensor> state;  // parameters and optimizer state
  std::vector<std::string> data_inputs;
  DType dt = DType::kFloat32;
  bool feeds_lr = false, feeds_step = false;
  for (const TensorInfo& info : model.inputs()) {
    if (info.name == train::kLearningRateInput) {
      dt = info.dtype;
      feeds_lr = true;
      continue;
    }
    if (info.name == train::kStepInput && !t.model_algorithm) {
      feeds_step = true;
      continue;
    }
    if (const Tensor* initial = train::training_initializer(*graph, info.name)) {
      state[info.name] = initial->clone();
      continue;
    }
    const std::string& n = info.name;
    bool is_state = false;
    for (const char* suffix : train::kStateSuffixes)
      is_state |= n.size() > std::strlen(suffix) && n.compare(n.size() - std::strlen(suffix), std::string::npos, suffix) == 0;
    if (is_state) {
      std::vector<int64_t> shape;
      for (const std::string& d : info.dims) shape.push_back(std::stoll(d));
      state[n] = Tensor(info.dtype, shape);
      continue;
    }
    data_inputs.push_back(n);
  }
  Checkpoint at;
  if (args.has("resume")) {
    KILN_ASSIGN_OR_RETURN(at, read_checkpoint(checkpoint));
    for (auto& [name, value] : state) {
      auto it = at.tensors.find(name);
      if (it == at.tensors.end() || it->second.dtype() != value.dtype() || it->second.shape() != value.shape())
        return invalid_argument() << "checkpoint '" << checkpoint << "' does not fit this model and optimizer: '" << name
                                  << "' is " << (it == at.tensors.end() ? "missing" : it->second.describe());
      value = it->second;
    }
    if (leader)
      std::cout << "resumed from " << checkpoint << " at epoch " << at.epoch + 1 << ", batch " << at.batch + 1
              << " (step " << at.step + 1 << ")\n";
  } else if (t.model_algorithm && data) {
    // Training starts: the initialization graph's values, where it has one.
    ops::InferContext ictx;
    ictx.graph = graph.get();
    ictx.bounds = graph->bounds;
    KILN_RETURN_IF_ERROR(ops::infer_shapes(*graph, ictx));
    KILN_ASSIGN_OR_RETURN(auto initial, run_initialization(*graph, options));
    for (auto& [name, value] : initial) state[name] = std::move(value);
    // Once run, its values are the state: a training form written later holds them instead.
    graph->training_info[0].initialization.reset();
    graph->training_info[0].initialization_binding.clear();
  }
  std::cout << std::setprecision(9);
  for (int64_t epoch = at.epoch; data && epoch < epochs; ++epoch) {
    for (size_t b = epoch == at.epoch ? static_cast<size_t>(at.batch) : 0; b < batches.size(); ++b) {
      std::map<std::string, Tensor> feeds = state;
      for (const std::string& name : data_inputs) {
        auto file = batches[b] / (name + ".npy");
        auto value = read_npy(file.string());
        if (!value.is_ok()) return value.status().with_context("batch " + batches[b].filename().string());
        if (parallel) {
          KILN_ASSIGN_OR_RETURN(*value, batch_share(*value, *world, file.string()));
        }
        feeds[name] = std::move(*value);
      }
      const int64_t step = at.step + 1;
      Tensor lr_t(dt, {}), step_t(dt, {});
      lr_t.set_f64(0, lr);
      step_t.set_f64(0, static_cast<double>(step));
      if (feeds_lr) feeds[train::kLearningRateInput] = lr_t;
      if (feeds_step) feeds[train::kStepInput] = step_t;
      if (leader)
        progress().show("kiln: train: epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs) +
                        " batch " + std::to_string(b + 1) + "/" + std::to_string(batches.size()));
      KILN_ASSIGN_OR_RETURN(auto out, model.run(feeds));
      for (auto& [name, value] : state) value = out.at(name + ".next");
      at.step = step;
      at.epoch = epoch;
      at.batch = static_cast<int64_t>(b) + 1;
      if (!leader) continue;
      progress().clear();
      std::cout << "epoch " << epoch + 1 << " batch " << b + 1 << " step " << step << " loss "
                << out.at(model.outputs()[0].name).get_f64(0) << std::endl;
    }
    at.epoch = epoch + 1;
    at.batch = 0;
    if (!checkpoint.empty() && leader) {
      at.tensors = state;
      KILN_RETURN_IF_ERROR(write_checkpoint(checkpoint, at));
    }
  }
  if (!leader) return kExitOk;
  // The trained values in the model (and in its training algorithm).
  for (const auto& [name, value] : state) {
    Value* v = graph->find_value(name);
    if (v == nullptr && !graph->training_info.empty()) v = graph->training_info[0].algorithm->find_value(name);
    if (v != nullptr && v->is_constant()) v->set_constant(value);
  }
  ops::InferContext ctx;
  ctx.graph = graph.get();
  ctx.bounds = graph->bounds;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*graph, ctx));
  if (!export_training.empty()) {
    if (t.model_algorithm) {
      KILN_RETURN_IF_ERROR(train::infer_training_types(*graph));
    } else {
      // Kiln's step as ONNX's training algorithm, from the state reached.
      std::map<std::string, Tensor> algorithm_state = state;
      Tensor count(DType::kInt64, {});
      count.data_as<int64_t>()[0] = at.step;
      algorithm_state[train::kIterationsInitializer] = count;
      KILN_RETURN_IF_ERROR(train::attach_training_algorithm(*graph, t, algorithm_state));
    }
    KILN_RETURN_IF_ERROR(export_onnx_file(*graph, export_training));
    std::cout << "wrote " << export_training << " (ONNX training form)\n";
  }
  if (auto out = args.get("output")) {
    // The trained model for inference: the original with the trained values.
    graph->training_info.clear();
    const std::vector<Node*> nodes = graph->nodes();
    if (std::none_of(nodes.begin(), nodes.end(), [](const Node* n) { return n->domain() == train::kTrainingDomain; }))
      graph->opsets.erase(train::kTrainingDomain);
    KILN_RETURN_IF_ERROR(export_onnx_file(*graph, *out));
    std::cout << "wrote " << *out << "\n";
  }
  return kExitOk;
}

Result<int> cmd_profile(const std::vector<std::string>& argv) {
  OptionSpec spec;
  spec.with_value = {"threads", "select", "impl", "runs", "dim", "input", "top", "max-memory", "passes", "db", "output"};
  spec.repeatable = {"dim", "input", "impl"};
  spec.flags = {"naive", "no-db", "tune-missing"};
  KILN_ASSIGN_OR_RETURN(ParsedArgs args, parse_args(argv, spec));
  KILN_ASSIGN_OR_RETURN(std::string path, single_model_argument(args, "profile"));
  std::string trace_path = args.get("output").value_or("");
  KILN_ASSIGN_OR_RETURN(CompileOptions options, compile_options(args));
  int64_t runs = 10, top = 25;
  if (auto r = args.get("runs")) {
    KILN_ASSIGN_OR_RETURN(runs, parse_int(*r, "--runs", 1, 100000));
  }
  if (auto t = args.get("top")) {
    KILN_ASSIGN_OR_RETURN(top, parse_int(*t, "--top", 1, 1000000));
  }
  KILN_ASSIGN_OR_RETURN(Model model, compile_with_progress(path, options));
  KILN_ASSIGN_OR_RETURN(auto inputs, build_inputs(model, args));
  KILN_ASSIGN_OR_RETURN(std::string report, model.profile(inputs, static_cast<int>(runs), trace_path));
  std::istringstream lines(report);
  std::string line;
  for (int64_t i = 0; std::getline(lines, line) && i < top + 2; ++i) std::cout << line << "\n";
  if (!trace_path.empty())
    std::cout << "trace of " << runs << " runs written to " << trace_path
              << " (open it in https://ui.perfetto.dev or chrome://tracing)\n";
  return kExitOk;
}

int main_impl(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return kExitError;
  }
  std::string command = args[0];
  args.erase(args.begin());
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return kExitOk;
  }
  using Command = Result<int> (*)(const std::vector<std::string>&);
  const std::map<std::string, Command> commands = {
      {"info", cmd_info}, {"run", cmd_run}, {"compile", cmd_compile}, {"train", cmd_train}, {"bench", cmd_bench}, {"opt", cmd_opt}, {"ops", cmd_ops}, {"profile", cmd_profile},
      {"db", cmd_db}, {"tune", cmd_tune_command}, {"tune-measure", cmd_tune_measure},
      {"tune-worker", cmd_tune_worker}};
  auto it = commands.find(command);
  if (it != commands.end() && !command_help(command).empty()) {
    for (const std::string& a : args) {
      if (a == "--") break;
      if (a == "--help" || a == "-h") {
        std::cout << command_help(command);
        return kExitOk;
      }
    }
  }
  if (it == commands.end()) {
    std::cerr << "kiln: error: unknown command '" << command << "'\n" << kUsage;
    return kExitError;
  }
  Result<int> result = it->second(args);
  if (!result) {
    progress().clear();
    std::cerr << "kiln: error: " << result.status().to_string() << "\n";
    return kExitError;
  }
  return *result;
}

}  // namespace
}  // namespace kiln::cli

int main(int argc, char** argv) {
  try {
    return kiln::cli::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "kiln: error: unexpected failure\n";
  }
  return 2;
}
