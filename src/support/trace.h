// Timed spans for traces (`kiln profile -o trace.json`): the VM records one
// per instruction on its calling thread, the thread pool one per chunk a
// worker runs of a parallel loop started inside such a span. Nothing is
// recorded unless a recorder is set on the calling thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace kiln::trace {

struct Span {
  int64_t begin_ns = 0, end_ns = 0;  // steady clock
  int32_t thread = 0;                // thread_id() of the thread that ran it
  int32_t label = 0;                 // the recorder owner's label (the VM's instruction index)
  bool worker = false;               // a chunk a pool worker ran for the span labelled `label`
};

// Collects spans from any thread.
class Recorder {
 public:
  void add(const Span& s) {
    std::lock_guard<std::mutex> lock(mu_);
    spans_.push_back(s);
  }
  std::vector<Span> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(spans_);
  }

 private:
  std::mutex mu_;
  std::vector<Span> spans_;
};

// What the calling thread records into (null: nothing) and the label of the
// span it is in; the thread pool hands both to the workers of a loop.
struct Scope {
  Recorder* recorder = nullptr;
  int32_t label = 0;
};
Scope& current();

int64_t now_ns();
// A small number per thread, stable for the thread's life (1, 2, ... in the
// order threads first ask).
int32_t thread_id();

}  // namespace kiln::trace
