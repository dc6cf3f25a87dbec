// mpi_fault_line: how one failing MPI rank makes the others raise comm_error instead of hanging.
// Every process keeps one receive posted, from any rank, on its own duplicate of MPI_COMM_WORLD.
// A rank that fails inside mpi_session::run sends its message to every other rank. mpi_comm's
// point-to-point waits, its barrier and its asynchronous waits poll the receive, and every
// operation checks it on entry, so a rank waiting on the failed one raises comm_error naming it;
// it then tells every rank in turn. A failed rank ends the job once it has heard from every other
// rank (mpi_session).
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
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace quintet::detail {

// What a rank's waits throw when another rank failed (mpi_session::run tells it from the rank's
// own failures by this type).
class mpi_peer_failure : public comm_error {
 public:
  using comm_error::comm_error;
};

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
    failed_ranks_.assign(static_cast<std::size_t>(size_), false);
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
    failed_ranks_.clear();
    failed_rank_ = -1;
    failure_.clear();
    announced_ = false;
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

  // Throws once a failure is known: mpi_peer_failure naming the failed rank, or comm_error for
  // this rank's own (a request dropped with an error).
  void check() {
    if (!failed()) return;
    if (failed_rank_ != rank_) {
      throw mpi_peer_failure(
          format_message("quintet: mpi_comm rank {} (world) stops: rank {} (world) failed: {}",
                         rank_, failed_rank_, failure_));
    }
    throw comm_error(format_message(
        "quintet: mpi_comm rank {} (world) stops on its own failure: {}", rank_, failure_));
  }

  // Says, once, that this rank stops: with its own failure `message` (failed_here), or for the
  // failure known on the line. Every other rank is told, with the failed rank's number and
  // message, so a bystander names the failed rank whichever report reaches it first, and every
  // failed rank (several may fail at once) counts every rank that stopped. A rank that stopped
  // sends synchronously: its sends complete once matched, which flush_announcement waits for.
  void announce(const std::string& message, bool failed_here) {
    if (announced_) return;
    announced_ = true;
    if (failed_rank_ < 0 || failed_here) {
      failed_ranks_[static_cast<std::size_t>(rank_)] = true;
      if (failed_rank_ < 0) {
        failed_rank_ = rank_;
        failure_ = message;
      }
    }
    const int about = failed_here || failed_rank_ == rank_ ? rank_ : failed_rank_;
    const std::string& text = about == rank_ ? message : failure_;
    outbox_.resize(sizeof(std::int32_t));
    const std::int32_t about_word = about;
    std::memcpy(outbox_.data(), &about_word, sizeof about_word);
    outbox_ += text.substr(0, static_cast<std::size_t>(message_bytes));
    const auto post = about != rank_ ? MPI_Issend : MPI_Isend;  // stopped: synchronous
    sends_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      QUINTET_MPI_CALL(post(outbox_.data(), static_cast<int>(outbox_.size()), MPI_CHAR, peer,
                            fault_tag, comm_, &sends_[static_cast<std::size_t>(peer)]));
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

  // On a rank that stopped for a peer: keeps MPI going until every failed rank it knows of has
  // matched its report (or `deadline`), then no more, since MPI's unfinished operations may
  // still touch freed buffers. A rank that fails later, unknown here, may still receive it.
  void flush_announcement(std::chrono::steady_clock::time_point deadline) {
    do {
      poll();
      bool matched = true;
      for (int peer = 0; peer < size_; ++peer) {
        auto& send = sends_[static_cast<std::size_t>(peer)];
        if (!failed_ranks_[static_cast<std::size_t>(peer)] || send == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&send, &done, MPI_STATUS_IGNORE);
        matched = matched && done != 0;
      }
      if (matched) return;
    } while (std::chrono::steady_clock::now() < deadline);
  }

  // What an operation that a failure stopped leaves to MPI (staging buffers, counts) stays
  // allocated until the job ends.
  void keep_until_abort(std::shared_ptr<const void> leftover) {
    leftovers_.push_back(std::move(leftover));
  }

  // The one second this rank gives its cancelled receives to end, all of them together, from
  // the first cancel on.
  std::chrono::steady_clock::time_point cancel_deadline() {
    if (cancel_deadline_ == std::chrono::steady_clock::time_point{})
      cancel_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    return cancel_deadline_;
  }

 private:
  // The line's communicator is its own; the tag only makes stray messages recognisable.
  static constexpr int fault_tag = 0x7175;
  static constexpr int inbox_bytes = static_cast<int>(sizeof(std::int32_t)) + message_bytes;

  void post_receive() {
    QUINTET_MPI_CALL(MPI_Irecv(inbox_.data(), inbox_bytes, MPI_CHAR, MPI_ANY_SOURCE, fault_tag,
                               comm_, &receive_));
  }

  // Takes in every report that has arrived: (the failed rank it is about, that rank's message).
  // The first known failure is the one raised, unless this rank failed first.
  void poll() {
    if (receive_ == MPI_REQUEST_NULL) return;
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      QUINTET_MPI_CALL(MPI_Test(&receive_, &arrived, &status));
      if (!arrived) return;
      int length = 0;
      MPI_Get_count(&status, MPI_CHAR, &length);
      std::int32_t about = status.MPI_SOURCE;
      if (length >= static_cast<int>(sizeof about))
        std::memcpy(&about, inbox_.data(), sizeof about);
      const auto text_length =
          static_cast<std::size_t>(std::max(length - static_cast<int>(sizeof about), 0));
      heard_[static_cast<std::size_t>(status.MPI_SOURCE)] = true;
      if (about >= 0 && about < size_) failed_ranks_[static_cast<std::size_t>(about)] = true;
      if (failed_rank_ < 0) {
        failed_rank_ = about;
        failure_.assign(inbox_.data() + sizeof about, text_length);
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
  std::array<char, inbox_bytes> inbox_{};
  std::vector<bool> heard_;         // per world rank: its report has arrived
  std::vector<bool> failed_ranks_;  // per world rank: known to have failed on its own
  int failed_rank_ = -1;            // the failure raised: the first known, -1 while none
  std::string failure_;
  bool announced_ = false;
  std::string outbox_;              // (the failed rank, its message), alive while the sends are
  std::vector<MPI_Request> sends_;  // per world rank
  std::vector<std::shared_ptr<const void>> leftovers_;
  std::chrono::steady_clock::time_point cancel_deadline_{};
};

// The process's line (MPI_THREAD_FUNNELED: only the thread that runs MPI touches it).
inline mpi_fault_line& fault_line() {
  static mpi_fault_line line;
  return line;
}

// MPI_Waitall that polls the fault line while it waits: returns MPI's status, or throws once a
// failure is known (mpi_fault_line::check; the requests are then still active).
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
// request i is one) and waits, until the line's cancel deadline, for each to end, cancelled or
// complete, so that MPI stops writing into buffers the unwinding is about to free. A receive
// already matched to a message that does not finish in time is left active. Sends are not
// cancelled: MPI may go on reading their buffers (docs/comm.md says what that means).
inline void cancel_receives(std::span<MPI_Request> requests, const std::vector<bool>& receives) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (receives[i] && requests[i] != MPI_REQUEST_NULL) MPI_Cancel(&requests[i]);
  }
  const auto deadline = fault_line().cancel_deadline();
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
