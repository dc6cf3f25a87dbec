// mpi_fault_line: how one failing MPI rank makes the others raise comm_error instead of hanging.
// Every rank keeps one receive posted, from any rank, on its own duplicate of MPI_COMM_WORLD. A
// rank that fails sends its message to every other rank. mpi_comm's point-to-point waits, its
// asynchronous waits and its barrier poll the receive, and every operation checks it on entry, so
// a rank waiting on a failed peer raises comm_error naming that peer. A blocking collective
// (all_reduce, broadcast, ...) cannot be interrupted: a rank inside one stays there until
// mpi_session ends the job. Opened by mpi_session; without one, waits block in MPI as before.
#pragma once

#if !defined(QUINTET_WITH_MPI)
#error "<quintet/comm/mpi_fault_line.hpp> needs QUINTET_WITH_MPI"
#endif

#include <quintet/comm/comm_error.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace quintet {

namespace detail {

[[noreturn]] inline void raise_mpi_error(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw comm_error(
      detail::format_message("quintet: {} failed: {}", call, std::string(text, length)));
}

#define QUINTET_MPI_CALL(call)                                       \
  do {                                                               \
    const int quintet_mpi_status = (call);                           \
    if (quintet_mpi_status != MPI_SUCCESS)                           \
      ::quintet::detail::raise_mpi_error(quintet_mpi_status, #call); \
  } while (false)

class mpi_fault_line {
 public:
  // A failure's message travels cut to this many bytes.
  static constexpr int message_bytes = 1024;

  mpi_fault_line() = default;
  mpi_fault_line(const mpi_fault_line&) = delete;
  mpi_fault_line& operator=(const mpi_fault_line&) = delete;

  bool is_open() const { return comm_ != MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Collective over MPI_COMM_WORLD. Nested opens share the line; the last close ends it.
  void open() {
    if (users_++ > 0) return;
    QUINTET_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    QUINTET_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    QUINTET_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
    QUINTET_MPI_CALL(MPI_Comm_size(comm_, &size_));
    heard_.assign(static_cast<std::size_t>(size_), false);
    post_receive();
  }

  // Not collective: a line with a failure on it is left to the job's abort.
  void close() noexcept {
    if (users_ == 0 || --users_ > 0) return;
    if (receive_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&receive_);
      MPI_Wait(&receive_, MPI_STATUS_IGNORE);
    }
    for (MPI_Request& send : sends_) MPI_Request_free(&send);
    sends_.clear();
    MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    heard_.clear();
    failed_rank_ = -1;
    failure_.clear();
    stopped_by_peer_ = announced_ = false;
  }

  // Whether a failure is known: a peer's that has arrived, or this rank's own.
  bool failed() {
    if (failed_rank_ < 0) poll();
    return failed_rank_ >= 0;
  }

  // Throws comm_error naming the failed rank once a failure is known.
  void check() {
    if (!failed()) return;
    stopped_by_peer_ = failed_rank_ != rank_;
    throw comm_error(
        format_message("quintet: mpi_comm rank {} (world) stops: rank {} (world) failed: {}", rank_,
                       failed_rank_, failure_));
  }

  // Whether this rank's last raise named another rank: it stopped for a peer, not on its own.
  bool stopped_by_peer() const { return stopped_by_peer_; }

  // This rank failed with `message`: tells every other rank, once. Also this rank's own waits raise
  // from now on.
  void announce(const std::string& message) {
    if (announced_) return;
    announced_ = true;
    if (failed_rank_ < 0) {
      failed_rank_ = rank_;
      failure_ = message;
    }
    outbox_ = message.substr(0, static_cast<std::size_t>(message_bytes));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request& send = sends_.emplace_back(MPI_REQUEST_NULL);
      QUINTET_MPI_CALL(MPI_Isend(outbox_.data(), static_cast<int>(outbox_.size()), MPI_CHAR, peer,
                                 fault_tag, comm_, &send));
    }
  }

  // Keeps MPI progressing (this rank's announcement going out) until `deadline`.
  void listen_until(std::chrono::steady_clock::time_point deadline) {
    while (std::chrono::steady_clock::now() < deadline) poll();
  }

  // Listens until every other rank has announced a failure or `deadline` passes; returns the
  // ranks not heard from.
  std::vector<int> await_peers(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      poll();
      std::vector<int> silent;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank_ && !heard_[static_cast<std::size_t>(peer)]) silent.push_back(peer);
      }
      if (silent.empty() || std::chrono::steady_clock::now() >= deadline) return silent;
    }
  }

 private:
  // Far from the tags user code is likely to pick; the line's communicator is its own anyway.
  static constexpr int fault_tag = 0x7175;

  void post_receive() {
    QUINTET_MPI_CALL(MPI_Irecv(inbox_.data(), message_bytes, MPI_CHAR, MPI_ANY_SOURCE, fault_tag,
                               comm_, &receive_));
  }

  // Takes in every announcement that has arrived; the first peer's becomes the failure raised,
  // unless this rank's own came first.
  void poll() {
    if (receive_ == MPI_REQUEST_NULL) return;
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      QUINTET_MPI_CALL(MPI_Test(&receive_, &arrived, &status));
      if (!arrived) return;
      int length = 0;
      MPI_Get_count(&status, MPI_CHAR, &length);
      heard_[static_cast<std::size_t>(status.MPI_SOURCE)] = true;
      if (failed_rank_ < 0) {
        failed_rank_ = status.MPI_SOURCE;
        failure_.assign(inbox_.data(), static_cast<std::size_t>(std::max(length, 0)));
      }
      post_receive();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int users_ = 0;
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::array<char, message_bytes> inbox_{};
  std::vector<bool> heard_;  // per world rank: its failure has arrived
  int failed_rank_ = -1;     // the failure raised: the first known, -1 while none
  std::string failure_;
  bool stopped_by_peer_ = false;
  bool announced_ = false;
  std::string outbox_;  // what this rank announced, alive while its sends are
  std::vector<MPI_Request> sends_;
};

// The process's line (MPI_THREAD_FUNNELED: only the thread that runs MPI touches it).
inline mpi_fault_line& fault_line() {
  static mpi_fault_line line;
  return line;
}

// MPI_Waitall that polls the fault line while it waits: returns MPI's status, or throws
// comm_error once a failure is known (the requests are then left to the job's abort).
inline int wait_all_or_fault(std::span<MPI_Request> requests, MPI_Status* statuses) {
  mpi_fault_line& line = fault_line();
  const int count = static_cast<int>(requests.size());
  if (!line.is_open()) return MPI_Waitall(count, requests.data(), statuses);
  line.check();
  // The line is polled every few tests of the requests: it costs one more pass of MPI's progress.
  constexpr unsigned polls_per_check = 32;
  for (unsigned polls = 1;; ++polls) {
    int done = 0;
    const int status = MPI_Testall(count, requests.data(), &done, statuses);
    if (status != MPI_SUCCESS || done) return status;
    if (polls % polls_per_check == 0) line.check();
  }
}

}  // namespace detail

}  // namespace quintet
