#include "tune/measure.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "driver/compile.h"
#include "ops/registry.h"
#include "runtime/vm.h"
#include "strategy/strategy.h"
#include "partition/partition.h"
#include "tune/features.h"
#include "tune/tune.h"

extern char** environ;

namespace kiln::tune {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char e = s[++i];
    out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

Tensor random_tensor(const TensorType& t, uint32_t seed) {
  std::vector<int64_t> dims;
  for (const Expr& d : *t.shape) dims.push_back(*d.as_const());
  Tensor x(t.dtype, dims);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.set_f64(i, dist(rng));
  return x;
}

struct Request {
  int threads = 1;
  double min_seconds = 0.2;
  int min_repeats = 5, max_repeats = 200;
  bool check = true;
  int64_t flush_bytes = 0;  // 0: no eviction between runs
  bool interleave = false;  // time the trials round by round (MeasureOptions::interleave)
  size_t anchor = 0;
  std::vector<Trial> trials;
  std::string graph;
};

std::string request_text(const Request& r) {
  std::ostringstream os;
  os.precision(17);
  os << "kiln-measure 1\nthreads " << r.threads << "\nmin_seconds " << r.min_seconds << "\nmin_repeats "
     << r.min_repeats << "\nmax_repeats " << r.max_repeats << "\ncheck " << (r.check ? 1 : 0) << "\nflush_bytes "
     << r.flush_bytes << "\ninterleave " << (r.interleave ? 1 : 0) << "\nanchor "
     << r.anchor << "\ntrials " << r.trials.size() << "\n";
  for (const Trial& t : r.trials) os << "trial " << (t.candidate.empty() ? "-" : t.candidate) << "\t" << t.knobs << "\n";
  os << "graph\n" << r.graph;
  return os.str();
}

Result<Request> parse_request(const std::string& text) {
  Request r;
  std::istringstream is(text);
  std::string line;
  if (!std::getline(is, line) || line != "kiln-measure 1") return invalid_argument() << "not a measurement request";
  size_t ntrials = 0;
  while (std::getline(is, line)) {
    if (line == "graph") {
      std::ostringstream rest;
      rest << is.rdbuf();
      r.graph = rest.str();
      break;
    }
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "threads") ls >> r.threads;
    else if (key == "min_seconds") ls >> r.min_seconds;
    else if (key == "min_repeats") ls >> r.min_repeats;
    else if (key == "max_repeats") ls >> r.max_repeats;
    else if (key == "check") { int c = 1; ls >> c; r.check = c != 0; }
    else if (key == "flush_bytes") ls >> r.flush_bytes;
    else if (key == "interleave") { int v = 0; ls >> v; r.interleave = v != 0; }
    else if (key == "anchor") ls >> r.anchor;
    else if (key == "trials") ls >> ntrials;
    else if (key == "trial") {
      std::string rest = line.substr(6);
      size_t tab = rest.find('\t');
      Trial t;
      t.candidate = rest.substr(0, tab);
      if (t.candidate == "-") t.candidate.clear();
      t.knobs = tab == std::string::npos ? "" : rest.substr(tab + 1);
      r.trials.push_back(t);
    } else {
      return invalid_argument() << "measurement request: unknown line '" << line << "'";
    }
  }
  if (r.trials.size() != ntrials || r.graph.empty()) return invalid_argument() << "measurement request is incomplete";
  return r;
}

// Largest |a - b| over every output, and the largest |b| (the reference's scale).
std::pair<double, double> compare(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].numel() != b[i].numel()) return {INFINITY, 0};
    for (int64_t k = 0; k < a[i].numel(); ++k) {
      double x = a[i].get_f64(k), y = b[i].get_f64(k);
      err = std::max(err, std::isnan(x) != std::isnan(y) ? INFINITY : std::fabs(x - y));
      scale = std::max(scale, std::fabs(y));
    }
  }
  return {err, scale};
}

void apply_fault(const Trial& t) {
  const char* f = std::getenv("KILN_TUNE_FAULT");
  if (f == nullptr) return;
  std::string spec(f);
  if (spec == "crash:" + t.knobs) std::abort();
  if (spec == "hang:" + t.knobs)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Writes every cache line of a buffer of `bytes` (evicting what the caches
// held), then reads every line of `inputs` back into them.
void evict_caches(int64_t bytes, const std::vector<Tensor>& inputs) {
  static std::vector<unsigned char> scratch;
  if (static_cast<int64_t>(scratch.size()) != bytes) scratch.assign(static_cast<size_t>(bytes), 0);
  for (size_t i = 0; i < scratch.size(); i += 64) scratch[i] = static_cast<unsigned char>(scratch[i] + 1);
  unsigned sum = 0;
  for (const Tensor& t : inputs) {
    const unsigned char* p = static_cast<const unsigned char*>(t.data());
    for (int64_t i = 0; i < t.nbytes(); i += 64) sum += p[i];
  }
  static volatile unsigned sink;
  sink = sum;
}

// A trial compiled and checked, ready to time.
struct Prepared {
  std::unique_ptr<driver::CompiledProgram> program;
  std::unique_ptr<runtime::VM> vm;
  TrialResult result;  // ok: checked (error set otherwise); schedule and features filled
  bool slow = false;   // KILN_TUNE_FAULT=slow:KNOBS names it: each timed run takes 2 ms more
};

Result<Prepared> prepare_trial(const Request& r, const Graph& base, const Trial& t, const std::vector<Tensor>& feeds,
                               const std::vector<Tensor>* reference) {
  apply_fault(t);
  SymbolBounds bounds;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, trial_graph(base, r.anchor, &t, &bounds));
  CompileOptions o;
  o.threads = r.threads;
  KILN_ASSIGN_OR_RETURN(driver::CompiledProgram compiled, driver::compile_chosen(*g, bounds, o));
  Prepared p;
  const char* fault = std::getenv("KILN_TUNE_FAULT");
  p.slow = fault != nullptr && std::string(fault) == "slow:" + t.knobs;
  p.program = std::make_unique<driver::CompiledProgram>(std::move(compiled));
  p.vm = std::make_unique<runtime::VM>(p.program->program, r.threads);
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> out, p.vm->run(feeds));  // also the warm-up run
  if (reference) {
    auto [err, scale] = compare(out, *reference);
    if (!(err <= 1e-4 + 1e-3 * scale)) {
      std::ostringstream os;
      os << "wrong results: largest difference " << err << " from the naive schedules' (outputs up to " << scale << ")";
      p.result.error = os.str();
      return p;
    }
  }
  for (const driver::KernelChoiceInfo& k : p.program->kernel_choices)
    if (k.impl == (t.candidate.empty() ? "default" : t.candidate)) p.result.schedule = k.schedule;
  if (auto f = trial_features(base, r.anchor, t, r.threads); f.is_ok()) p.result.features = std::move(*f);
  p.result.ok = true;
  return p;
}

// One timed run (after an eviction where the request asks for one): seconds.
Result<double> time_run(const Request& r, Prepared& p, const std::vector<Tensor>& feeds) {
  if (r.flush_bytes > 0) evict_caches(r.flush_bytes, feeds);
  auto t0 = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(p.vm->run(feeds).status());
  if (p.slow) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Repeats until both the minimum count and the minimum time (evictions
// included where there are any) are reached.
Status time_alone(const Request& r, Prepared& p, const std::vector<Tensor>& feeds) {
  double total = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<double>& lat = p.result.latencies_s;
  while (static_cast<int>(lat.size()) < r.max_repeats &&
         (static_cast<int>(lat.size()) < r.min_repeats || total < r.min_seconds)) {
    KILN_ASSIGN_OR_RETURN(double s, time_run(r, p, feeds));
    lat.push_back(s);
    total = r.flush_bytes > 0 ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                              : total + s;
  }
  return Status::ok();
}

// Every prepared trial timed once per round, the order rotated each round, so
// that a slow phase of the machine falls on all of them alike; rounds go on
// until each trial has its minimum count and the rounds' time reaches the
// minimum time per trial. A trial whose run fails is failed and dropped.
void time_interleaved(const Request& r, std::vector<Prepared*> ps, const std::vector<Tensor>& feeds) {
  const size_t n = ps.size();
  const auto start = std::chrono::steady_clock::now();
  double timed = 0;
  for (int round = 0; round < r.max_repeats && !ps.empty(); ++round) {
    const double spent = r.flush_bytes > 0
                             ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                             : timed;
    if (round >= r.min_repeats && spent >= r.min_seconds * static_cast<double>(n)) break;
    std::vector<Prepared*> order(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) order[i] = ps[(i + static_cast<size_t>(round)) % ps.size()];
    for (Prepared* p : order) {
      Result<double> s = time_run(r, *p, feeds);
      if (!s.is_ok()) {
        p->result.ok = false;
        p->result.error = s.status().to_string();
        p->result.latencies_s.clear();
        ps.erase(std::find(ps.begin(), ps.end(), p));
        continue;
      }
      p->result.latencies_s.push_back(*s);
      timed += *s;
    }
  }
}

std::string result_line(const Result<Prepared>& p) {
  if (!p.is_ok()) return "fail\t" + escape(p.status().to_string());
  const TrialResult& res = p->result;
  if (!res.ok) return "fail\t" + escape(res.error);
  std::ostringstream os;
  os.precision(9);
  os << "ok\t";
  for (size_t i = 0; i < res.latencies_s.size(); ++i) os << (i ? " " : "") << res.latencies_s[i];
  os << "\t" << escape(res.schedule) << "\t";
  for (size_t i = 0; i < res.features.size(); ++i) os << (i ? " " : "") << res.features[i];
  return os.str();
}

}  // namespace

double TrialResult::median_s() const { return median_of(latencies_s); }

int measure_worker_main(const std::string& request_path, const std::string& results_path) {
  std::ifstream in(request_path);
  std::ostringstream text;
  text << in.rdbuf();
  auto r = parse_request(text.str());
  std::ofstream out(results_path, std::ios::app);
  if (!r.is_ok() || !out) {
    std::fprintf(stderr, "kiln tune-measure: %s\n", r.is_ok() ? "cannot write results" : r.status().to_string().c_str());
    return 2;
  }
  // Inputs and the reference outputs, once.
  SymbolBounds bounds;
  auto parsed = parse_graph(r->graph);
  Result<std::unique_ptr<Graph>> base = parsed.is_ok() ? trial_graph(**parsed, r->anchor, nullptr, &bounds)
                                                      : Result<std::unique_ptr<Graph>>(parsed.status());
  std::vector<Tensor> feeds, reference;
  std::string setup_error;
  if (!base.is_ok()) {
    setup_error = base.status().to_string();
  } else {
    uint32_t seed = 1;
    for (const Value* v : (*base)->inputs())
      if (!v->is_constant()) feeds.push_back(random_tensor(v->type(), seed++));
    if (r->check) {
      CompileOptions naive;
      naive.naive = true;
      naive.threads = 1;
      auto p = driver::compile_chosen(**base, bounds, naive);
      if (!p.is_ok()) {
        setup_error = "the naive reference: " + p.status().to_string();
      } else {
        runtime::VM vm(p->program, 1);
        auto ref = vm.run(feeds);
        if (ref.is_ok()) reference = std::move(*ref);
        else setup_error = "the naive reference: " + ref.status().to_string();
      }
    }
  }
  if (!setup_error.empty()) {
    for (size_t i = 0; i < r->trials.size(); ++i) out << "fail\t" << escape(kGroupUnmeasurable + setup_error) << "\n";
    out.flush();
    return 0;
  }
  const std::vector<Tensor>* ref = r->check ? &reference : nullptr;
  if (!r->interleave) {
    for (const Trial& t : r->trials) {
      Result<Prepared> p = prepare_trial(*r, **base, t, feeds, ref);
      if (p.is_ok() && p->result.ok)
        if (Status st = time_alone(*r, *p, feeds); !st.is_ok()) p = st;
      out << result_line(p) << "\n";
      out.flush();
    }
    return 0;
  }
  // Interleaved: every trial compiled and checked first, then timed in
  // rounds; the lines are written at the end, in the trials' order.
  std::vector<Result<Prepared>> ps;
  std::vector<Prepared*> timed;
  for (const Trial& t : r->trials) ps.push_back(prepare_trial(*r, **base, t, feeds, ref));
  for (Result<Prepared>& p : ps)
    if (p.is_ok() && p->result.ok) timed.push_back(&*p);
  time_interleaved(*r, timed, feeds);
  for (const Result<Prepared>& p : ps) out << result_line(p) << "\n";
  out.flush();
  return 0;
}

int64_t full_flush_bytes() {
  const int64_t llc = TargetKey::host(Target::host()).l3_bytes;
  return 2 * (llc > 0 ? llc : int64_t{32} << 20);
}

Result<std::vector<TrialResult>> measure_trials(const Graph& group, size_t anchor_index, const std::vector<Trial>& trials,
                                                const MeasureOptions& options) {
  namespace fs = std::filesystem;
  if (options.worker.empty()) return invalid_argument() << "measurement needs the kiln binary to run trials in";
  std::string dir = (fs::temp_directory_path() / "kiln_measure_XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return io_error() << "cannot make a directory for measurement";
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  Request base;
  base.threads = options.threads;
  base.min_seconds = options.min_seconds;
  base.min_repeats = options.min_repeats;
  base.max_repeats = options.max_repeats;
  base.check = options.check;
  base.interleave = options.interleave && trials.size() > 1;
  if (options.flush) {
    base.flush_bytes = options.flush_bytes > 0 ? options.flush_bytes : full_flush_bytes();
  }
  base.anchor = anchor_index;
  PrintOptions po;
  po.max_constant_elements = -1;
  base.graph = print_graph(group, po);
  std::vector<TrialResult> results(trials.size());
  size_t next = 0;
  const std::string req_path = dir + "/request", out_path = dir + "/results";
  while (next < trials.size()) {
    Request r = base;
    r.trials.assign(trials.begin() + static_cast<long>(next), trials.end());
    {
      std::ofstream f(req_path, std::ios::trunc);
      f << request_text(r);
      if (!f) return io_error() << req_path << ": cannot be written";
    }
    std::ofstream(out_path, std::ios::trunc).close();
    std::vector<std::string> args = {options.worker, "tune-measure", req_path, out_path};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, options.worker.c_str(), nullptr, nullptr, argv.data(), environ) != 0)
      return io_error() << "cannot run " << options.worker;
    size_t lines_seen = 0;
    auto last_progress = std::chrono::steady_clock::now();
    int status = 0;
    bool timed_out = false;
    std::vector<std::string> lines;
    auto read_lines = [&] {
      lines.clear();
      std::ifstream f(out_path);
      std::string l;
      while (std::getline(f, l)) lines.push_back(l);
      // A line is complete once the next has begun or the child is gone; the
      // child writes each line whole and flushes it.
    };
    for (;;) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      read_lines();
      if (lines.size() > lines_seen) {
        lines_seen = lines.size();
        last_progress = std::chrono::steady_clock::now();
      }
      // An interleaved child writes its lines at the end: the limit is per trial.
      const double limit = options.timeout_s * (r.interleave ? static_cast<double>(r.trials.size()) : 1.0);
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_progress).count() > limit) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    read_lines();
    size_t done = std::min(lines.size(), trials.size() - next);
    for (size_t i = 0; i < done; ++i) {
      std::vector<std::string> f = split(lines[i], '\t');
      TrialResult& res = results[next + i];
      if (!f.empty() && f[0] == "ok" && f.size() >= 2) {
        std::istringstream ls(f[1]);
        double x = 0;
        while (ls >> x) res.latencies_s.push_back(x);
        res.schedule = f.size() >= 3 ? unescape(f[2]) : "";
        if (f.size() >= 4) {
          std::istringstream fs(f[3]);
          float v = 0;
          while (fs >> v) res.features.push_back(v);
        }
        res.ok = !res.latencies_s.empty();
        if (!res.ok) res.error = "no timings";
      } else {
        res.error = f.size() >= 2 ? unescape(f[1]) : "unreadable result";
      }
    }
    next += done;
    if (next < trials.size() && !timed_out && WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) {
      // Ctrl-C reached the child too (its process group): the user is
      // stopping, so the trials left are not measured.
      for (; next < trials.size(); ++next) results[next].error = "interrupted";
      break;
    }
    if (base.interleave && next < trials.size()) {
      // An interleaved child writes every line at the end: which trial took
      // it down is unknown, so the rest are measured one by one, where a
      // crash or hang is the trial's own.
      base.interleave = false;
      continue;
    }
    if (next < trials.size() && (timed_out || !(WIFEXITED(status) && WEXITSTATUS(status) == 0))) {
      // The trial in progress took the child down.
      std::ostringstream why;
      if (timed_out) why << "timed out (no result in " << options.timeout_s << " s)";
      else if (WIFSIGNALED(status)) why << "crashed (signal " << WTERMSIG(status) << ")";
      else why << "the measuring process exited with " << WEXITSTATUS(status);
      results[next].error = why.str();
      ++next;
    } else if (next < trials.size()) {
      return internal_error() << "the measuring process ended after " << done << " of " << r.trials.size() << " trials";
    }
  }
  return results;
}

}  // namespace kiln::tune
