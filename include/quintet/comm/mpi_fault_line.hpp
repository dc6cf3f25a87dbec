// mpi_fault_line: how one failing MPI rank makes the others raise comm_error instead of hanging.
// Every process keeps one receive posted, from any rank, on its own duplicate of MPI_COMM_WORLD.
// A rank that fails inside mpi_session::run sends its message to every other rank. mpi_comm's
// point-to-point waits, its barrier and its asynchronous waits poll the receive, and every
// operation checks it on entry, so a rank waiting on the failed one raises comm_error naming it;
// it then reports back to that rank alone, which ends the job once all have (mpi_session).
// Blocking collectives cannot be interrupted (see docs/comm.md). Opened by mpi_session; without
// one, waits block in MPI as before.
#pragma once

#if !defined(QUINTET_WITH_MPI)
#error "<quintet/comm/mpi_fault_line.hpp> needs QUINTET_WITH_MPI"
#endif

#include <quintet/comm/comm_error.hpp>
#include <quintet/comm/mpi_call.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace quintet::detail {

class mpi_fault_line {
 public:
  // A failure's message travels cut to this many bytes.
  static constexpr int message_bytes = 1024;

  mpi_fault_line() = default;
  mpi_fault_line(const mpi_fault_line&) = delete;
  mpi_fault_line& operator=(const mpi_fault_line&) = delete;

  bool is_open() const { return comm_ != MPI_COMM_NULL; }
  int rank() const { return rank_; }

  // Collective over MPI_COMM_WORLD. Nested opens share the line; the last close ends it.
  void open() {
    if (users_ > 0) {
      ++users_;
      return;
    }
    QUINTET_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    QUINTET_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    QUINTET_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
    QUINTET_MPI_CALL(MPI_Comm_size(comm_, &size_));
    heard_.assign(static_cast<std::size_t>(size_), false);
    post_receive();
    users_ = 1;
  }

  // Not collective. (A rank that announced never gets here: mpi_session::run ends the job.)
  void close() noexcept {
    if (users_ == 0 || --users_ > 0) return;
    if (receive_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&receive_);
      MPI_Wait(&receive_, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&comm_);
    heard_.clear();
  }

  // mpi_session::run is on the stack: a failure announced now is raised (or its run ends the
  // job), so a request dropped with an error may announce it instead of aborting at once.
  void enter_run() { ++runs_; }
  void leave_run() { --runs_; }
  bool in_run() const { return runs_ > 0; }

  // Whether a failure is known: a failed rank's that has arrived, or this rank's own.
  bool failed() {
    if (failed_rank_ < 0) poll();
    return failed_rank_ >= 0;
  }

  // Throws comm_error naming the failed rank once a failure is known.
  void check() {
    if (!failed()) return;
    stopped_by_peer_ = failed_rank_ != rank_;
    if (stopped_by_peer_) {
      throw comm_error(
          format_message("quintet: mpi_comm rank {} (world) stops: rank {} (world) failed: {}",
                         rank_, failed_rank_, failure_));
    }
    throw comm_error(format_message(
        "quintet: mpi_comm rank {} (world) stops on its own failure: {}", rank_, failure_));
  }

  // Whether this rank's last raise named another rank: it stopped for a peer, not on its own.
  bool stopped_by_peer() const { return stopped_by_peer_; }

  // Says, once, that this rank stops with `message`. A rank that failed on its own tells every
  // other rank (and its own waits raise from now on); one that stopped for a failed rank tells
  // that rank alone, which counts who has stopped. So only failed ranks' messages travel to
  // bystanders (none is blamed for another's failure), and a job of n ranks sends 2 (n - 1).
  void announce(const std::string& message) {
    if (announced_) return;
    announced_ = true;
    if (failed_rank_ < 0) {
      failed_rank_ = rank_;
      failure_ = message;
    }
    outbox_ = message.substr(0, static_cast<std::size_t>(message_bytes));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || (failed_rank_ != rank_ && peer != failed_rank_)) continue;
      MPI_Request send = MPI_REQUEST_NULL;
      QUINTET_MPI_CALL(MPI_Isend(outbox_.data(), static_cast<int>(outbox_.size()), MPI_CHAR, peer,
                                 fault_tag, comm_, &send));
      sends_.push_back(send);
    }
  }

  // On a failed rank: listens until every other rank has announced, or until `deadline`; returns
  // the ranks not heard from.
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

  // On a rank that stopped for a peer: drives its announcement out (or gives up at `deadline`),
  // and no more of MPI, whose unfinished operations may still touch freed buffers.
  void flush_announcement(std::chrono::steady_clock::time_point deadline) {
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE);
    }
  }

  // What an operation that a failure stopped leaves to MPI (staging buffers, counts) stays
  // allocated until the job ends.
  void keep_until_abort(std::shared_ptr<const void> leftover) {
    leftovers_.push_back(std::move(leftover));
  }

 private:
  // The line's communicator is its own; the tag only makes stray messages recognisable.
  static constexpr int fault_tag = 0x7175;

  void post_receive() {
    QUINTET_MPI_CALL(MPI_Irecv(inbox_.data(), message_bytes, MPI_CHAR, MPI_ANY_SOURCE, fault_tag,
                               comm_, &receive_));
  }

  // Takes in every announcement that has arrived. The first is a failed rank's (bystanders hear
  // no other kind), unless this rank failed first.
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
  int users_ = 0;  // open sessions
  int runs_ = 0;   // mpi_session::run calls on the stack
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::array<char, message_bytes> inbox_{};
  std::vector<bool> heard_;  // per world rank: its announcement has arrived
  int failed_rank_ = -1;     // the failure raised: the first known, -1 while none
  std::string failure_;
  bool stopped_by_peer_ = false;
  bool announced_ = false;
  std::string outbox_;  // what this rank announced, alive while its sends are
  std::vector<MPI_Request> sends_;
  std::vector<std::shared_ptr<const void>> leftovers_;
};

// The process's line (MPI_THREAD_FUNNELED: only the thread that runs MPI touches it).
inline mpi_fault_line& fault_line() {
  static mpi_fault_line line;
  return line;
}

// MPI_Waitall that polls the fault line while it waits: returns MPI's status, or throws
// comm_error once a failure is known (the requests are then still active).
inline int wait_all_or_fault(std::span<MPI_Request> requests, MPI_Status* statuses) {
  mpi_fault_line& line = fault_line();
  const int count = static_cast<int>(requests.size());
  if (!line.is_open()) return MPI_Waitall(count, requests.data(), statuses);
  line.check();
  // One look at the line per 32 tests of the requests: it is one more pass of MPI's progress
  // engine, and at this rate send/recv latency stays within noise of MPI_Waitall's (comm.md).
  constexpr unsigned polls_per_check = 32;
  for (unsigned polls = 1;; ++polls) {
    int done = 0;
    const int status = MPI_Testall(count, requests.data(), &done, statuses);
    if (status != MPI_SUCCESS || done) return status;
    if (polls % polls_per_check == 0) line.check();
  }
}

// After a failure stopped a wait: cancels the receives among `requests` (receives[i]: whether
// request i is one) and waits up to `bound` for each to end, cancelled or complete, so that MPI
// stops writing into buffers the unwinding is about to free. A receive already matched to a
// message that does not finish in time is left active. Sends are left alone: they only read.
inline void cancel_receives(std::span<MPI_Request> requests, const std::vector<bool>& receives,
                            std::chrono::milliseconds bound = std::chrono::milliseconds(1000)) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (receives[i] && requests[i] != MPI_REQUEST_NULL) MPI_Cancel(&requests[i]);
  }
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (bool ended = false; !ended && std::chrono::steady_clock::now() < deadline;) {
    ended = true;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (!receives[i]) continue;
      int flag = 0;
      MPI_Test(&requests[i], &flag, MPI_STATUS_IGNORE);  // a null request counts as ended
      ended = ended && flag != 0;
    }
  }
}

}  // namespace quintet::detail
