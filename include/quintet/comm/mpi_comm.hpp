// mpi_comm: the communicator over an MPI communicator (Open MPI, launched with mpirun), with the
// same semantics as thread_comm (asynchronous forms on MPI's non-blocking collectives);
// mpi_session initialises MPI and, when a rank throws, makes the others raise comm_error through
// the fault line (mpi_fault_line.hpp) before it ends the job with MPI_Abort.
#pragma once

#if !defined(QUINTET_WITH_MPI)
#error "<quintet/comm/mpi_comm.hpp> needs QUINTET_WITH_MPI (link quintet::quintet with MPI found)"
#endif

#include <quintet/comm/comm_error.hpp>
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/mpi_call.hpp>
#include <quintet/comm/mpi_fault_line.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/half.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// Defined to 1, every mpi_comm checks (with one small extra all-gather per collective) that all
// ranks entered the same collective with the same type, count and root, as thread_comm always
// does. The constructor's flag overrides it per communicator.
#if !defined(QUINTET_MPI_CHECK_CONSISTENCY)
#define QUINTET_MPI_CHECK_CONSISTENCY 0
#endif

namespace quintet {

namespace detail {

// 16-bit floats travel as 16-bit words and are reduced as fp32 copies.
inline MPI_Datatype mpi_type_of(dtype type) {
  switch (type) {
    case dtype::f32:
      return MPI_FLOAT;
    case dtype::f64:
      return MPI_DOUBLE;
    case dtype::bf16:
      return MPI_UINT16_T;
    case dtype::f16:
      return MPI_UINT16_T;
    case dtype::i32:
      return MPI_INT32_T;
    case dtype::i64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op mpi_op_of(reduce_op op) {
  switch (op) {
    case reduce_op::max:
      return MPI_MAX;
    case reduce_op::min:
      return MPI_MIN;
    default:
      return MPI_SUM;  // average divides the sum afterwards
  }
}

inline int mpi_count(std::int64_t count, const char* what) {
  QUINTET_CHECK(count <= INT_MAX, "mpi_comm {}: {} elements exceed MPI's int count", what, count);
  return static_cast<int>(count);
}

inline bool is_half_float(dtype type) { return type == dtype::bf16 || type == dtype::f16; }

inline std::vector<float> widen(const comm_buffer& buffer) {
  std::vector<float> wide(static_cast<std::size_t>(buffer.count));
  for (std::int64_t i = 0; i < buffer.count; ++i) {
    wide[i] = buffer.type == dtype::bf16
                  ? static_cast<float>(static_cast<const bf16*>(buffer.data)[i])
                  : static_cast<float>(static_cast<const half*>(buffer.data)[i]);
  }
  return wide;
}

inline void narrow(const std::vector<float>& wide, const comm_buffer& buffer) {
  for (std::int64_t i = 0; i < buffer.count; ++i) {
    if (buffer.type == dtype::bf16) {
      static_cast<bf16*>(buffer.data)[i] = bf16(wide[i]);
    } else {
      static_cast<half*>(buffer.data)[i] = half(wide[i]);
    }
  }
}

template <class T>
inline void divide_all(void* data, std::int64_t count, int divisor) {
  T* values = static_cast<T*>(data);
  for (std::int64_t i = 0; i < count; ++i) values[i] = values[i] / static_cast<T>(divisor);
}

// average = sum / size, truncating for integers.
inline void divide_by(const comm_buffer& buffer, int divisor) {
  switch (buffer.type) {
    case dtype::f32:
      return divide_all<float>(buffer.data, buffer.count, divisor);
    case dtype::f64:
      return divide_all<double>(buffer.data, buffer.count, divisor);
    case dtype::i32:
      return divide_all<std::int32_t>(buffer.data, buffer.count, divisor);
    case dtype::i64:
      return divide_all<std::int64_t>(buffer.data, buffer.count, divisor);
    default:
      QUINTET_FAIL("mpi_comm: {} is divided in fp32", name_of(buffer.type));
  }
}

// Prints the rank and `message`, then ends the job: what a failing rank does outside
// mpi_session::run (no fault line to tell its peers), and what nccl_comm always does.
[[noreturn]] inline void abort_mpi_job(const char* message) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr, "quintet: mpi rank %d failed: %s; aborting the job\n", world_rank, message);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

// all_to_all_v's int counts and offsets for MPI: send counts, send offsets, receive counts,
// receive offsets, size entries each.
inline std::vector<int> mpi_v_layout(std::span<const std::int64_t> in_counts,
                                     std::span<const std::int64_t> out_counts) {
  const std::size_t n = in_counts.size();
  std::vector<int> layout(4 * n);
  std::int64_t send_at = 0, recv_at = 0;
  for (std::size_t j = 0; j < n; ++j) {
    layout[j] = mpi_count(in_counts[j], "all_to_all_v");
    layout[n + j] = mpi_count(send_at, "all_to_all_v");
    layout[2 * n + j] = mpi_count(out_counts[j], "all_to_all_v");
    layout[3 * n + j] = mpi_count(recv_at, "all_to_all_v");
    send_at += in_counts[j];
    recv_at += out_counts[j];
  }
  return layout;
}

// What the MPI_Waitall of an exchange reported: a receive that got fewer elements than it
// expects, or more (MPI_ERR_TRUNCATE), is a comm_error naming both; any other failure is MPI's.
inline void check_exchange(std::span<const p2p_op> ops, std::span<const MPI_Status> statuses,
                           int status, int rank) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const p2p_op& op = ops[i];
    if (op.direction != p2p_op::kind::recv) continue;
    const int error = status == MPI_ERR_IN_STATUS ? statuses[i].MPI_ERROR : MPI_SUCCESS;
    int received = 0;
    MPI_Get_count(&statuses[i], mpi_type_of(op.buffer.type), &received);
    if (error == MPI_ERR_TRUNCATE || (error == MPI_SUCCESS && received != op.buffer.count)) {
      throw comm_error(format_message(
          "quintet: mpi_comm recv on rank {} from rank {} (tag {}): expects {} {} elements, "
          "but {} were sent",
          rank, op.peer, op.tag, op.buffer.count, name_of(op.buffer.type),
          error == MPI_ERR_TRUNCATE ? std::string("more") : std::to_string(received)));
    }
  }
  if (status != MPI_SUCCESS) raise_mpi_error(status, "MPI_Waitall");
}

// An mpi_comm operation in flight: its MPI requests, the buffers MPI reads and writes for it (fp32
// copies of 16-bit data, an input copied because MPI forbids aliasing, all_to_all_v's counts),
// and `finish`, what is left once MPI is done (rounding to 16 bits, average's division, checking
// what arrived). It holds the operation issued before it on the same communicator, which
// completes first. Used from the thread that issued it (MPI_THREAD_FUNNELED).
class mpi_request_state final : public pending_operation,
                                public std::enable_shared_from_this<mpi_request_state> {
 public:
  explicit mpi_request_state(std::shared_ptr<mpi_request_state> previous)
      : previous_(std::move(previous)) {}

  std::vector<MPI_Request> requests;
  std::vector<float> wide, block;
  std::vector<std::byte> copy;
  std::vector<int> layout;
  std::function<void(mpi_request_state&)> finish;  // none: only MPI's status is checked
  // For an exchange, whether each request is a receive (cancelled when a failure stops the wait).
  std::vector<bool> receives;

  // Starting the operation failed; wait() rethrows it once what did start is complete.
  void fail(std::exception_ptr error) { error_ = std::move(error); }

  std::span<const MPI_Status> statuses() const { return statuses_; }
  int status() const { return status_; }
  void check_status(const char* call) const {
    if (status_ != MPI_SUCCESS) raise_mpi_error(status_, call);
  }

  void wait() override {
    complete();
    if (error_) std::rethrow_exception(error_);
  }

  bool ready() override {
    if (fault_line().failed()) return true;  // wait() throws at once
    for (mpi_request_state* op = this; op != nullptr && !op->completed_; op = op->previous_.get()) {
      if (!op->test()) return false;
    }
    return true;
  }

  // Inside mpi_session::run, this rank's failure goes out on the fault line (unless a failure is
  // known already: then the rank is stopping on it) and its next operation, or the end of run,
  // raises it; elsewhere the job ends here.
  void abandon(const std::string& message) noexcept override {
    mpi_fault_line& line = fault_line();
    if (!line.is_open() || !line.in_run()) abort_mpi_job(message.c_str());
    try {
      if (!line.failed()) line.announce(message, true);
    } catch (const std::exception& failure) {
      abort_mpi_job(failure.what());
    }
  }

  // Completes the operations issued before this one, oldest first, then this one. Their errors
  // are kept for their own wait(); a known failure on the fault line becomes the error of each
  // that had not completed.
  void complete() noexcept {
    std::vector<mpi_request_state*> chain;
    for (mpi_request_state* op = this; op != nullptr && !op->completed_; op = op->previous_.get()) {
      chain.push_back(op);
    }
    for (auto op = chain.rbegin(); op != chain.rend(); ++op) (*op)->complete_own();
  }

 private:
  // MPI_Testall; an error counts as done, and complete_own's MPI_Waitall reports it.
  bool test() {
    if (transferred_) return true;
    statuses_.resize(requests.size());
    int flag = 0;
    const int status =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses_.data());
    transferred_ = status == MPI_SUCCESS && flag != 0;
    return transferred_ || status != MPI_SUCCESS;
  }

  void complete_own() noexcept {
    if (!transferred_) {
      statuses_.resize(requests.size());
      try {
        status_ = wait_all_or_fault(requests, statuses_.data());
        transferred_ = true;
      } catch (...) {
        // A failure is known: receives are cancelled; what MPI may still use of this state stays
        // allocated until the job's abort.
        if (!receives.empty()) cancel_receives(requests, receives);
        fault_line().keep_until_abort(shared_from_this());
        if (!error_) error_ = std::current_exception();
      }
    }
    if (!error_) {
      try {
        if (finish) {
          finish(*this);
        } else {
          check_status("MPI_Wait");
        }
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    finish = nullptr;
    previous_.reset();
    completed_ = true;
  }

  std::shared_ptr<mpi_request_state> previous_;
  std::vector<MPI_Status> statuses_;
  int status_ = MPI_SUCCESS;
  bool transferred_ = false;  // MPI is done with the requests and the buffers
  bool completed_ = false;    // and `finish` has run
  std::exception_ptr error_;
};

}  // namespace detail

class mpi_comm : public communicator_api<mpi_comm, host> {
 public:
  // Collective over `parent`: works on a duplicate of it (its own message space and error
  // handler), which this object frees. The world is not finalised here; see mpi_session.
  explicit mpi_comm(MPI_Comm parent = MPI_COMM_WORLD,
                    bool check_consistency = QUINTET_MPI_CHECK_CONSISTENCY != 0)
      : check_consistency_(check_consistency) {
    QUINTET_MPI_CALL(MPI_Comm_dup(parent, &comm_));
    adopt();
  }
  mpi_comm(mpi_comm&& other) noexcept { swap(other); }
  mpi_comm& operator=(mpi_comm&& other) noexcept {
    mpi_comm(std::move(other)).swap(*this);
    return *this;
  }
  mpi_comm(const mpi_comm&) = delete;
  mpi_comm& operator=(const mpi_comm&) = delete;
  ~mpi_comm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }
  bool checks_consistency() const { return check_consistency_; }

  mpi_comm split(int color, int key) {
    QUINTET_CHECK(color >= 0, "mpi_comm::split: color {} is negative", color);
    complete_pending();
    mpi_comm part{empty_tag{}};
    part.check_consistency_ = check_consistency_;
    QUINTET_MPI_CALL(MPI_Comm_split(comm_, color, key, &part.comm_));
    part.adopt();
    return part;
  }

 private:
  friend class communicator_api<mpi_comm, host>;

  struct empty_tag {};
  explicit mpi_comm(empty_tag) {}

  void adopt() {
    QUINTET_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    QUINTET_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
    QUINTET_MPI_CALL(MPI_Comm_size(comm_, &size_));
  }

  void swap(mpi_comm& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(rank_, other.rank_);
    std::swap(size_, other.size_);
    std::swap(check_consistency_, other.check_consistency_);
    std::swap(last_, other.last_);
  }

  // Blocking calls first complete the operations issued before them (errors stay with those),
  // then raise a failure the fault line knows of.
  void complete_pending() {
    if (last_) {
      last_->complete();
      last_.reset();
    }
    detail::fault_line().check();  // a closed line knows no failure
  }

  // Starts an asynchronous operation after the pending ones: `start(state)` posts it; an error
  // it throws is kept for wait(), after whatever it did post has completed.
  template <class Start>
  comm_request start(Start start_operation) {
    auto state = std::make_shared<detail::mpi_request_state>(std::move(last_));
    try {
      detail::fault_line().check();
      start_operation(*state);
    } catch (...) {
      state->fail(std::current_exception());
    }
    last_ = state;
    return comm_request(std::move(state));
  }

  // Every rank shares (operation, type, count, root, reduction); all compare, so all raise the
  // same comm_error naming every rank's view.
  void agree(std::string_view operation, dtype type, std::int64_t count, std::int64_t root = 0,
             reduce_op op = reduce_op::sum) {
    if (!check_consistency_) return;
    std::int64_t mine[5] = {static_cast<std::int64_t>(std::hash<std::string_view>{}(operation)),
                            static_cast<std::int64_t>(type), count, root,
                            static_cast<std::int64_t>(op)};
    std::vector<std::int64_t> all(5 * static_cast<std::size_t>(size_));
    QUINTET_MPI_CALL(MPI_Allgather(mine, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, comm_));
    bool same = true;
    for (int j = 0; j < size_; ++j) same = same && std::equal(mine, mine + 5, &all[5 * j]);
    if (same) return;
    std::string ranks;
    for (int j = 0; j < size_; ++j) {
      const std::int64_t* theirs = &all[5 * j];
      ranks += detail::format_message("{}rank {}: {}{} of {} {} elements from root {} ({})",
                                      j == 0 ? "" : "; ", j,
                                      theirs[0] == mine[0] ? "" : "another op than ", operation,
                                      theirs[2], name_of(static_cast<dtype>(theirs[1])), theirs[3],
                                      name_of(static_cast<reduce_op>(theirs[4])));
    }
    throw comm_error("quintet: mpi_comm ranks disagree about the collective: " + ranks);
  }

  void do_all_reduce(comm_buffer in, comm_buffer out, reduce_op op) {
    complete_pending();
    agree("all_reduce", in.type, in.count, 0, op);
    const int count = detail::mpi_count(in.count, "all_reduce");
    if (detail::is_half_float(in.type)) {
      std::vector<float> wide = detail::widen(in);
      QUINTET_MPI_CALL(
          MPI_Allreduce(MPI_IN_PLACE, wide.data(), count, MPI_FLOAT, detail::mpi_op_of(op), comm_));
      if (op == reduce_op::average) {
        for (float& value : wide) value /= static_cast<float>(size_);
      }
      detail::narrow(wide, out);
      return;
    }
    const void* source = in.data == out.data ? MPI_IN_PLACE : in.data;
    QUINTET_MPI_CALL(MPI_Allreduce(source, out.data, count, detail::mpi_type_of(in.type),
                                   detail::mpi_op_of(op), comm_));
    if (op == reduce_op::average) detail::divide_by(out, size_);
  }

  comm_request do_all_reduce_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return start([&](detail::mpi_request_state& state) {
      agree("all_reduce", in.type, in.count, 0, op);
      const int count = detail::mpi_count(in.count, "all_reduce");
      state.requests.assign(1, MPI_REQUEST_NULL);
      const int n = size_;
      if (detail::is_half_float(in.type)) {
        state.wide = detail::widen(in);
        QUINTET_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, state.wide.data(), count, MPI_FLOAT,
                                        detail::mpi_op_of(op), comm_, state.requests.data()));
        state.finish = [out, op, n](detail::mpi_request_state& done) {
          done.check_status("MPI_Iallreduce");
          if (op == reduce_op::average) {
            for (float& value : done.wide) value /= static_cast<float>(n);
          }
          detail::narrow(done.wide, out);
        };
        return;
      }
      const void* source = in.data == out.data ? MPI_IN_PLACE : in.data;
      QUINTET_MPI_CALL(MPI_Iallreduce(source, out.data, count, detail::mpi_type_of(in.type),
                                      detail::mpi_op_of(op), comm_, state.requests.data()));
      if (op == reduce_op::average) state.finish = average_finish(out, "MPI_Iallreduce");
    });
  }

  // Divides the sum MPI left in `out` by the rank count.
  std::function<void(detail::mpi_request_state&)> average_finish(comm_buffer out,
                                                                 const char* call) const {
    return [out, call, n = size_](detail::mpi_request_state& done) {
      done.check_status(call);
      detail::divide_by(out, n);
    };
  }

  void do_reduce_scatter(comm_buffer in, comm_buffer out, reduce_op op) {
    complete_pending();
    agree("reduce_scatter", in.type, in.count, 0, op);
    const int count = detail::mpi_count(out.count, "reduce_scatter");
    detail::mpi_count(in.count, "reduce_scatter");
    if (detail::is_half_float(in.type)) {
      const std::vector<float> wide = detail::widen(in);
      std::vector<float> block(static_cast<std::size_t>(out.count));
      QUINTET_MPI_CALL(MPI_Reduce_scatter_block(wide.data(), block.data(), count, MPI_FLOAT,
                                                detail::mpi_op_of(op), comm_));
      if (op == reduce_op::average) {
        for (float& value : block) value /= static_cast<float>(size_);
      }
      detail::narrow(block, out);
      return;
    }
    // MPI forbids aliased buffers; an output inside the input is reduced through a copy.
    std::vector<std::byte> copy;
    const void* source = in.data;
    if (detail::buffers_overlap(in, out)) {
      copy.assign(static_cast<const std::byte*>(in.data),
                  static_cast<const std::byte*>(in.data) + in.bytes());
      source = copy.data();
    }
    QUINTET_MPI_CALL(MPI_Reduce_scatter_block(source, out.data, count, detail::mpi_type_of(in.type),
                                              detail::mpi_op_of(op), comm_));
    if (op == reduce_op::average) detail::divide_by(out, size_);
  }

  comm_request do_reduce_scatter_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return start([&](detail::mpi_request_state& state) {
      agree("reduce_scatter", in.type, in.count, 0, op);
      const int count = detail::mpi_count(out.count, "reduce_scatter");
      detail::mpi_count(in.count, "reduce_scatter");
      state.requests.assign(1, MPI_REQUEST_NULL);
      const int n = size_;
      if (detail::is_half_float(in.type)) {
        state.wide = detail::widen(in);
        state.block.resize(static_cast<std::size_t>(out.count));
        QUINTET_MPI_CALL(MPI_Ireduce_scatter_block(state.wide.data(), state.block.data(), count,
                                                   MPI_FLOAT, detail::mpi_op_of(op), comm_,
                                                   state.requests.data()));
        state.finish = [out, op, n](detail::mpi_request_state& done) {
          done.check_status("MPI_Ireduce_scatter_block");
          if (op == reduce_op::average) {
            for (float& value : done.block) value /= static_cast<float>(n);
          }
          detail::narrow(done.block, out);
        };
        return;
      }
      const void* source = in.data;
      if (detail::buffers_overlap(in, out)) {
        state.copy.assign(static_cast<const std::byte*>(in.data),
                          static_cast<const std::byte*>(in.data) + in.bytes());
        source = state.copy.data();
      }
      QUINTET_MPI_CALL(
          MPI_Ireduce_scatter_block(source, out.data, count, detail::mpi_type_of(in.type),
                                    detail::mpi_op_of(op), comm_, state.requests.data()));
      if (op == reduce_op::average) state.finish = average_finish(out, "MPI_Ireduce_scatter_block");
    });
  }

  void do_all_gather(comm_buffer in, comm_buffer out) {
    complete_pending();
    agree("all_gather", in.type, in.count);
    const int count = detail::mpi_count(in.count, "all_gather");
    detail::mpi_count(out.count, "all_gather");
    const MPI_Datatype type = detail::mpi_type_of(in.type);
    const void* own_block = static_cast<const std::byte*>(out.data) + in.bytes() * rank_;
    if (in.data == own_block) {
      QUINTET_MPI_CALL(MPI_Allgather(MPI_IN_PLACE, 0, type, out.data, count, type, comm_));
      return;
    }
    std::vector<std::byte> copy;
    const void* source = in.data;
    if (detail::buffers_overlap(in, out)) {
      copy.assign(static_cast<const std::byte*>(in.data),
                  static_cast<const std::byte*>(in.data) + in.bytes());
      source = copy.data();
    }
    QUINTET_MPI_CALL(MPI_Allgather(source, count, type, out.data, count, type, comm_));
  }

  comm_request do_all_gather_async(comm_buffer in, comm_buffer out) {
    return start([&](detail::mpi_request_state& state) {
      agree("all_gather", in.type, in.count);
      const int count = detail::mpi_count(in.count, "all_gather");
      detail::mpi_count(out.count, "all_gather");
      state.requests.assign(1, MPI_REQUEST_NULL);
      const MPI_Datatype type = detail::mpi_type_of(in.type);
      const void* source = in.data;
      const void* own_block = static_cast<const std::byte*>(out.data) + in.bytes() * rank_;
      if (in.data == own_block) {
        source = MPI_IN_PLACE;
      } else if (detail::buffers_overlap(in, out)) {
        state.copy.assign(static_cast<const std::byte*>(in.data),
                          static_cast<const std::byte*>(in.data) + in.bytes());
        source = state.copy.data();
      }
      QUINTET_MPI_CALL(MPI_Iallgather(source, source == MPI_IN_PLACE ? 0 : count, type, out.data,
                                      count, type, comm_, state.requests.data()));
    });
  }

  void do_broadcast(comm_buffer inout, int root) {
    complete_pending();
    agree("broadcast", inout.type, inout.count, root);
    QUINTET_MPI_CALL(MPI_Bcast(inout.data, detail::mpi_count(inout.count, "broadcast"),
                               detail::mpi_type_of(inout.type), root, comm_));
  }

  void do_all_to_all(comm_buffer in, comm_buffer out) {
    complete_pending();
    agree("all_to_all", in.type, in.count);
    const int block = detail::mpi_count(in.count / size_, "all_to_all");
    detail::mpi_count(in.count, "all_to_all");
    const MPI_Datatype type = detail::mpi_type_of(in.type);
    QUINTET_MPI_CALL(MPI_Alltoall(in.data, block, type, out.data, block, type, comm_));
  }

  void do_all_to_all_v(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                       std::span<const std::int64_t> out_counts) {
    complete_pending();
    agree_counts(in, in_counts, out_counts);
    const std::vector<int> layout = detail::mpi_v_layout(in_counts, out_counts);
    const int* const counts = layout.data();
    const MPI_Datatype type = detail::mpi_type_of(in.type);
    QUINTET_MPI_CALL(MPI_Alltoallv(in.data, counts, counts + size_, type, out.data,
                                   counts + 2 * size_, counts + 3 * size_, type, comm_));
  }

  // MPI reads the counts and offsets until the operation completes: they live in the request.
  comm_request do_all_to_all_v_async(comm_buffer in, std::span<const std::int64_t> in_counts,
                                     comm_buffer out, std::span<const std::int64_t> out_counts) {
    return start([&](detail::mpi_request_state& state) {
      agree_counts(in, in_counts, out_counts);
      state.layout = detail::mpi_v_layout(in_counts, out_counts);
      state.requests.assign(1, MPI_REQUEST_NULL);
      const int* const counts = state.layout.data();
      const MPI_Datatype type = detail::mpi_type_of(in.type);
      QUINTET_MPI_CALL(MPI_Ialltoallv(in.data, counts, counts + size_, type, out.data,
                                      counts + 2 * size_, counts + 3 * size_, type, comm_,
                                      state.requests.data()));
    });
  }

  // With the consistency check, every rank learns whether the counts agree everywhere (one
  // all-to-all and one all-reduce), so all raise together.
  void agree_counts(const comm_buffer& in, std::span<const std::int64_t> in_counts,
                    std::span<const std::int64_t> out_counts) {
    agree("all_to_all_v", in.type, 0);
    if (!check_consistency_) return;
    std::vector<std::int64_t> announced(static_cast<std::size_t>(size_));
    QUINTET_MPI_CALL(
        MPI_Alltoall(in_counts.data(), 1, MPI_INT64_T, announced.data(), 1, MPI_INT64_T, comm_));
    int first_bad = -1;
    for (int j = 0; j < size_ && first_bad < 0; ++j) {
      if (announced[j] != out_counts[j]) first_bad = j;
    }
    int bad_anywhere = first_bad >= 0 ? 1 : 0;
    QUINTET_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &bad_anywhere, 1, MPI_INT, MPI_MAX, comm_));
    if (first_bad >= 0) {
      throw comm_error(
          detail::format_message("quintet: mpi_comm all_to_all_v: rank {} sends {} elements to "
                                 "rank {}, which expects {}",
                                 first_bad, announced[first_bad], rank_, out_counts[first_bad]));
    }
    if (bad_anywhere) {
      throw comm_error(detail::format_message(
          "quintet: mpi_comm all_to_all_v: the ranks' counts disagree (found by another rank "
          "than {})",
          rank_));
    }
  }

  void do_exchange(std::span<const p2p_op> ops) {
    complete_pending();
    std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
    post_exchange(ops, requests.data());
    std::vector<MPI_Status> statuses(ops.size());
    int status = MPI_SUCCESS;
    try {
      status = detail::wait_all_or_fault(requests, statuses.data());
    } catch (...) {
      detail::cancel_receives(requests, receive_mask(ops));  // a failure is known
      throw;
    }
    detail::check_exchange(ops, statuses, status, rank_);
  }

  comm_request do_exchange_async(std::span<const p2p_op> ops) {
    return start([&](detail::mpi_request_state& state) {
      state.requests.assign(ops.size(), MPI_REQUEST_NULL);
      state.receives = receive_mask(ops);
      post_exchange(ops, state.requests.data());
      state.finish = [batch = std::vector<p2p_op>(ops.begin(), ops.end()),
                      rank = rank_](detail::mpi_request_state& done) {
        detail::check_exchange(batch, done.statuses(), done.status(), rank);
      };
    });
  }

  static std::vector<bool> receive_mask(std::span<const p2p_op> ops) {
    std::vector<bool> receives(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i)
      receives[i] = ops[i].direction == p2p_op::kind::recv;
    return receives;
  }

  void post_exchange(std::span<const p2p_op> ops, MPI_Request* requests) {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const p2p_op& op = ops[i];
      const int count = detail::mpi_count(op.buffer.count, "exchange");
      const MPI_Datatype type = detail::mpi_type_of(op.buffer.type);
      if (op.direction == p2p_op::kind::send) {
        QUINTET_MPI_CALL(
            MPI_Isend(op.buffer.data, count, type, op.peer, op.tag, comm_, &requests[i]));
      } else {
        QUINTET_MPI_CALL(
            MPI_Irecv(op.buffer.data, count, type, op.peer, op.tag, comm_, &requests[i]));
      }
    }
  }

  // Non-blocking inside, so that a rank waiting for a failed peer raises (the fault line).
  void do_barrier() {
    complete_pending();
    agree("barrier", dtype::f32, 0);
    MPI_Request request = MPI_REQUEST_NULL;
    QUINTET_MPI_CALL(MPI_Ibarrier(comm_, &request));
    MPI_Status status;
    const int code = detail::wait_all_or_fault(std::span(&request, 1), &status);
    if (code != MPI_SUCCESS)
      detail::raise_mpi_error(code == MPI_ERR_IN_STATUS ? status.MPI_ERROR : code, "MPI_Ibarrier");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool check_consistency_ = false;
  // The operation issued last, unless a blocking call has completed it since. Each holds the one
  // before it, so completing it completes everything issued on this communicator.
  std::shared_ptr<detail::mpi_request_state> last_;
};

// mpi_session: initialises MPI (unless the program already did), opens the fault line, and
// finalises what it initialised; collective over MPI_COMM_WORLD. run(fn) calls fn(world). When
// fn throws on a rank, the rank prints its message and sends it to every other rank on the fault
// line: each rank waiting on it in mpi_comm raises comm_error naming it, prints, and reports back.
// The failed rank waits until every other rank has reported, or the grace period has passed (a
// rank held in a blocking collective or a long computation), then ends the job with MPI_Abort:
// MPI's pending operations cannot be undone otherwise.
class mpi_session {
 public:
  mpi_session(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      QUINTET_MPI_CALL(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
      owns_ = true;
    }
    detail::fault_line().open();
  }
  mpi_session() : mpi_session(nullptr, nullptr) {}
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    detail::fault_line().close();
    if (owns_) MPI_Finalize();
  }

  // How long a failed rank waits for the others to raise before it ends the job.
  std::chrono::milliseconds grace() const { return grace_; }
  void set_grace(std::chrono::milliseconds grace) {
    QUINTET_CHECK(grace.count() >= 0, "mpi_session grace must not be negative, got {} ms",
                  grace.count());
    grace_ = grace;
  }

  template <class Fn>
  void run(Fn&& fn, bool check_consistency = QUINTET_MPI_CHECK_CONSISTENCY != 0) {
    detail::mpi_fault_line& line = detail::fault_line();
    line.enter_run();
    try {
      mpi_comm world(MPI_COMM_WORLD, check_consistency);
      fn(world);
      // A failure announced by a dropped request, or a peer's, that no later operation raised.
      line.check();
    } catch (const detail::mpi_peer_failure& stopped) {
      stop(stopped.what(), false);
    } catch (const std::exception& failure) {
      stop(failure.what(), true);
    } catch (...) {
      stop("an exception not derived from std::exception", true);
    }
    line.leave_run();
  }

 private:
  // failed_here: `message` is this rank's own failure, not a peer's raised by mpi_comm.
  [[noreturn]] void stop(const char* message, bool failed_here) noexcept {
    detail::mpi_fault_line& line = detail::fault_line();
    if (!line.is_open()) detail::abort_mpi_job(message);
    std::fprintf(stderr, "quintet: mpi rank %d %s: %s\n", line.rank(),
                 failed_here ? "failed" : "stopped", message);
    std::fflush(stderr);
    try {
      line.announce(message, failed_here);
      const auto start = std::chrono::steady_clock::now();
      if (!failed_here) {
        // A failed rank ends the job. This rank drives its report until every failed rank it
        // knows of has matched it, then keeps out of MPI (its unfinished operations may still
        // touch buffers the unwinding freed); it aborts itself after twice the grace period, in
        // case the failed ranks died.
        line.flush_announcement(
            start + std::max<std::chrono::milliseconds>(grace_, std::chrono::milliseconds(1000)));
        std::this_thread::sleep_until(start + 2 * grace_);
        std::fprintf(stderr,
                     "quintet: mpi rank %d: no rank ended the job within %lld ms; aborting the "
                     "job\n",
                     line.rank(), static_cast<long long>(2 * grace_.count()));
      } else {
        const std::vector<int> silent = line.await_peers(start + grace_);
        std::string ranks;
        for (const int rank : silent) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
        const std::string summary =
            silent.empty() ? std::string("every other rank stopped")
                           : detail::format_message("rank(s) {} did not stop within {} ms", ranks,
                                                    grace_.count());
        std::fprintf(stderr, "quintet: mpi rank %d: %s; aborting the job\n", line.rank(),
                     summary.c_str());
      }
    } catch (const std::exception& failure) {
      std::fprintf(stderr, "quintet: mpi rank %d: the fault line failed (%s); aborting the job\n",
                   line.rank(), failure.what());
    }
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();  // MPI_Abort does not return
  }

  bool owns_ = false;
  std::chrono::milliseconds grace_{30000};
};

}  // namespace quintet
