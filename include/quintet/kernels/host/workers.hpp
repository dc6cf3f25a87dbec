// host_workers: the threads a host execution context with more than one thread lends its kernels
// besides the caller's. run(parts, task) runs task(0) on the caller and task(1 .. parts - 1) on the
// workers, and returns once every part is done, rethrowing the exception of the lowest part that
// threw (what a loop over the parts in order would have met first). Workers sleep on a condition
// variable between runs (no spinning: on a machine whose every core is busy a spinning worker
// takes the core from the thread that has work), so a run costs a wake-up, a few microseconds;
// kernels use it for loops of at least tens of microseconds.
#pragma once

#include <quintet/core/error.hpp>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace quintet::kernels::host_impl {

class host_workers {
 public:
  explicit host_workers(int workers) {
    QUINTET_CHECK(workers >= 1, "host_workers: {} worker threads, need at least 1", workers);
    threads_.reserve(static_cast<std::size_t>(workers));
    for (int w = 1; w <= workers; ++w) threads_.emplace_back([this, w] { serve(w); });
  }
  host_workers(const host_workers&) = delete;
  host_workers& operator=(const host_workers&) = delete;
  ~host_workers() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

  int workers() const { return static_cast<int>(threads_.size()); }

  // Callers from different threads take turns: one run at a time. A task must not run this pool
  // again (it would wait for itself).
  void run(int parts, const std::function<void(int)>& task) {
    QUINTET_CHECK(parts >= 1 && parts <= workers() + 1,
                  "host_workers: {} parts for the caller and {} workers", parts, workers());
    const std::lock_guard turn(run_mutex_);
    {
      const std::lock_guard lock(mutex_);
      task_ = &task;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      error_part_ = parts;
      ++generation_;
    }
    if (parts > 1) wake_.notify_all();
    std::exception_ptr caller_error;
    try {
      task(0);
    } catch (...) {
      caller_error = std::current_exception();
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    if (caller_error) std::rethrow_exception(caller_error);  // part 0: the lowest
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void serve(int part) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (part >= parts_) continue;  // this run has fewer parts than workers
      const std::function<void(int)>* task = task_;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*task)(part);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && part < error_part_) {
        error_ = error;
        error_part_ = part;
      }
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int parts_ = 0;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // of part error_part_, the lowest worker part that threw
  int error_part_ = 0;
  std::vector<std::thread> threads_;  // last: started once the members above exist
};

}  // namespace quintet::kernels::host_impl
