#include "support/thread_pool.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "support/trace.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
}  // namespace

// A job is published by storing a new ticket: (epoch << 40) | (back << 20) |
// front, the chunks not yet claimed being [front, back). The caller claims
// chunks from the front, workers from the back, each by a compare-and-swap
// that only succeeds while the ticket still carries the job's epoch, so a
// worker that is late for one job can never run (or count) a chunk of
// another. Claiming from opposite ends keeps, with two threads, the caller on
// the first part of every loop and the worker on the last, so consecutive
// kernels split their data alike and each core mostly reads what it wrote.
// Job fields are atomics because a late worker may read them while the next
// job is being published.
struct ThreadPool::Impl {
  static constexpr int kEpochShift = 40;
  static constexpr int kBackShift = 20;
  static constexpr uint64_t kIndexMask = (uint64_t{1} << kBackShift) - 1;

  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> stop{false};

  std::atomic<uint64_t> ticket{0};
  std::atomic<void (*)(int64_t, int64_t, void*)> fn{nullptr};
  std::atomic<void*> env{nullptr};
  std::atomic<int64_t> n{0};
  std::atomic<int64_t> chunk{1};
  std::atomic<int64_t> done{0};
  // The caller's trace scope (support/trace.h): workers record their chunks into it.
  std::atomic<trace::Recorder*> trace_recorder{nullptr};
  std::atomic<int32_t> trace_label{0};

  // Held by the caller that owns the workers for one job. Callers that find
  // the pool busy run their loop serially instead of waiting (see parallel_for).
  std::mutex job_mu;

  void run_chunks(uint64_t epoch, bool from_back) {
    for (;;) {
      uint64_t t = ticket.load(std::memory_order_acquire);
      if ((t >> kEpochShift) != epoch) return;
      auto f = fn.load(std::memory_order_relaxed);
      void* e = env.load(std::memory_order_relaxed);
      int64_t total = n.load(std::memory_order_relaxed);
      int64_t size = chunk.load(std::memory_order_relaxed);
      int64_t front = static_cast<int64_t>(t & kIndexMask);
      int64_t back = static_cast<int64_t>((t >> kBackShift) & kIndexMask);
      if (front >= back) return;
      int64_t c = from_back ? back - 1 : front;
      uint64_t next = from_back ? t - (uint64_t{1} << kBackShift) : t + 1;
      if (!ticket.compare_exchange_weak(t, next, std::memory_order_acq_rel)) continue;
      int64_t b = c * size;
      int64_t end = b + size < total ? b + size : total;
      trace::Recorder* rec = from_back ? trace_recorder.load(std::memory_order_relaxed) : nullptr;
      if (rec != nullptr) {
        trace::Span span;
        span.begin_ns = trace::now_ns();
        f(b, end, e);
        span.end_ns = trace::now_ns();
        span.thread = trace::thread_id();
        span.label = trace_label.load(std::memory_order_relaxed);
        span.worker = true;
        rec->add(span);
      } else {
        f(b, end, e);
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      int spins = 0;
      uint64_t epoch;
      while ((epoch = ticket.load(std::memory_order_acquire) >> kEpochShift) == seen) {
        if (stop.load(std::memory_order_relaxed)) return;
        if (++spins < 20000) {
          cpu_relax();
        } else {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return (ticket.load() >> kEpochShift) != seen || stop.load(); });
        }
      }
      if (stop.load()) return;
      seen = epoch;
      run_chunks(epoch, true);
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : impl_(new Impl), num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int i = 1; i < num_threads_; ++i) impl_->workers.emplace_back([this] { impl_->worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop.store(true);
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
  delete impl_;
}

namespace {
// True on a thread while it runs chunks of a job (the caller's own share): a
// nested parallel loop then runs serially instead of re-entering the pool.
thread_local bool t_in_job = false;
}  // namespace

void ThreadPool::parallel_for(int64_t n, void (*fn)(int64_t, int64_t, void*), void* env) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1 || t_in_job) {
    fn(0, n, env);
    return;
  }
  Impl& s = *impl_;
  // One job at a time owns the workers. Pools are shared by every model with
  // the same thread count, so another caller may hold it: rather than wait,
  // run the loop serially on this thread. Chunks of a parallel loop are
  // independent iterations, so the result is the same bit for bit.
  std::unique_lock<std::mutex> job(s.job_mu, std::try_to_lock);
  if (!job.owns_lock()) {
    fn(0, n, env);
    return;
  }
  t_in_job = true;
  // A few chunks per thread balances uneven chunks without much overhead.
  int64_t target = static_cast<int64_t>(num_threads_) * 4;
  int64_t chunk = (n + target - 1) / target;
  int64_t count = (n + chunk - 1) / chunk;
  s.fn.store(fn, std::memory_order_relaxed);
  s.env.store(env, std::memory_order_relaxed);
  s.n.store(n, std::memory_order_relaxed);
  s.chunk.store(chunk, std::memory_order_relaxed);
  s.done.store(0, std::memory_order_relaxed);
  const trace::Scope& scope = trace::current();
  s.trace_recorder.store(scope.recorder, std::memory_order_relaxed);
  s.trace_label.store(scope.label, std::memory_order_relaxed);
  uint64_t epoch = (s.ticket.load(std::memory_order_relaxed) >> Impl::kEpochShift) + 1;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.ticket.store((epoch << Impl::kEpochShift) | (static_cast<uint64_t>(count) << Impl::kBackShift),
                   std::memory_order_release);
  }
  s.cv.notify_all();
  s.run_chunks(epoch, false);
  while (s.done.load(std::memory_order_acquire) < count) cpu_relax();
  // Close the job: a late worker's compare-and-swap on the old ticket fails,
  // so it cannot claim a chunk while the next job's fields are written.
  s.ticket.store(epoch << Impl::kEpochShift, std::memory_order_release);  // front 0 >= back 0: nothing left
  t_in_job = false;
}

namespace {
thread_local ThreadPool* t_current_pool = nullptr;
}

ThreadPool* current_thread_pool() { return t_current_pool; }
void set_current_thread_pool(ThreadPool* pool) { t_current_pool = pool; }

ThreadPool* shared_thread_pool(int num_threads) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = pools[num_threads];
  if (!p) p = std::make_unique<ThreadPool>(num_threads);
  return p.get();
}

}  // namespace kiln

extern "C" void kiln_parallel_for(int64_t n, void (*fn)(int64_t, int64_t, void*), void* env) {
  kiln::ThreadPool* pool = kiln::current_thread_pool();
  if (pool == nullptr) {
    fn(0, n, env);
    return;
  }
  pool->parallel_for(n, fn, env);
}
