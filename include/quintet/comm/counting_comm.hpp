// counting_comm<Comm>: forwards every operation to another communicator and records, per axis
// label and per operation, how many calls were made and how many bytes they moved, so tests can
// hold a parallel strategy's traffic to the published formulas.
#pragma once

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace quintet {

enum class comm_operation : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  all_to_all,
  all_to_all_v,
  send,
  recv,
  barrier,
  split
};

constexpr std::string_view name_of(comm_operation op) {
  constexpr std::string_view names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                        "all_to_all", "all_to_all_v",   "send",       "recv",
                                        "barrier",    "split"};
  return names[static_cast<int>(op)];
}

// What one rank's calls of one operation on one axis added up to.
//   bytes      the data size S as nccl-tests counts it (the numerator of algbw): the buffer for
//              all_reduce and broadcast; the whole array (size x block) for reduce_scatter,
//              all_gather and all_to_all; the bytes this rank sends for all_to_all_v and send,
//              receives for recv.
//   bus_bytes  S times the nccl-tests bus factor: what each rank puts on the wire in a
//              bandwidth-optimal (ring) algorithm. 2(n-1)/n all_reduce; (n-1)/n reduce_scatter,
//              all_gather, all_to_all; 1 broadcast, send, recv; all_to_all_v: the bytes sent to
//              other ranks exactly.
struct comm_tally {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  double bus_bytes = 0;

  comm_tally& operator+=(const comm_tally& other) {
    calls += other.calls;
    bytes += other.bytes;
    bus_bytes += other.bus_bytes;
    return *this;
  }
  friend bool operator==(const comm_tally&, const comm_tally&) = default;
};

// The records of one rank (or of several counting_comms that share it), keyed by axis label and
// operation. Thread-safe, so one ledger may be shared across threads too.
class comm_ledger {
 public:
  void record(std::string_view axis, comm_operation op, std::int64_t bytes, double bus_bytes) {
    const std::lock_guard lock(mutex_);
    comm_tally& tally = tallies_[{std::string(axis), op}];
    tally += comm_tally{1, bytes, bus_bytes};
  }

  comm_tally tally(std::string_view axis, comm_operation op) const {
    const std::lock_guard lock(mutex_);
    const auto found = tallies_.find({std::string(axis), op});
    return found == tallies_.end() ? comm_tally{} : found->second;
  }

  // Every axis's calls of `op`.
  comm_tally total(comm_operation op) const {
    const std::lock_guard lock(mutex_);
    comm_tally sum;
    for (const auto& [key, tally] : tallies_) {
      if (key.second == op) sum += tally;
    }
    return sum;
  }

  // Every operation on `axis`.
  comm_tally axis_total(std::string_view axis) const {
    const std::lock_guard lock(mutex_);
    comm_tally sum;
    for (const auto& [key, tally] : tallies_) {
      if (key.first == axis) sum += tally;
    }
    return sum;
  }

  std::map<std::pair<std::string, comm_operation>, comm_tally> tallies() const {
    const std::lock_guard lock(mutex_);
    return tallies_;
  }

  void clear() {
    const std::lock_guard lock(mutex_);
    tallies_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, comm_operation>, comm_tally> tallies_;
};

template <communicator Comm>
class counting_comm : public communicator_api<counting_comm<Comm>, typename Comm::device_type> {
  using device = typename Comm::device_type;

 public:
  explicit counting_comm(Comm inner, std::string axis = "world",
                         std::shared_ptr<comm_ledger> ledger = std::make_shared<comm_ledger>())
      : inner_(std::move(inner)), axis_(std::move(axis)), ledger_(std::move(ledger)) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }

  Comm& inner() { return inner_; }
  comm_ledger& ledger() { return *ledger_; }
  const std::shared_ptr<comm_ledger>& shared_ledger() const { return ledger_; }
  const std::string& axis_label() const { return axis_; }
  // device_mesh names each axis's communicator through this.
  void set_axis_label(std::string_view axis) { axis_ = std::string(axis); }

  // The new communicator records into the same ledger, under this one's label until relabelled.
  counting_comm split(int color, int key) {
    ledger_->record(axis_, comm_operation::split, 0, 0);
    return counting_comm(inner_.split(color, key), axis_, ledger_);
  }

 private:
  friend class communicator_api<counting_comm<Comm>, device>;

  double factor(double numerator) const { return numerator * (size() - 1) / size(); }

  // Asynchronous forms are recorded when issued, exactly as the blocking ones.
  void do_all_reduce(comm_buffer in, comm_buffer out, reduce_op op) {
    record_all_reduce(in);
    forward_all_reduce(in, out, [&](auto&&... args) { inner_.all_reduce(args..., op); });
  }
  comm_request do_all_reduce_async(comm_buffer in, comm_buffer out, reduce_op op) {
    record_all_reduce(in);
    return forward_all_reduce(in, out,
                              [&](auto&&... args) { return inner_.all_reduce_async(args..., op); });
  }

  void do_reduce_scatter(comm_buffer in, comm_buffer out, reduce_op op) {
    record_reduce_scatter(in);
    detail::with_typed_views<device>(
        in, out, [&](auto input, auto output) { inner_.reduce_scatter(input, output, op); });
  }
  comm_request do_reduce_scatter_async(comm_buffer in, comm_buffer out, reduce_op op) {
    record_reduce_scatter(in);
    return detail::with_typed_views<device>(in, out, [&](auto input, auto output) {
      return inner_.reduce_scatter_async(input, output, op);
    });
  }

  void do_all_gather(comm_buffer in, comm_buffer out) {
    record_all_gather(out);
    detail::with_typed_views<device>(
        in, out, [&](auto input, auto output) { inner_.all_gather(input, output); });
  }
  comm_request do_all_gather_async(comm_buffer in, comm_buffer out) {
    record_all_gather(out);
    return detail::with_typed_views<device>(
        in, out, [&](auto input, auto output) { return inner_.all_gather_async(input, output); });
  }

  void do_broadcast(comm_buffer inout, int root) {
    const auto bytes = static_cast<std::int64_t>(inout.bytes());
    ledger_->record(axis_, comm_operation::broadcast, bytes, static_cast<double>(bytes));
    detail::with_typed_view<device, true>(inout,
                                          [&](auto buffer) { inner_.broadcast(buffer, root); });
  }

  void do_all_to_all(comm_buffer in, comm_buffer out) {
    const auto bytes = static_cast<std::int64_t>(in.bytes());
    ledger_->record(axis_, comm_operation::all_to_all, bytes, factor(bytes));
    detail::with_typed_views<device>(
        in, out, [&](auto input, auto output) { inner_.all_to_all(input, output); });
  }

  void do_all_to_all_v(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                       std::span<const std::int64_t> out_counts) {
    record_all_to_all_v(in, in_counts);
    detail::with_typed_views<device>(in, out, [&](auto input, auto output) {
      inner_.all_to_all_v(input, in_counts, output, out_counts);
    });
  }
  comm_request do_all_to_all_v_async(comm_buffer in, std::span<const std::int64_t> in_counts,
                                     comm_buffer out, std::span<const std::int64_t> out_counts) {
    record_all_to_all_v(in, in_counts);
    return detail::with_typed_views<device>(in, out, [&](auto input, auto output) {
      return inner_.all_to_all_v_async(input, in_counts, output, out_counts);
    });
  }

  void do_exchange(std::span<const p2p_op> ops) {
    record_exchange(ops);
    inner_.exchange(ops);
  }
  comm_request do_exchange_async(std::span<const p2p_op> ops) {
    record_exchange(ops);
    return inner_.exchange_async(ops);
  }

  void do_barrier() {
    ledger_->record(axis_, comm_operation::barrier, 0, 0);
    inner_.barrier();
  }

  void record_all_reduce(const comm_buffer& in) {
    const auto bytes = static_cast<std::int64_t>(in.bytes());
    ledger_->record(axis_, comm_operation::all_reduce, bytes, factor(2.0 * bytes));
  }

  void record_reduce_scatter(const comm_buffer& in) {
    const auto bytes = static_cast<std::int64_t>(in.bytes());
    ledger_->record(axis_, comm_operation::reduce_scatter, bytes, factor(bytes));
  }

  void record_all_gather(const comm_buffer& out) {
    const auto bytes = static_cast<std::int64_t>(out.bytes());
    ledger_->record(axis_, comm_operation::all_gather, bytes, factor(bytes));
  }

  void record_all_to_all_v(const comm_buffer& in, std::span<const std::int64_t> in_counts) {
    const auto element = static_cast<std::int64_t>(size_of(in.type));
    const std::int64_t sent =
        std::accumulate(in_counts.begin(), in_counts.end(), std::int64_t{0}) * element;
    const std::int64_t to_self = in_counts[rank()] * element;
    ledger_->record(axis_, comm_operation::all_to_all_v, sent, static_cast<double>(sent - to_self));
  }

  void record_exchange(std::span<const p2p_op> ops) {
    for (const p2p_op& op : ops) {
      const auto bytes = static_cast<std::int64_t>(op.buffer.bytes());
      const bool is_send = op.direction == p2p_op::kind::send;
      ledger_->record(axis_, is_send ? comm_operation::send : comm_operation::recv, bytes,
                      static_cast<double>(bytes));
    }
  }

  // In place when the buffers are one: calls call(inout) or call(input, output).
  template <class Call>
  decltype(auto) forward_all_reduce(const comm_buffer& in, const comm_buffer& out, Call call) {
    if (in.data == out.data) return detail::with_typed_view<device, true>(out, call);
    return detail::with_typed_views<device>(in, out, call);
  }

  Comm inner_;
  std::string axis_;
  std::shared_ptr<comm_ledger> ledger_;
};

}  // namespace quintet
