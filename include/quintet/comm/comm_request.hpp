// quintet::comm_request: the handle an asynchronous communicator operation (all_reduce_async,
// exchange_async, ...) returns. wait() completes the operation and rethrows its error; a handle
// dropped without wait() waits in its destructor, so no peer is ever left reading freed memory.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace quintet {

namespace detail {

// What a backend keeps for one operation in flight. comm_request calls it from one thread.
class pending_operation {
 public:
  pending_operation() = default;
  pending_operation(const pending_operation&) = delete;
  pending_operation& operator=(const pending_operation&) = delete;
  virtual ~pending_operation() = default;

  // Completes the operation (and, first, every one issued before it on its communicator) and
  // throws its error, if it had one.
  virtual void wait() = 0;
  // True when wait() would return without blocking.
  virtual bool ready() = 0;
  // The operation of a handle destroyed without wait() failed with `message`: do what a failing
  // rank does (abort its world or job; inside mpi_session::run, announce it so that peers and the
  // rank's own next operation raise it), since nobody is left to see the error and peers would
  // otherwise wait for this rank in vain.
  virtual void abandon(const std::string& message) noexcept = 0;
};

}  // namespace detail

// Move-only. The communicators' asynchronous forms are [[nodiscard]] (the functions, not this
// class: nvcc would take every assignment of a request, whose result is a reference to one, for a
// discarded value). The operation's buffers must stay alive (and its inputs unchanged, its outputs
// unread) until wait() returns or the handle is destroyed. A default-constructed handle is
// complete. After wait() returns or throws, the handle is empty and wait() does nothing.
class comm_request {
 public:
  comm_request() = default;
  explicit comm_request(std::shared_ptr<detail::pending_operation> operation) noexcept
      : operation_(std::move(operation)) {}
  comm_request(comm_request&&) noexcept = default;
  // The operation this handle held is completed first.
  comm_request& operator=(comm_request&& other) noexcept {
    if (this != &other) {
      settle();
      operation_ = std::move(other.operation_);
    }
    return *this;
  }
  comm_request(const comm_request&) = delete;
  comm_request& operator=(const comm_request&) = delete;
  ~comm_request() { settle(); }

  // Blocks until the operation is complete (on nccl_comm: orders the tensors' stream after it,
  // without blocking the host); rethrows its error as comm_error or quintet::error.
  void wait() {
    if (!operation_) return;
    const std::shared_ptr<detail::pending_operation> operation = std::move(operation_);
    operation->wait();
  }

  // Whether wait() would return at once. Polling it also lets MPI progress the operation.
  bool ready() const { return !operation_ || operation_->ready(); }

  // The operation itself, for a backend that wraps another's (staged_comm): it then owns the
  // duty to wait for it, or to abandon it. The handle is left empty.
  std::shared_ptr<detail::pending_operation> release() && noexcept { return std::move(operation_); }

 private:
  void settle() noexcept {
    if (!operation_) return;
    const std::shared_ptr<detail::pending_operation> operation = std::move(operation_);
    try {
      operation->wait();
    } catch (const std::exception& failure) {
      operation->abandon(failure.what());
    } catch (...) {
      operation->abandon("an exception not derived from std::exception");
    }
  }

  std::shared_ptr<detail::pending_operation> operation_;
};

}  // namespace quintet
