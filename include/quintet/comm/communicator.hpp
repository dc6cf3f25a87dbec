// The communicator concept: the collectives and point-to-point operations every backend
// (thread_comm, mpi_comm, nccl_comm, counting_comm) provides on tensors of its device, and
// communicator_api, which turns typed tensor arguments into the raw buffers backends implement.
#pragma once

#include <quintet/comm/comm_error.hpp>
#include <quintet/comm/comm_request.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_like.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace quintet {

// How all_reduce and reduce_scatter combine the ranks' elements. 16-bit floats are combined in
// fp32 and rounded once; `average` is the sum divided by the number of ranks (truncating for
// integers, as NCCL's ncclAvg does).
enum class reduce_op : std::uint8_t { sum, max, min, average };

constexpr std::string_view name_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::max:
      return "max";
    case reduce_op::min:
      return "min";
    case reduce_op::average:
      return "average";
  }
  return "unknown";
}

// The element types communicators carry: float, double, bf16, half, int32, int64.
template <class T>
concept comm_element = element_type<T>;

// A contiguous run of elements as a backend sees it: typed at run time, so one backend function
// serves every element type. `stream` is the CUDA stream handle for cuda buffers, else null.
struct comm_buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  dtype type = dtype::f32;
  int device_index = 0;
  void* stream = nullptr;

  std::size_t bytes() const { return static_cast<std::size_t>(count) * size_of(type); }
};

namespace detail {

template <class View>
comm_buffer comm_buffer_of(const View& view, std::string_view operation, std::string_view role) {
  QUINTET_CHECK(view.is_contiguous(), "{}: the {} buffer of shape {} must be contiguous", operation,
                role, view.shape());
  comm_buffer buffer;
  // Communicators never write through an input buffer; the const is dropped only to share a type.
  buffer.data = const_cast<void*>(static_cast<const void*>(view.data()));
  buffer.count = view.numel();
  buffer.type = dtype_of<typename View::value_type>;
  buffer.device_index = view.device_index();
  if constexpr (std::same_as<typename View::device_type, cuda>)
    buffer.stream = view.stream().handle;
  return buffer;
}

// A contiguous view of a raw buffer with its element type restored; returns fn(view).
template <class Device, bool Writable, class Fn>
decltype(auto) with_typed_view(const comm_buffer& buffer, Fn&& fn) {
  auto make = [&]<class T>(T*) -> decltype(auto) {
    using element = std::conditional_t<Writable, T, const T>;
    typename Device::stream_type stream{};
    if constexpr (std::same_as<Device, cuda>) stream.handle = buffer.stream;
    const quintet::shape extents{buffer.count};
    return fn(tensor_view<element, Device>(static_cast<element*>(buffer.data), extents,
                                           extents.row_major_strides(), buffer.device_index,
                                           stream));
  };
  switch (buffer.type) {
    case dtype::f32:
      return make(static_cast<float*>(nullptr));
    case dtype::f64:
      return make(static_cast<double*>(nullptr));
    case dtype::bf16:
      return make(static_cast<bf16*>(nullptr));
    case dtype::f16:
      return make(static_cast<half*>(nullptr));
    case dtype::i32:
      return make(static_cast<std::int32_t*>(nullptr));
    case dtype::i64:
      return make(static_cast<std::int64_t*>(nullptr));
  }
  QUINTET_FAIL("communicator: unknown element type {}", static_cast<int>(buffer.type));
}

template <class Device, class Fn>
decltype(auto) with_typed_views(const comm_buffer& in, const comm_buffer& out, Fn&& fn) {
  return with_typed_view<Device, false>(in, [&](auto input) -> decltype(auto) {
    using T = typename decltype(input)::value_type;
    const quintet::shape extents{out.count};
    typename Device::stream_type stream{};
    if constexpr (std::same_as<Device, cuda>) stream.handle = out.stream;
    return fn(input, tensor_view<T, Device>(static_cast<T*>(out.data), extents,
                                            extents.row_major_strides(), out.device_index, stream));
  });
}

inline bool buffers_overlap(const comm_buffer& a, const comm_buffer& b) {
  const auto* a_begin = static_cast<const std::byte*>(a.data);
  const auto* b_begin = static_cast<const std::byte*>(b.data);
  return a.count > 0 && b.count > 0 && a_begin < b_begin + b.bytes() &&
         b_begin < a_begin + a.bytes();
}

}  // namespace detail

// One send or receive of a batch given to exchange(): the batch is posted at once, so ranks that
// send to each other (pipeline stages trading activations and gradients) do not deadlock.
struct p2p_op {
  enum class kind : std::uint8_t { send, recv };
  kind direction = kind::send;
  comm_buffer buffer;
  int peer = 0;
  int tag = 0;

  template <class Tensor>
  requires tensor_like<std::remove_cvref_t<Tensor>>
  static p2p_op send(const Tensor& source, int peer, int tag = 0) {
    return {kind::send, detail::comm_buffer_of(view_of(source), "send", "source"), peer, tag};
  }
  template <class Tensor>
  requires tensor_like<std::remove_cvref_t<Tensor>>
  static p2p_op recv(Tensor&& destination, int peer, int tag = 0) {
    const auto view = view_of(destination);
    static_assert(mutable_tensor_like<decltype(view)>, "p2p_op::recv needs a writable tensor");
    return {kind::recv, detail::comm_buffer_of(view, "recv", "destination"), peer, tag};
  }
};

// communicator<C> requires, for tensors (or views) of C::device_type of any comm_element type:
//   c.rank(), c.size()                      this rank's index in [0, size) and the rank count
//   c.all_reduce(in, out, op)               out = op over ranks of in (same count everywhere)
//   c.all_reduce(inout, op)                 the same, in place
//   c.reduce_scatter(in, out, op)           in holds size*count elements; out gets this rank's
//                                           count-element block of the reduction
//   c.all_gather(in, out)                   out (size*count) = every rank's in (count), in rank
//   order c.broadcast(inout, root)                every rank's inout = root's inout
//   c.all_to_all(in, out)                   block j of in goes to rank j; block i of out came
//                                           from rank i (count divisible by size)
//   c.all_to_all_v(in, in_counts, out, out_counts)   the same with per-peer counts, packed
//   c.send(in, peer, tag), c.recv(out, peer, tag)    blocking point to point, matched by tag
//   c.exchange(ops)                         a batch of p2p_op sends and receives posted together
//   c.barrier()                             returns once every rank has entered it
//   c.split(color, key)                     collective: a communicator of the same type over
//                                           the ranks with the same color, ordered by key
// and the asynchronous forms, which start the operation and return a comm_request to wait():
//   c.all_reduce_async(in, out, op), c.all_reduce_async(inout, op),
//   c.reduce_scatter_async(in, out, op), c.all_gather_async(in, out),
//   c.all_to_all_v_async(in, in_counts, out, out_counts), c.exchange_async(ops)
// Buffers are contiguous. Every rank of a communicator calls its collectives in the same order.
// Operations on one communicator, asynchronous or not, complete in the order they were issued: a
// blocking call first completes the pending ones, and waiting a request completes those before it.
template <class C>
concept communicator = device_tag<typename C::device_type> &&
    requires(C& c, const C& cc, tensor_view<const float, typename C::device_type> in,
             tensor_view<float, typename C::device_type> out, std::span<const std::int64_t> counts,
             std::span<const p2p_op> ops) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  c.all_reduce(in, out, reduce_op::sum);
  c.all_reduce(out, reduce_op::sum);
  c.reduce_scatter(in, out, reduce_op::sum);
  c.all_gather(in, out);
  c.broadcast(out, 0);
  c.all_to_all(in, out);
  c.all_to_all_v(in, counts, out, counts);
  c.send(in, 0, 0);
  c.recv(out, 0, 0);
  c.exchange(ops);
  c.barrier();
  { c.split(0, 0) } -> std::same_as<C>;
  { c.all_reduce_async(in, out, reduce_op::sum) } -> std::same_as<comm_request>;
  { c.all_reduce_async(out, reduce_op::sum) } -> std::same_as<comm_request>;
  { c.reduce_scatter_async(in, out, reduce_op::sum) } -> std::same_as<comm_request>;
  { c.all_gather_async(in, out) } -> std::same_as<comm_request>;
  { c.all_to_all_v_async(in, counts, out, counts) } -> std::same_as<comm_request>;
  { c.exchange_async(ops) } -> std::same_as<comm_request>;
};

// communicator_api<Derived, Device>: the typed front end shared by the backends. It checks what
// one rank can check alone (contiguity, element types, counts that must divide, roots and peers
// in range) and forwards raw buffers to Derived's do_* functions:
//   do_all_reduce(in, out, op)  do_reduce_scatter(in, out, op)  do_all_gather(in, out)
//   do_broadcast(inout, root)   do_all_to_all(in, out)
//   do_all_to_all_v(in, in_counts, out, out_counts)  do_exchange(ops)  do_barrier()
// and, returning comm_request, do_all_reduce_async  do_reduce_scatter_async  do_all_gather_async
// do_all_to_all_v_async  do_exchange_async (same arguments; the spans need not outlive the call).
// Checks that need the other ranks (the same count everywhere) are the backend's.
template <class Derived, device_tag Device>
class communicator_api {
 public:
  using device_type = Device;

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  void all_reduce(const In& in, Out&& out, reduce_op op = reduce_op::sum) {
    const auto [input, output] = all_reduce_buffers(view_of(in), view_of(out));
    self().do_all_reduce(input, output, op);
  }

  template <class InOut>
  requires tensor_like<std::remove_cvref_t<InOut>>
  void all_reduce(InOut&& inout, reduce_op op = reduce_op::sum) {
    const comm_buffer buffer = writable(view_of(inout), "all_reduce", "in-out");
    self().do_all_reduce(buffer, buffer, op);
  }

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  void reduce_scatter(const In& in, Out&& out, reduce_op op = reduce_op::sum) {
    const auto [input, output] = reduce_scatter_buffers(view_of(in), view_of(out));
    self().do_reduce_scatter(input, output, op);
  }

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  void all_gather(const In& in, Out&& out) {
    const auto [input, output] = all_gather_buffers(view_of(in), view_of(out));
    self().do_all_gather(input, output);
  }

  template <class InOut>
  requires tensor_like<std::remove_cvref_t<InOut>>
  void broadcast(InOut&& inout, int root) {
    QUINTET_CHECK(root >= 0 && root < size(),
                  "broadcast: root {} is not a rank of a size-{} "
                  "communicator",
                  root, size());
    self().do_broadcast(writable(view_of(inout), "broadcast", "in-out"), root);
  }

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  void all_to_all(const In& in, Out&& out) {
    const auto [input, output] = in_out(view_of(in), view_of(out), "all_to_all");
    QUINTET_CHECK(input.count == output.count,
                  "all_to_all: input has {} elements but output has {}", input.count, output.count);
    QUINTET_CHECK(input.count % size() == 0,
                  "all_to_all: {} elements do not split into {} equal blocks", input.count, size());
    // The name is an argument: nvcc's format_message warns about a format with none.
    QUINTET_CHECK(!detail::buffers_overlap(input, output), "{}: input and output must not overlap",
                  "all_to_all");
    self().do_all_to_all(input, output);
  }

  // in_counts[j] elements go to rank j, packed in rank order at the front of `in`; out_counts[i]
  // elements arrive from rank i, packed likewise in `out`. Buffers may be larger than the sums.
  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  void all_to_all_v(const In& in, std::span<const std::int64_t> in_counts, Out&& out,
                    std::span<const std::int64_t> out_counts) {
    const auto [input, output] =
        all_to_all_v_buffers(view_of(in), in_counts, view_of(out), out_counts);
    self().do_all_to_all_v(input, in_counts, output, out_counts);
  }

  template <class In>
  requires tensor_like<std::remove_cvref_t<In>>
  void send(const In& in, int peer, int tag = 0) {
    const p2p_op op = p2p_op::send(in, peer, tag);
    exchange(std::span<const p2p_op>(&op, 1));
  }

  template <class Out>
  requires tensor_like<std::remove_cvref_t<Out>>
  void recv(Out&& out, int peer, int tag = 0) {
    const p2p_op op = p2p_op::recv(out, peer, tag);
    exchange(std::span<const p2p_op>(&op, 1));
  }

  void exchange(std::span<const p2p_op> ops) {
    check_peers(ops);
    self().do_exchange(ops);
  }

  // The asynchronous forms: the same checks (a bad argument throws here), then the operation is
  // started and a comm_request returned; its result (or error) is there once wait() returns.
  // Buffers must stay alive until then; counts and the ops list are copied.
  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  [[nodiscard]] comm_request all_reduce_async(const In& in, Out&& out,
                                              reduce_op op = reduce_op::sum) {
    const auto [input, output] = all_reduce_buffers(view_of(in), view_of(out));
    return self().do_all_reduce_async(input, output, op);
  }

  template <class InOut>
  requires tensor_like<std::remove_cvref_t<InOut>>
  [[nodiscard]] comm_request all_reduce_async(InOut&& inout, reduce_op op = reduce_op::sum) {
    const comm_buffer buffer = writable(view_of(inout), "all_reduce", "in-out");
    return self().do_all_reduce_async(buffer, buffer, op);
  }

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  [[nodiscard]] comm_request reduce_scatter_async(const In& in, Out&& out,
                                                  reduce_op op = reduce_op::sum) {
    const auto [input, output] = reduce_scatter_buffers(view_of(in), view_of(out));
    return self().do_reduce_scatter_async(input, output, op);
  }

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  [[nodiscard]] comm_request all_gather_async(const In& in, Out&& out) {
    const auto [input, output] = all_gather_buffers(view_of(in), view_of(out));
    return self().do_all_gather_async(input, output);
  }

  template <class In, class Out>
  requires tensor_like<std::remove_cvref_t<In>> && tensor_like<std::remove_cvref_t<Out>>
  [[nodiscard]] comm_request all_to_all_v_async(const In& in,
                                                std::span<const std::int64_t> in_counts, Out&& out,
                                                std::span<const std::int64_t> out_counts) {
    const auto [input, output] =
        all_to_all_v_buffers(view_of(in), in_counts, view_of(out), out_counts);
    return self().do_all_to_all_v_async(input, in_counts, output, out_counts);
  }

  [[nodiscard]] comm_request exchange_async(std::span<const p2p_op> ops) {
    check_peers(ops);
    return self().do_exchange_async(ops);
  }

  void barrier() { self().do_barrier(); }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  int size() const { return static_cast<const Derived&>(*this).size(); }

  template <class InView, class OutView>
  std::pair<comm_buffer, comm_buffer> all_reduce_buffers(const InView& in, const OutView& out) {
    const auto buffers = in_out(in, out, "all_reduce");
    QUINTET_CHECK(buffers.first.count == buffers.second.count,
                  "all_reduce: input has {} elements but output has {}", buffers.first.count,
                  buffers.second.count);
    return buffers;
  }

  template <class InView, class OutView>
  std::pair<comm_buffer, comm_buffer> reduce_scatter_buffers(const InView& in, const OutView& out) {
    const auto buffers = in_out(in, out, "reduce_scatter");
    QUINTET_CHECK(buffers.first.count == buffers.second.count * size(),
                  "reduce_scatter: input has {} elements, not size {} x output count {}",
                  buffers.first.count, size(), buffers.second.count);
    return buffers;
  }

  template <class InView, class OutView>
  std::pair<comm_buffer, comm_buffer> all_gather_buffers(const InView& in, const OutView& out) {
    const auto buffers = in_out(in, out, "all_gather");
    QUINTET_CHECK(buffers.second.count == buffers.first.count * size(),
                  "all_gather: output has {} elements, not size {} x input count {}",
                  buffers.second.count, size(), buffers.first.count);
    return buffers;
  }

  template <class InView, class OutView>
  std::pair<comm_buffer, comm_buffer> all_to_all_v_buffers(
      const InView& in, std::span<const std::int64_t> in_counts, const OutView& out,
      std::span<const std::int64_t> out_counts) {
    const auto buffers = in_out(in, out, "all_to_all_v");
    check_counts(in_counts, buffers.first.count, "in");
    check_counts(out_counts, buffers.second.count, "out");
    QUINTET_CHECK(!detail::buffers_overlap(buffers.first, buffers.second),
                  "{}: input and output must not overlap", "all_to_all_v");
    return buffers;
  }

  void check_peers(std::span<const p2p_op> ops) const {
    for (const p2p_op& op : ops) {
      QUINTET_CHECK(op.peer >= 0 && op.peer < size(),
                    "exchange: peer {} is not a rank of a size-{} communicator", op.peer, size());
      QUINTET_CHECK(op.buffer.data != nullptr || op.buffer.count == 0,
                    "exchange: a {}-element buffer has no memory", op.buffer.count);
    }
  }

  template <class InView, class OutView>
  static std::pair<comm_buffer, comm_buffer> in_out(const InView& in, const OutView& out,
                                                    std::string_view operation) {
    static_assert(std::same_as<typename InView::device_type, Device> &&
                      std::same_as<typename OutView::device_type, Device>,
                  "communicator: tensors must live on the communicator's device type");
    static_assert(std::same_as<typename InView::value_type, typename OutView::value_type>,
                  "communicator: input and output must have the same element type");
    return {detail::comm_buffer_of(in, operation, "input"), writable(out, operation, "output")};
  }

  template <class View>
  static comm_buffer writable(const View& view, std::string_view operation, std::string_view role) {
    static_assert(std::same_as<typename View::device_type, Device>,
                  "communicator: tensors must live on the communicator's device type");
    static_assert(mutable_tensor_like<View>, "communicator: the output tensor must be writable");
    return detail::comm_buffer_of(view, operation, role);
  }

  void check_counts(std::span<const std::int64_t> counts, std::int64_t capacity,
                    std::string_view side) const {
    QUINTET_CHECK(std::ssize(counts) == size(),
                  "all_to_all_v: {} {}_counts given for a size-{} communicator", counts.size(),
                  side, size());
    std::int64_t total = 0;
    for (const std::int64_t count : counts) {
      QUINTET_CHECK(count >= 0, "all_to_all_v: {}_counts holds a negative count {}", side, count);
      total += count;
    }
    QUINTET_CHECK(total <= capacity, "all_to_all_v: {}_counts sum to {} but the {} buffer holds {}",
                  side, total, side == "in" ? "input" : "output", capacity);
  }
};

}  // namespace quintet
