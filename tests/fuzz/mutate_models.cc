// Structured mutation of seed models, each mutant compiled and run once in a
// child process, so that any build (release or sanitized) can count and keep
// what crashes, aborts or hangs:
//
//   mutate_models [--count N] [--seed S] [--timeout SECONDS] [--jobs J]
//                 [--artifacts DIR] [--log FILE] [--replay] SEED_DIR_OR_FILE...
//
// --replay runs every seed once as it is (no mutation): the regression
// inputs in tests/fuzz/regressions/model_fuzzer/ (ctest label `error`).
//
// Seeds: every *.onnx under the given directories (the ONNX backend suite's
// node models: scripts/make_fuzz_seeds.py). Mutant i applies one (a quarter of
// the time two) (tests/fuzz/model_mutator.h) to a seed model drawn with the
// random seed S + i, so one command reproduces one mutant. A child that
// exits cleanly (compiled and ran, or gave an error) is fine; one killed by a
// signal, or still running after the timeout, is a failure: its model is kept
// as DIR/<kind>-<i>.onnx with the first lines of its output in <kind>-<i>.txt.
// Prints the count per outcome; exits 1 when anything failed.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model_mutator.h"

namespace fs = std::filesystem;

namespace {

struct Child {
  pid_t pid = -1;
  size_t index = 0;
  int out_fd = -1;
  std::string output;
  std::string what;
  std::string bytes;
  std::chrono::steady_clock::time_point start;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The kind of failure from a child's status and output: "abort" with the
// checked condition's file:line when KILN_CHECK printed one.
std::string failure_kind(int status, bool timed_out, const std::string& output) {
  if (timed_out) return "hang";
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? "" : "exit" + std::to_string(WEXITSTATUS(status));
  int sig = WTERMSIG(status);
  switch (sig) {
    case SIGSEGV: return "segv";
    case SIGBUS: return "bus";
    case SIGFPE: return "fpe";
    case SIGILL: return "ill";
    case SIGKILL: return "killed";
    case SIGABRT: return output.find("KILN_CHECK") != std::string::npos || output.find("Check failed") != std::string::npos
                             ? "check"
                             : "abort";
    default: return "signal" + std::to_string(sig);
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t count = 1000;
  uint32_t seed = 1;
  int timeout = 20, jobs = 1;
  fs::path artifacts = "mutate_artifacts";
  std::string log_path;  // every mutant's mutations and first line of output
  bool replay = false;
  std::vector<fs::path> seed_paths;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "mutate_models: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--count") count = std::stoul(value());
    else if (a == "--seed") seed = static_cast<uint32_t>(std::stoul(value()));
    else if (a == "--timeout") timeout = std::stoi(value());
    else if (a == "--jobs") jobs = std::max(1, std::stoi(value()));
    else if (a == "--artifacts") artifacts = value();
    else if (a == "--log") log_path = value();
    else if (a == "--replay") replay = true;
    else if (!a.empty() && a[0] == '-') {
      std::cerr << "mutate_models: unknown option " << a << "\n";
      return 2;
    } else {
      seed_paths.push_back(a);
    }
  }
  std::vector<fs::path> seeds;
  for (const fs::path& p : seed_paths) {
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file() && e.path().extension() == ".onnx") seeds.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      seeds.push_back(p);
    }
  }
  std::sort(seeds.begin(), seeds.end());
  if (seeds.empty()) {
    std::cerr << "mutate_models: no seed models (*.onnx) given\n";
    return 2;
  }
  if (replay) count = seeds.size();
  fs::create_directories(artifacts);

  std::map<std::string, size_t> outcomes;
  std::ofstream log;
  if (!log_path.empty()) log.open(log_path);
  std::vector<Child> running;
  size_t next = 0, failures = 0;
  auto start_one = [&]() {
    Child c;
    c.index = next++;
    uint32_t mseed = seed + static_cast<uint32_t>(c.index);
    const fs::path& s = replay ? seeds[c.index] : seeds[std::mt19937(mseed)() % seeds.size()];
    std::string bytes = read_file(s);
    int rounds = replay ? 0 : mseed % 4 == 0 ? 2 : 1;
    c.what = s.parent_path().filename().string() + "/" + s.filename().string() + ":";
    for (int r = 0; r < rounds; ++r) {
      std::string what;
      bytes = kiln::fuzz::mutate_model(bytes, mseed * 7919u + static_cast<uint32_t>(r), 1 << 20, &what);
      c.what += " " + what + ";";
    }
    c.bytes = bytes;
    int fds[2];
    if (pipe(fds) != 0) std::exit(3);
    c.start = std::chrono::steady_clock::now();
    std::cout.flush();
    std::fflush(nullptr);  // a child must not inherit (and print) buffered output
    c.pid = fork();
    if (c.pid == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      alarm(static_cast<unsigned>(timeout) + 5);
      std::string err = kiln::fuzz::compile_and_run(bytes, "mutant.onnx");
      std::printf("%s\n", err.empty() ? "ok" : err.c_str());
      std::fflush(stdout);
      _exit(0);
    }
    close(fds[1]);
    c.out_fd = fds[0];
    fcntl(c.out_fd, F_SETFL, O_NONBLOCK);
    running.push_back(std::move(c));
  };
  auto drain = [](Child& c) {
    char buf[4096];
    ssize_t n;
    while ((n = read(c.out_fd, buf, sizeof buf)) > 0)
      if (c.output.size() < 65536) c.output.append(buf, static_cast<size_t>(n));
  };

  while (next < count || !running.empty()) {
    while (next < count && static_cast<int>(running.size()) < jobs) start_one();
    bool progressed = false;
    for (size_t k = 0; k < running.size();) {
      Child& c = running[k];
      drain(c);
      int status = 0;
      pid_t r = waitpid(c.pid, &status, WNOHANG);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
      bool timed_out = false;
      if (r == 0 && secs > timeout) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        timed_out = true;
        r = c.pid;
      }
      if (r == 0) {
        ++k;
        continue;
      }
      drain(c);
      close(c.out_fd);
      progressed = true;
      std::string kind = failure_kind(status, timed_out, c.output);
      bool error = !kind.empty() ? false : c.output.rfind("ok", 0) != 0;
      outcomes[kind.empty() ? (error ? "error" : "ok") : kind]++;
      if (log.is_open())
        log << c.index << "\t" << (kind.empty() ? (error ? "error" : "ok") : kind) << "\t" << c.what << "\t"
            << c.output.substr(0, c.output.find('\n')) << "\n";
      if (!kind.empty()) {
        ++failures;
        std::string base = kind + "-" + std::to_string(c.index);
        std::ofstream(artifacts / (base + ".onnx"), std::ios::binary) << c.bytes;
        std::ofstream(artifacts / (base + ".txt")) << c.what << "\n" << c.output.substr(0, 4000);
        std::string first = c.output.substr(0, c.output.find('\n', c.output.find_first_not_of('\n')));
        std::cout << kind << " #" << c.index << " " << c.what << "\n    " << first.substr(0, 300) << "\n";
      }
      running.erase(running.begin() + static_cast<long>(k));
    }
    if (!progressed) usleep(2000);
  }
  std::cout << "mutants: " << count << " (seeds: " << seeds.size() << ", --seed " << seed << ")";
  for (const auto& [k, v] : outcomes) std::cout << "; " << k << " " << v;
  std::cout << "; failures " << failures << " (" << (100.0 * static_cast<double>(failures) / static_cast<double>(count))
            << "%)\n";
  return failures ? 1 : 0;
}
