// Execution policies: how the attention engine spreads its tasks over threads.
//
// A policy is any type that satisfies ExecutionPolicy:
//   int workers() const;                          // how many workers may run at once
//   template <class F> void parallel_for(index_t n, F&& f);  // f(task, worker) for every task
// where `worker` is in [0, workers()) and no two concurrent calls of f share a
// worker id, so per-worker scratch indexed by it needs no locking. The engine
// sizes that scratch from workers() before it calls parallel_for, and never
// allocates inside f.
//
// Serial runs everything on the calling thread. ThreadPool keeps workers()-1
// std::jthreads parked between calls; the caller is worker 0 and works too.
// Tasks are claimed dynamically (an atomic counter), so uneven tasks (causal
// q-tiles, ragged segments) balance themselves. OpenMP is offered when the
// translation unit is compiled with -fopenmp.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/tensor.hpp"

namespace seqattn {
namespace detail {
// Stands for any task an engine hands to parallel_for.
struct TaskArchetype {
  void operator()(index_t, int) const {}
};
}  // namespace detail

template <class E>
concept ExecutionPolicy = requires(std::remove_reference_t<E>& e, index_t n, detail::TaskArchetype f) {
  { e.workers() } -> std::convertible_to<int>;
  e.parallel_for(n, f);
};

}  // namespace seqattn

namespace seqattn::execution {

// Runs every task in order on the calling thread.
struct Serial {
  int workers() const { return 1; }
  template <class F>
  void parallel_for(index_t n, F&& f) const {
    for (index_t i = 0; i < n; ++i) f(i, 0);
  }
};

// A fixed set of threads reused across calls. Not reentrant: a task must not
// call parallel_for on the pool that runs it. Concurrent calls from different
// threads are serialized.
class ThreadPool {
 public:
  // `threads` counts the calling thread: ThreadPool(2) starts one helper.
  // At most limits::kMaxThreads. When a helper cannot be started (EAGAIN) the
  // constructor stops and joins the helpers already running, then rethrows
  // (std::system_error): nothing is left running.
  explicit ThreadPool(int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u,
                                                                static_cast<unsigned>(limits::kMaxThreads))))
      : workers_(threads) {
    detail::require(threads >= 1, "ThreadPool: threads must be at least 1, got ", threads);
    detail::require(threads <= limits::kMaxThreads, "ThreadPool: threads must be at most ", limits::kMaxThreads,
                    " (limits::kMaxThreads), got ", threads);
    helpers_.reserve(static_cast<std::size_t>(threads - 1));
    try {
      for (int w = 1; w < threads; ++w) {
        helpers_.emplace_back([this, w](std::stop_token stop) { helper_loop(stop, w); });
      }
    } catch (...) {
      stop_helpers();
      helpers_.clear();  // joins them
      throw;
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() { stop_helpers(); }

  int workers() const { return workers_; }

  template <class F>
  void parallel_for(index_t n, F&& f) {
    if (n <= 0) return;
    if (workers_ == 1 || n == 1) {
      for (index_t i = 0; i < n; ++i) f(i, 0);
      return;
    }
    std::lock_guard call_lock(call_mutex_);
    using Fn = std::remove_reference_t<F>;
    job_ = Job{const_cast<void*>(static_cast<const void*>(&f)),
               [](void* fn, index_t task, int worker) { (*static_cast<Fn*>(fn))(task, worker); }, n};
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    {
      std::lock_guard lock(mutex_);
      busy_ = workers_ - 1;
      ++epoch_;
    }
    wake_.notify_all();
    run_tasks(0);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Job {
    void* fn = nullptr;
    void (*invoke)(void*, index_t, int) = nullptr;
    index_t tasks = 0;
  };

  void run_tasks(int worker) {
    for (index_t i = next_.fetch_add(1, std::memory_order_relaxed); i < job_.tasks;
         i = next_.fetch_add(1, std::memory_order_relaxed)) {
      try {
        job_.invoke(job_.fn, i, worker);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  // Asks every helper to stop and wakes the parked ones; joining is left to
  // the jthreads' destructors.
  void stop_helpers() {
    for (auto& t : helpers_) t.request_stop();
    {
      std::lock_guard lock(mutex_);
      ++epoch_;  // wake helpers so they see the stop request
    }
    wake_.notify_all();
  }

  void helper_loop(const std::stop_token& stop, int worker) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return epoch_ != seen; });
        seen = epoch_;
      }
      if (stop.stop_requested()) return;
      run_tasks(worker);
      std::lock_guard lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  int workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::uint64_t epoch_ = 0;
  int busy_ = 0;
  Job job_;
  std::atomic<index_t> next_{0};
  std::exception_ptr error_;
  std::vector<std::jthread> helpers_;  // last member: joined before the rest is destroyed
};

#if defined(_OPENMP)
// OpenMP's own pool; dynamic schedule for uneven tasks.
struct OpenMP {
  int workers() const { return omp_get_max_threads(); }
  template <class F>
  void parallel_for(index_t n, F&& f) const {
#pragma omp parallel for schedule(dynamic, 1)
    for (index_t i = 0; i < n; ++i) f(i, omp_get_thread_num());
  }
};
#endif

}  // namespace seqattn::execution
