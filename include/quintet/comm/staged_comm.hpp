// staged_comm<HostComm, Device>: a communicator on Device made from a host one (thread_comm,
// mpi_comm). Each operation copies its device inputs into host buffers, runs HostComm's operation
// on them and copies the results back; the asynchronous forms copy back when waited. It lets
// thread ranks that share one GPU run the parallel plans on cuda (each rank a thread with its own
// device tensors, the collectives through host memory), and carries cuda tensors over an MPI that
// cannot read device memory. NCCL (nccl_comm) is the fast path; this one trades two copies per
// operation for needing no GPU per rank.
//
// Ordering on the device: a device input is read after the work its stream holds (the copy to the
// host synchronises the stream the tensor records, so the kernels that wrote it must run there:
// docs/comm.md, "Which stream is waited"), and a result is on the device, in the output's stream
// order, before the operation (or its wait()) returns. staged_comm<..., cuda> needs
// <quintet/tensor/cuda_memory.hpp> in the translation unit, as copy() between devices does.
#pragma once

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/device_memory.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet {

namespace detail {

// One buffer's host copy. Host memory of the host allocator's alignment, so every element type
// (and the host reductions' wide loads) sees aligned data.
class staging_buffer {
 public:
  explicit staging_buffer(const comm_buffer& on_device)
      : on_device_(on_device),
        bytes_(on_device.bytes()),
        data_(bytes_ == 0 ? nullptr : device_memory<host>::allocate(bytes_)) {}
  staging_buffer(staging_buffer&& other) noexcept
      : on_device_(other.on_device_),
        bytes_(std::exchange(other.bytes_, 0)),
        data_(std::exchange(other.data_, nullptr)) {}
  staging_buffer& operator=(staging_buffer&&) = delete;
  staging_buffer(const staging_buffer&) = delete;
  staging_buffer& operator=(const staging_buffer&) = delete;
  ~staging_buffer() {
    if (data_ != nullptr) device_memory<host>::deallocate(data_, bytes_);
  }

  // The same elements, described as a host buffer.
  comm_buffer on_host() const {
    comm_buffer buffer;
    buffer.data = data_;
    buffer.count = on_device_.count;
    buffer.type = on_device_.type;
    return buffer;
  }

  template <class Device>
  void fill_from_device() {
    if (bytes_ == 0) return;
    using engine = memory_copy<host, Device>;
    engine::copy_2d(data_, bytes_, on_device_.data, bytes_, bytes_, 1, host_stream{},
                    stream<Device>());
    engine::finish(host_stream{}, stream<Device>());
  }

  template <class Device>
  void copy_to_device() const {
    if (bytes_ == 0) return;
    using engine = memory_copy<Device, host>;
    engine::copy_2d(on_device_.data, bytes_, data_, bytes_, bytes_, 1, stream<Device>(),
                    host_stream{});
    engine::finish(stream<Device>(), host_stream{});
  }

 private:
  template <class Device>
  typename Device::stream_type stream() const {
    typename Device::stream_type stream{};
    if constexpr (std::same_as<Device, cuda>) stream.handle = on_device_.stream;
    return stream;
  }

  comm_buffer on_device_;
  std::size_t bytes_;
  void* data_;
};

// An asynchronous operation of staged_comm: the host operation in flight, the host copies it reads
// and writes (kept alive until it completes), the results to copy back, and the operation issued
// before it on the same communicator, which completes first (the concept's ordering rule: once a
// request is waited, the results of every earlier one are in place too).
template <class Device>
class staged_operation final : public pending_operation {
 public:
  staged_operation(std::vector<staging_buffer> buffers, std::vector<std::size_t> results,
                   std::shared_ptr<staged_operation> previous)
      : buffers_(std::move(buffers)),
        results_(std::move(results)),
        previous_(std::move(previous)) {}

  void start(comm_request on_host) { on_host_ = std::move(on_host).release(); }

  // Completes the operations issued before this one, oldest first, then this one. Their errors
  // are kept for their own wait().
  void complete() noexcept {
    std::vector<staged_operation*> chain;
    for (staged_operation* op = this; op != nullptr && !op->completed_; op = op->previous_.get()) {
      chain.push_back(op);
    }
    for (auto op = chain.rbegin(); op != chain.rend(); ++op) (*op)->complete_own();
  }

  void wait() override {
    complete();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  // True once the host operations are done: wait() then waits on no peer, though it still copies
  // the results to the device (synchronously) before returning.
  bool ready() override {
    for (staged_operation* op = this; op != nullptr && !op->completed_; op = op->previous_.get()) {
      if (op->on_host_ && !op->on_host_->ready()) return false;
    }
    return true;
  }
  // What the host backend does for its own dropped operation (abort the thread world, announce
  // on MPI's fault line); without one in flight, nothing was left for a peer to wait on.
  void abandon(const std::string& message) noexcept override {
    if (on_host_) on_host_->abandon(message);
  }

 private:
  void complete_own() noexcept {
    completed_ = true;
    previous_.reset();
    try {
      if (on_host_) on_host_->wait();
      for (const std::size_t index : results_) buffers_[index].template copy_to_device<Device>();
    } catch (...) {
      error_ = std::current_exception();
    }
    buffers_.clear();
  }

  std::vector<staging_buffer> buffers_;
  std::vector<std::size_t> results_;  // indices of the buffers the operation writes
  std::shared_ptr<staged_operation> previous_;
  std::shared_ptr<pending_operation> on_host_;
  std::exception_ptr error_;
  bool completed_ = false;
};

}  // namespace detail

template <communicator HostComm, device_tag Device>
requires std::same_as<typename HostComm::device_type, host>
class staged_comm : public communicator_api<staged_comm<HostComm, Device>, Device> {
 public:
  explicit staged_comm(HostComm on_host) : on_host_(std::move(on_host)) {}

  int rank() const { return on_host_.rank(); }
  int size() const { return on_host_.size(); }
  HostComm& on_host() { return on_host_; }

  staged_comm split(int color, int key) {
    settle_pending();
    return staged_comm(on_host_.split(color, key));
  }

  // device_mesh names each axis's communicator; a host communicator that records by axis
  // (counting_comm) is told.
  void set_axis_label(std::string_view axis) requires requires(HostComm& comm) {
    comm.set_axis_label(axis);
  }
  { on_host_.set_axis_label(axis); }

 private:
  friend class communicator_api<staged_comm<HostComm, Device>, Device>;
  using operation = detail::staged_operation<Device>;

  // Host copies of an input (filled from the device) and of an output; `results` are the indices
  // of the buffers the host operation writes, copied back to the device when it completes.
  struct staged_buffers {
    std::vector<detail::staging_buffer> buffers;
    std::vector<std::size_t> results;
  };

  static staged_buffers stage_in_place(const comm_buffer& inout) {
    staged_buffers staged;
    staged.buffers.emplace_back(inout).template fill_from_device<Device>();
    staged.results = {0};
    return staged;
  }

  static staged_buffers stage_in_out(const comm_buffer& in, const comm_buffer& out) {
    staged_buffers staged;
    staged.buffers.reserve(2);
    staged.buffers.emplace_back(in).template fill_from_device<Device>();
    staged.buffers.emplace_back(out);
    staged.results = {1};
    return staged;
  }

  // Runs the host operation on the staged copies (invoke() issues it); blocking, copies the
  // results back before returning; Async, returns the request whose wait() does.
  template <bool Async, class Invoke>
  auto run(staged_buffers staged, Invoke invoke) {
    if constexpr (Async) {
      auto pending =
          std::make_shared<operation>(std::move(staged.buffers), std::move(staged.results), last_);
      pending->start(invoke());
      last_ = pending;
      return comm_request(std::move(pending));
    } else {
      settle_pending();
      invoke();
      for (const std::size_t index : staged.results) {
        staged.buffers[index].template copy_to_device<Device>();
      }
    }
  }

  // call(host input view, host output view) on staged copies of in and out.
  template <bool Async, class Call>
  auto in_out(const comm_buffer& in, const comm_buffer& out, Call call) {
    staged_buffers staged = stage_in_out(in, out);
    const comm_buffer host_in = staged.buffers[0].on_host();
    const comm_buffer host_out = staged.buffers[1].on_host();
    return run<Async>(std::move(staged),
                      [&] { return detail::with_typed_views<host>(host_in, host_out, call); });
  }

  // call(host in-out view) on a staged copy of inout.
  template <bool Async, class Call>
  auto in_place(const comm_buffer& inout, Call call) {
    staged_buffers staged = stage_in_place(inout);
    const comm_buffer host_inout = staged.buffers[0].on_host();
    return run<Async>(std::move(staged),
                      [&] { return detail::with_typed_view<host, true>(host_inout, call); });
  }

  void do_all_reduce(comm_buffer in, comm_buffer out, reduce_op op) {
    if (in.data == out.data) {
      in_place<false>(out, [&](auto inout) { on_host_.all_reduce(inout, op); });
    } else {
      in_out<false>(in, out,
                    [&](auto input, auto output) { on_host_.all_reduce(input, output, op); });
    }
  }
  comm_request do_all_reduce_async(comm_buffer in, comm_buffer out, reduce_op op) {
    if (in.data == out.data) {
      return in_place<true>(out, [&](auto inout) { return on_host_.all_reduce_async(inout, op); });
    }
    return in_out<true>(in, out, [&](auto input, auto output) {
      return on_host_.all_reduce_async(input, output, op);
    });
  }

  void do_reduce_scatter(comm_buffer in, comm_buffer out, reduce_op op) {
    in_out<false>(in, out,
                  [&](auto input, auto output) { on_host_.reduce_scatter(input, output, op); });
  }
  comm_request do_reduce_scatter_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return in_out<true>(in, out, [&](auto input, auto output) {
      return on_host_.reduce_scatter_async(input, output, op);
    });
  }

  void do_all_gather(comm_buffer in, comm_buffer out) {
    in_out<false>(in, out, [&](auto input, auto output) { on_host_.all_gather(input, output); });
  }
  comm_request do_all_gather_async(comm_buffer in, comm_buffer out) {
    return in_out<true>(
        in, out, [&](auto input, auto output) { return on_host_.all_gather_async(input, output); });
  }

  void do_broadcast(comm_buffer inout, int root) {
    in_place<false>(inout, [&](auto buffer) { on_host_.broadcast(buffer, root); });
  }

  void do_all_to_all(comm_buffer in, comm_buffer out) {
    in_out<false>(in, out, [&](auto input, auto output) { on_host_.all_to_all(input, output); });
  }

  // Only the packed fronts move: the output's elements past what arrives stay as they are.
  static comm_buffer packed_front(comm_buffer buffer, std::span<const std::int64_t> counts) {
    buffer.count = 0;
    for (const std::int64_t count : counts) buffer.count += count;
    return buffer;
  }

  void do_all_to_all_v(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                       std::span<const std::int64_t> out_counts) {
    in_out<false>(packed_front(in, in_counts), packed_front(out, out_counts),
                  [&](auto input, auto output) {
                    on_host_.all_to_all_v(input, in_counts, output, out_counts);
                  });
  }
  comm_request do_all_to_all_v_async(comm_buffer in, std::span<const std::int64_t> in_counts,
                                     comm_buffer out, std::span<const std::int64_t> out_counts) {
    return in_out<true>(packed_front(in, in_counts), packed_front(out, out_counts),
                        [&](auto input, auto output) {
                          return on_host_.all_to_all_v_async(input, in_counts, output, out_counts);
                        });
  }

  // Sends are staged at once; receives are copied to the device when the batch completes.
  static std::pair<staged_buffers, std::vector<p2p_op>> stage(std::span<const p2p_op> ops) {
    staged_buffers staged;
    std::vector<p2p_op> on_host;
    staged.buffers.reserve(ops.size());
    on_host.reserve(ops.size());
    for (const p2p_op& op : ops) {
      detail::staging_buffer& buffer = staged.buffers.emplace_back(op.buffer);
      if (op.direction == p2p_op::kind::send) {
        buffer.template fill_from_device<Device>();
      } else {
        staged.results.push_back(staged.buffers.size() - 1);
      }
      on_host.push_back({op.direction, buffer.on_host(), op.peer, op.tag});
    }
    return {std::move(staged), std::move(on_host)};
  }

  void do_exchange(std::span<const p2p_op> ops) {
    auto [staged, on_host] = stage(ops);
    run<false>(std::move(staged), [&] { on_host_.exchange(on_host); });
  }
  comm_request do_exchange_async(std::span<const p2p_op> ops) {
    auto [staged, on_host] = stage(ops);
    return run<true>(std::move(staged), [&] { return on_host_.exchange_async(on_host); });
  }

  void do_barrier() {
    settle_pending();
    on_host_.barrier();
  }

  // A blocking operation first completes the asynchronous ones before it (their errors are kept
  // for their own wait()).
  void settle_pending() {
    if (last_) std::exchange(last_, nullptr)->complete();
  }

  HostComm on_host_;
  std::shared_ptr<operation> last_;  // the newest asynchronous operation, chained to older ones
};

}  // namespace quintet
