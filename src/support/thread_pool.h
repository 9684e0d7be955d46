// A fork-join thread pool: parallel_for splits [0, n) into chunks run by the
// calling thread and spinning workers. Workers spin briefly between jobs, then
// sleep. One pool per thread count is shared process-wide.
//
// Thread safety: parallel_for may be called from any number of threads at
// once. One caller at a time owns the workers; a caller that finds them busy,
// or a parallel loop nested inside a job, runs its loop serially on its own
// thread. The iterations of a parallel loop are independent, so every caller
// gets the same result as a serial run, bit for bit.
#pragma once

#include <cstdint>
#include <functional>

namespace kiln {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  // Calls fn(begin, end, env) on disjoint chunks covering [0, n); returns when all are done.
  void parallel_for(int64_t n, void (*fn)(int64_t, int64_t, void*), void* env);

 private:
  struct Impl;
  Impl* impl_;
  int num_threads_;
};

// The pool used by generated code on this thread (set by the runtime before
// running kernels; null means run serially).
ThreadPool* current_thread_pool();
void set_current_thread_pool(ThreadPool* pool);
// A process-wide pool with `num_threads` threads (created on first use).
ThreadPool* shared_thread_pool(int num_threads);

}  // namespace kiln

// Called by generated code for parallel loops.
extern "C" void kiln_parallel_for(int64_t n, void (*fn)(int64_t, int64_t, void*), void* env);
