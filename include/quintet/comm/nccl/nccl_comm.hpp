// nccl_comm: the communicator on CUDA tensors over NCCL. Its unique id is broadcast over MPI;
// every operation runs on the communicator's own stream, ordered after the tensor's stream by an
// event and before the tensor's later work by another (for an asynchronous one, from wait() on);
// exchange() is one NCCL group.
#pragma once

#if !defined(QUINTET_WITH_NCCL) || !defined(QUINTET_WITH_CUDA) || !defined(QUINTET_WITH_MPI)
#error "<quintet/comm/nccl/nccl_comm.hpp> needs QUINTET_WITH_NCCL, QUINTET_WITH_CUDA and MPI"
#endif

#include <quintet/comm/comm_error.hpp>
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/mpi_comm.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/device.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#define QUINTET_NCCL_CALL(call)                                                       \
  do {                                                                                \
    const ncclResult_t quintet_nccl_status = (call);                                  \
    if (quintet_nccl_status != ncclSuccess) {                                         \
      throw ::quintet::comm_error(::quintet::detail::format_message(                  \
          "quintet: {} failed: {}", #call, ncclGetErrorString(quintet_nccl_status))); \
    }                                                                                 \
  } while (false)

namespace quintet {

namespace detail {

inline ncclDataType_t nccl_type_of(dtype type) {
  switch (type) {
    case dtype::f32:
      return ncclFloat32;
    case dtype::f64:
      return ncclFloat64;
    case dtype::bf16:
      return ncclBfloat16;
    case dtype::f16:
      return ncclFloat16;
    case dtype::i32:
      return ncclInt32;
    case dtype::i64:
      return ncclInt64;
  }
  return ncclFloat32;
}

inline ncclRedOp_t nccl_op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::average:
      return ncclAvg;
  }
  return ncclSum;
}

// An nccl_comm operation in flight: `done`, recorded on the communicator's stream after it, and
// the tensors' streams, which wait() makes wait for `done` (the host never blocks).
class nccl_request_state final : public pending_operation {
 public:
  nccl_request_state() = default;
  ~nccl_request_state() override {
    if (done != nullptr) cudaEventDestroy(done);  // CUDA releases it once it has completed
  }

  cudaEvent_t done = nullptr;
  std::vector<cudaStream_t> user_streams;

  // Enqueueing failed; wait() rethrows it.
  void fail(std::exception_ptr error) { error_ = std::move(error); }

  void wait() override {
    if (error_) std::rethrow_exception(error_);
    for (const cudaStream_t stream : user_streams) {
      QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream, done, 0));
    }
  }

  // Whether the communicator's stream has passed the operation.
  bool ready() override { return done == nullptr || cudaEventQuery(done) != cudaErrorNotReady; }

  void abandon(const std::string& message) noexcept override { abort_mpi_job(message.c_str()); }

 private:
  std::exception_ptr error_;
};

}  // namespace detail

class nccl_comm : public communicator_api<nccl_comm, cuda> {
 public:
  // Collective over `bootstrap`: rank 0 makes the NCCL unique id and MPI broadcasts it; this rank
  // then works on CUDA device `device`.
  nccl_comm(mpi_comm& bootstrap, int device) : device_(device) {
    require_cuda_device();
    QUINTET_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) QUINTET_NCCL_CALL(ncclGetUniqueId(&id));
    QUINTET_MPI_CALL(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap.native()));
    QUINTET_NCCL_CALL(ncclCommInitRank(&comm_, bootstrap.size(), id, bootstrap.rank()));
    create_stream_and_events();
  }

  nccl_comm(nccl_comm&& other) noexcept { swap(other); }
  nccl_comm& operator=(nccl_comm&& other) noexcept {
    nccl_comm(std::move(other)).swap(*this);
    return *this;
  }
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;
  ~nccl_comm() {
    if (comm_ != nullptr) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  int rank() const {
    int rank = 0;
    QUINTET_NCCL_CALL(ncclCommUserRank(comm_, &rank));
    return rank;
  }
  int size() const {
    int count = 0;
    QUINTET_NCCL_CALL(ncclCommCount(comm_, &count));
    return count;
  }
  int device() const { return device_; }
  // The stream NCCL works on; callers never need to synchronise with it themselves.
  cudaStream_t comm_stream() const { return stream_; }
  ncclComm_t native() const { return comm_; }

  nccl_comm split(int color, int key) {
    QUINTET_CHECK(color >= 0, "nccl_comm::split: color {} is negative", color);
    nccl_comm part;
    part.device_ = device_;
    QUINTET_NCCL_CALL(ncclCommSplit(comm_, color, key, &part.comm_, nullptr));
    part.create_stream_and_events();
    return part;
  }

 private:
  friend class communicator_api<nccl_comm, cuda>;

  nccl_comm() = default;

  void create_stream_and_events() {
    QUINTET_CUDA_CHECK(cudaSetDevice(device_));
    QUINTET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  void swap(nccl_comm& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(device_, other.device_);
    std::swap(stream_, other.stream_);
    std::swap(ready_, other.ready_);
    std::swap(done_, other.done_);
    std::swap(scratch_, other.scratch_);
  }

  // Runs `enqueue(stream)` on the comm stream after the work already queued on `user` (the
  // tensors' stream), and makes `user`'s later work wait for it.
  template <class Enqueue>
  void ordered(void* user, Enqueue enqueue) {
    const cudaStream_t user_stream = static_cast<cudaStream_t>(user);
    QUINTET_CUDA_CHECK(cudaEventRecord(ready_, user_stream));
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    enqueue(stream_);
    QUINTET_CUDA_CHECK(cudaEventRecord(done_, stream_));
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(user_stream, done_, 0));
  }

  // The asynchronous form: `enqueue(stream)` runs on the comm stream after the work queued on
  // every one of `user` (the tensors' streams), which run on meanwhile; the request's own event
  // marks its end, and wait() makes them wait for it. An error is kept for wait().
  template <class Enqueue>
  comm_request ordered_async(std::vector<cudaStream_t> user, Enqueue enqueue) {
    auto state = std::make_shared<detail::nccl_request_state>();
    try {
      for (const cudaStream_t user_stream : user) {
        QUINTET_CUDA_CHECK(cudaEventRecord(ready_, user_stream));
        QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      }
      enqueue(stream_);
      QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&state->done, cudaEventDisableTiming));
      QUINTET_CUDA_CHECK(cudaEventRecord(state->done, stream_));
      state->user_streams = std::move(user);
    } catch (...) {
      state->fail(std::current_exception());
    }
    return comm_request(std::move(state));
  }

  static void add_stream(std::vector<cudaStream_t>& streams, void* handle) {
    const auto stream = static_cast<cudaStream_t>(handle);
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
      streams.push_back(stream);
    }
  }

  static std::vector<cudaStream_t> streams_of(const comm_buffer& in, const comm_buffer& out) {
    std::vector<cudaStream_t> streams;
    add_stream(streams, in.stream);
    add_stream(streams, out.stream);
    return streams;
  }

  auto all_reduce_call(comm_buffer in, comm_buffer out, reduce_op op) {
    return [this, in, out, op](cudaStream_t stream) {
      QUINTET_NCCL_CALL(ncclAllReduce(in.data, out.data, static_cast<std::size_t>(in.count),
                                      detail::nccl_type_of(in.type), detail::nccl_op_of(op), comm_,
                                      stream));
    };
  }
  void do_all_reduce(comm_buffer in, comm_buffer out, reduce_op op) {
    ordered(out.stream, all_reduce_call(in, out, op));
  }
  comm_request do_all_reduce_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return ordered_async(streams_of(in, out), all_reduce_call(in, out, op));
  }

  auto reduce_scatter_call(comm_buffer in, comm_buffer out, reduce_op op) {
    return [this, in, out, op](cudaStream_t stream) {
      QUINTET_NCCL_CALL(ncclReduceScatter(in.data, out.data, static_cast<std::size_t>(out.count),
                                          detail::nccl_type_of(in.type), detail::nccl_op_of(op),
                                          comm_, stream));
    };
  }
  void do_reduce_scatter(comm_buffer in, comm_buffer out, reduce_op op) {
    ordered(out.stream, reduce_scatter_call(in, out, op));
  }
  comm_request do_reduce_scatter_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return ordered_async(streams_of(in, out), reduce_scatter_call(in, out, op));
  }

  auto all_gather_call(comm_buffer in, comm_buffer out) {
    return [this, in, out](cudaStream_t stream) {
      QUINTET_NCCL_CALL(ncclAllGather(in.data, out.data, static_cast<std::size_t>(in.count),
                                      detail::nccl_type_of(in.type), comm_, stream));
    };
  }
  void do_all_gather(comm_buffer in, comm_buffer out) {
    ordered(out.stream, all_gather_call(in, out));
  }
  comm_request do_all_gather_async(comm_buffer in, comm_buffer out) {
    return ordered_async(streams_of(in, out), all_gather_call(in, out));
  }

  void do_broadcast(comm_buffer inout, int root) {
    ordered(inout.stream, [&](cudaStream_t stream) {
      QUINTET_NCCL_CALL(ncclBroadcast(inout.data, inout.data, static_cast<std::size_t>(inout.count),
                                      detail::nccl_type_of(inout.type), root, comm_, stream));
    });
  }

  // All-to-all is a group of sends and receives, one pair per peer.
  void do_all_to_all(comm_buffer in, comm_buffer out) {
    const std::int64_t block = in.count / size();
    ordered(out.stream, [&](cudaStream_t stream) {
      const std::size_t bytes = static_cast<std::size_t>(block) * size_of(in.type);
      QUINTET_NCCL_CALL(ncclGroupStart());
      for (int peer = 0; peer < size(); ++peer) {
        QUINTET_NCCL_CALL(ncclSend(static_cast<const std::byte*>(in.data) + bytes * peer, bytes,
                                   ncclUint8, peer, comm_, stream));
        QUINTET_NCCL_CALL(ncclRecv(static_cast<std::byte*>(out.data) + bytes * peer, bytes,
                                   ncclUint8, peer, comm_, stream));
      }
      QUINTET_NCCL_CALL(ncclGroupEnd());
    });
  }

  // The counts are read while the call is enqueued, not later.
  auto all_to_all_v_call(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                         std::span<const std::int64_t> out_counts) {
    return [this, in, in_counts, out, out_counts](cudaStream_t stream) {
      const std::size_t element = size_of(in.type);
      std::size_t send_at = 0, recv_at = 0;
      QUINTET_NCCL_CALL(ncclGroupStart());
      for (int peer = 0; peer < size(); ++peer) {
        const std::size_t send_bytes = static_cast<std::size_t>(in_counts[peer]) * element;
        const std::size_t recv_bytes = static_cast<std::size_t>(out_counts[peer]) * element;
        QUINTET_NCCL_CALL(ncclSend(static_cast<const std::byte*>(in.data) + send_at, send_bytes,
                                   ncclUint8, peer, comm_, stream));
        QUINTET_NCCL_CALL(ncclRecv(static_cast<std::byte*>(out.data) + recv_at, recv_bytes,
                                   ncclUint8, peer, comm_, stream));
        send_at += send_bytes;
        recv_at += recv_bytes;
      }
      QUINTET_NCCL_CALL(ncclGroupEnd());
    };
  }
  void do_all_to_all_v(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                       std::span<const std::int64_t> out_counts) {
    ordered(out.stream, all_to_all_v_call(in, in_counts, out, out_counts));
  }
  comm_request do_all_to_all_v_async(comm_buffer in, std::span<const std::int64_t> in_counts,
                                     comm_buffer out, std::span<const std::int64_t> out_counts) {
    return ordered_async(streams_of(in, out), all_to_all_v_call(in, in_counts, out, out_counts));
  }

  // One NCCL group. NCCL has no tags: sends and receives between two ranks match in order.
  auto exchange_call(std::span<const p2p_op> ops) {
    return [this, ops](cudaStream_t stream) {
      QUINTET_NCCL_CALL(ncclGroupStart());
      for (const p2p_op& op : ops) {
        if (op.direction == p2p_op::kind::send) {
          QUINTET_NCCL_CALL(
              ncclSend(op.buffer.data, op.buffer.bytes(), ncclUint8, op.peer, comm_, stream));
        } else {
          QUINTET_NCCL_CALL(
              ncclRecv(op.buffer.data, op.buffer.bytes(), ncclUint8, op.peer, comm_, stream));
        }
      }
      QUINTET_NCCL_CALL(ncclGroupEnd());
    };
  }
  void do_exchange(std::span<const p2p_op> ops) {
    if (ops.empty()) return;
    ordered(ops.front().buffer.stream, exchange_call(ops));
  }
  // Ordered after, and waited by, the streams of every buffer in the batch.
  comm_request do_exchange_async(std::span<const p2p_op> ops) {
    if (ops.empty()) return comm_request();
    std::vector<cudaStream_t> streams;
    for (const p2p_op& op : ops) add_stream(streams, op.buffer.stream);
    return ordered_async(std::move(streams), exchange_call(ops));
  }

  // A one-element all-reduce, waited for on the host.
  void do_barrier() {
    if (scratch_ == nullptr) QUINTET_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(std::int32_t)));
    QUINTET_NCCL_CALL(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace quintet
