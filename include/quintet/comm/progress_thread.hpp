// detail::progress_thread: one worker thread that runs a communicator's asynchronous operations
// one at a time, in the order they were submitted, while the issuing thread computes (the
// asynchronous path of thread_comm). A thread that waits for an operation the worker has not
// taken yet runs it itself, with the operations queued before it, while nothing else runs: it
// would be blocked until they had run anyway, and the wait then costs no hand-off to the worker
// and back (the same code in the same order, so the same bits).
#pragma once

#include <quintet/comm/comm_request.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace quintet::detail {

class progress_thread;

// One submitted operation: `body` runs on the worker, or on the thread that waits for it; its
// exception is kept for wait(). Waited for by the thread that submitted it (thread_comm's rule),
// which keeps the progress_thread alive until every operation has run: wait() may use it.
class queued_operation final : public pending_operation {
 public:
  queued_operation(progress_thread& owner, std::function<void()> body,
                   std::function<void(const std::string&)> on_abandon)
      : owner_(&owner), body_(std::move(body)), on_abandon_(std::move(on_abandon)) {}

  // Rethrows the error once (comm_request waits once). The exception is taken out, so that it is
  // thrown and freed on the waiting thread alone: the worker never touches it again.
  void wait() override;

  bool ready() override {
    const std::lock_guard lock(mutex_);
    return finished_;
  }

  void abandon(const std::string& message) noexcept override { on_abandon_(message); }

  // On the worker, or on the waiting thread (progress_thread::run_here).
  void run() noexcept {
    std::exception_ptr error;
    try {
      body_();
    } catch (...) {
      error = std::current_exception();
    }
    body_ = nullptr;  // what it captured is not needed any more
    {
      const std::lock_guard lock(mutex_);
      error_ = std::move(error);
      finished_ = true;
    }
    finished_changed_.notify_all();
  }

 private:
  // Not finished, so still queued or running: its progress_thread lives until it has run.
  bool finished() {
    const std::lock_guard lock(mutex_);
    return finished_;
  }

  progress_thread* owner_;
  std::function<void()> body_;
  std::function<void(const std::string&)> on_abandon_;
  std::mutex mutex_;
  std::condition_variable finished_changed_;
  bool finished_ = false;  // guarded by mutex_, as is error_
  std::exception_ptr error_;
};

class progress_thread {
 public:
  progress_thread() = default;
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;
  // Runs what is still queued (peers expect it), then joins the worker.
  ~progress_thread() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queue_changed_.notify_one();
    worker_.join();
  }

  // Queues `body`; `on_abandon` is what a failure nobody waited for does (comm_request).
  std::shared_ptr<pending_operation> submit(std::function<void()> body,
                                            std::function<void(const std::string&)> on_abandon) {
    auto operation =
        std::make_shared<queued_operation>(*this, std::move(body), std::move(on_abandon));
    {
      const std::lock_guard lock(mutex_);
      queue_.push_back(operation);
      ++unfinished_;
    }
    queue_changed_.notify_one();
    return operation;
  }

  // Returns once every submitted operation has run: those the worker has not taken run here.
  void drain() {
    run_here_through(nullptr);
    std::unique_lock lock(mutex_);
    all_finished_.wait(lock, [&] { return unfinished_ == 0; });
  }

  // Runs queued operations on the calling thread, front first, until `last` has run (every one,
  // when null); stops as soon as one runs on the worker or the worker has taken `last`. While one
  // runs here the worker takes nothing: one operation at a time, in submission order.
  void run_here_through(const queued_operation* last) {
    while (true) {
      std::shared_ptr<queued_operation> operation;
      {
        const std::lock_guard lock(mutex_);
        if (running_ || queue_.empty()) return;
        if (last != nullptr && std::none_of(queue_.begin(), queue_.end(),
                                            [&](const auto& o) { return o.get() == last; }))
          return;  // the worker has it
        operation = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      operation->run();
      finish_one();
      if (operation.get() == last) return;
    }
  }

 private:
  void serve() {
    std::unique_lock lock(mutex_);
    while (true) {
      queue_changed_.wait(lock, [&] { return !running_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      const std::shared_ptr<queued_operation> operation = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      operation->run();
      finish_one();
      lock.lock();
    }
  }

  // After an operation has run, on the worker or elsewhere.
  void finish_one() {
    bool all_finished = false, work_left = false;
    {
      const std::lock_guard lock(mutex_);
      running_ = false;
      all_finished = --unfinished_ == 0;
      work_left = !queue_.empty() || stopping_;
    }
    // The worker waits for running_ to drop only when there is work (or it is told to stop).
    if (work_left) queue_changed_.notify_one();
    if (all_finished) all_finished_.notify_all();
  }

  std::mutex mutex_;  // guards the queue, the count and the flags below
  std::condition_variable queue_changed_;
  std::condition_variable all_finished_;
  std::deque<std::shared_ptr<queued_operation>> queue_;
  int unfinished_ = 0;    // queued or running
  bool running_ = false;  // an operation runs, on the worker or on a waiting thread
  bool stopping_ = false;
  std::thread worker_{[this] { serve(); }};  // last: starts once the members above exist
};

inline void queued_operation::wait() {
  // Not yet taken by the worker: run it here (after those before it) rather than sleep until the
  // worker has.
  if (!finished()) owner_->run_here_through(this);
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    finished_changed_.wait(lock, [&] { return finished_; });
    error = std::move(error_);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace quintet::detail
