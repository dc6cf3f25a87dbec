// expert_exchange: the communication of expert parallelism (parallel::ep<top_k<K>>), which
// nn::moe calls between its permutation and its experts, so the layer itself never names a
// collective. The ownership of experts and the layout of the rows are plain data.
//
//   ep = 2, E = 4: rank 0 owns experts 0, 1; rank 1 owns experts 2, 3 (E / ep consecutive each)
//   rank r's permuted rows, by expert:   [ e0 | e1 | e2 | e3 ]   -> [e0 e1] to rank 0, [e2 e3] to 1
//   what rank 1 receives, by source:     [ from 0: e2 | e3 ][ from 1: e2 | e3 ]
//   groups (source, local expert), each with its expert's weights: one grouped product, no copy
//   combine: the same all_to_all_v backwards, so rank r gets its rows back in its own order
//
// Each group is exactly the rows the serial layer would give its expert from that source rank's
// tokens, in the same order; products over the groups in source order therefore compute, bit for
// bit, what a serial layer run over each source's tokens in turn computes (weight gradients
// accumulated source by source included).
//
//   exchange_counts   one all_to_all of (1 + E / ep) int64 per peer: the capacity the sender
//                     computed (every rank must agree: checked on every rank, so all throw
//                     together) and its kept rows for each of the peer's experts
//   dispatch          all_to_all_v of the rows to the experts' owners
//   combine           all_to_all_v of the experts' rows back to the tokens' ranks
// Inside a half of an overlapped pair (DualPipe's F&B, comm/overlapped_pair.hpp) each of the three
// is started asynchronously and awaited with await_collective, so the pair's other half computes
// while the rows travel; elsewhere they block.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/comm/overlapped_pair.hpp>
#include <quintet/core/error.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <concepts>
#include <cstdint>
#include <numeric>
#include <span>
#include <type_traits>
#include <vector>

namespace quintet::parallel {

// Which experts an ep rank holds: E / ep consecutive ones.
struct expert_ownership {
  std::int64_t experts = 1;
  int ranks = 1;
  int rank = 0;

  // Checked: E divides over the ranks, the rank is one of them.
  static expert_ownership of(std::int64_t experts, int ranks, int rank) {
    QUINTET_CHECK(ranks >= 1 && rank >= 0 && rank < ranks,
                  "expert ownership: rank {} of an ep group of {}", rank, ranks);
    QUINTET_CHECK(experts >= 1 && experts % ranks == 0,
                  "expert parallelism: {} experts do not divide over ep = {}", experts, ranks);
    return {experts, ranks, rank};
  }

  std::int64_t local_experts() const { return experts / ranks; }
  std::int64_t first_expert() const { return rank * local_experts(); }
  int owner_of(std::int64_t expert) const { return static_cast<int>(expert / local_experts()); }
  bool holds(std::int64_t expert) const { return owner_of(expert) == rank; }

  friend bool operator==(const expert_ownership&, const expert_ownership&) = default;
};

// The rows of one dispatch: what this rank sends per expert (its kept counts, E) and what it
// receives per (source rank, local expert) (ranks x E / ep, source-major). Plain data.
struct dispatch_counts {
  expert_ownership ownership;
  std::vector<std::int64_t> sent;      // (E)
  std::vector<std::int64_t> received;  // (ranks, E / ep)

  // Rows to rank j: its experts' counts, contiguous in the expert-ordered buffer.
  std::int64_t rows_to(int j) const {
    const auto begin = sent.begin() + j * ownership.local_experts();
    return std::reduce(begin, begin + ownership.local_experts(), std::int64_t{0});
  }
  std::int64_t rows_from(int i) const {
    const auto begin = received.begin() + i * ownership.local_experts();
    return std::reduce(begin, begin + ownership.local_experts(), std::int64_t{0});
  }
  std::int64_t sent_rows() const { return std::reduce(sent.begin(), sent.end(), std::int64_t{0}); }
  std::int64_t received_rows() const {
    return std::reduce(received.begin(), received.end(), std::int64_t{0});
  }
  // Elements per peer for all_to_all_v, rows of `width`.
  std::vector<std::int64_t> send_elements(std::int64_t width) const {
    std::vector<std::int64_t> out(static_cast<std::size_t>(ownership.ranks));
    for (int j = 0; j < ownership.ranks; ++j) out[j] = rows_to(j) * width;
    return out;
  }
  std::vector<std::int64_t> receive_elements(std::int64_t width) const {
    std::vector<std::int64_t> out(static_cast<std::size_t>(ownership.ranks));
    for (int i = 0; i < ownership.ranks; ++i) out[i] = rows_from(i) * width;
    return out;
  }
};

// The group offsets of a flat list of counts: {0, c0, c0 + c1, ...}.
inline std::vector<std::int64_t> offsets_of(std::span<const std::int64_t> counts) {
  std::vector<std::int64_t> offsets(counts.size() + 1, 0);
  for (std::size_t g = 0; g < counts.size(); ++g) offsets[g + 1] = offsets[g] + counts[g];
  return offsets;
}

template <communicator Comm>
class expert_exchange {
 public:
  using device_type = typename Comm::device_type;

  // `ep`: this rank's ep group (mesh.ep()); it must outlive the exchange.
  expert_exchange(Comm& ep, std::int64_t experts)
      : ep_(ep), ownership_(expert_ownership::of(experts, ep.size(), ep.rank())) {}

  const expert_ownership& ownership() const { return ownership_; }

  // Collective over the ep group. kept (E): the rows this rank keeps per expert; capacity: the one
  // it routed with. Returns received (ranks x E / ep): rows from rank i for local expert l at
  // [i * E / ep + l]. Every rank checks that all ranks routed with the same capacity.
  std::vector<std::int64_t> exchange_counts(std::span<const std::int64_t> kept,
                                            std::int64_t capacity) {
    const std::int64_t local = ownership_.local_experts(), block = local + 1;
    const int ranks = ownership_.ranks;
    QUINTET_CHECK(std::ssize(kept) == ownership_.experts,
                  "expert exchange: {} kept counts for {} experts", kept.size(),
                  ownership_.experts);
    std::vector<std::int64_t> outgoing(static_cast<std::size_t>(ranks * block));
    for (int j = 0; j < ranks; ++j) {
      outgoing[j * block] = capacity;
      for (std::int64_t l = 0; l < local; ++l) outgoing[j * block + 1 + l] = kept[j * local + l];
    }
    std::vector<std::int64_t> incoming(outgoing.size());
    all_to_all_host(outgoing, incoming);
    std::vector<std::int64_t> received(static_cast<std::size_t>(ranks * local));
    for (int i = 0; i < ranks; ++i) {
      QUINTET_CHECK(incoming[i * block] == capacity,
                    "expert exchange: ep rank {} routed with capacity {} and ep rank {} with {}; "
                    "every ep rank must route the same number of tokens (the capacity is computed "
                    "from it)",
                    i, incoming[i * block], ownership_.rank, capacity);
      for (std::int64_t l = 0; l < local; ++l) {
        QUINTET_CHECK(incoming[i * block + 1 + l] >= 0,
                      "expert exchange: ep rank {} sends {} rows to expert {}", i,
                      incoming[i * block + 1 + l], ownership_.first_expert() + l);
        received[i * local + l] = incoming[i * block + 1 + l];
      }
    }
    return received;
  }

  dispatch_counts counts(std::span<const std::int64_t> kept,
                         std::span<const std::int64_t> received) const {
    QUINTET_CHECK(std::ssize(kept) == ownership_.experts &&
                      std::ssize(received) == ownership_.ranks * ownership_.local_experts(),
                  "expert exchange: {} kept and {} received counts for {} experts over ep = {}",
                  kept.size(), received.size(), ownership_.experts, ownership_.ranks);
    return {ownership_, {kept.begin(), kept.end()}, {received.begin(), received.end()}};
  }

  // Collective: rows (sent rows, width) by expert -> out (received rows, width) by (source, local
  // expert). Overwrites out.
  template <class T>
  void dispatch(const dispatch_counts& counts,
                std::type_identity_t<tensor_view<const T, device_type>> rows,
                tensor_view<T, device_type> out) {
    move_rows(rows, counts.sent_rows(), counts.send_elements(width_of(rows)), out,
              counts.received_rows(), counts.receive_elements(width_of(rows)), "dispatch");
  }

  // Collective, dispatch's reverse: the experts' rows (received rows, width) -> out (sent rows,
  // width), each row back where dispatch took it from. Overwrites out.
  template <class T>
  void combine(const dispatch_counts& counts,
               std::type_identity_t<tensor_view<const T, device_type>> rows,
               tensor_view<T, device_type> out) {
    move_rows(rows, counts.received_rows(), counts.receive_elements(width_of(rows)), out,
              counts.sent_rows(), counts.send_elements(width_of(rows)), "combine");
  }

 private:
  template <class View>
  static std::int64_t width_of(const View& rows) {
    QUINTET_CHECK(rows.rank() == 2, "expert exchange: rows of shape {}; (rows, width) is needed",
                  rows.shape());
    return rows.shape()[1];
  }

  template <class T>
  void move_rows(tensor_view<const T, device_type> in, std::int64_t in_rows,
                 const std::vector<std::int64_t>& in_counts, tensor_view<T, device_type> out,
                 std::int64_t out_rows, const std::vector<std::int64_t>& out_counts,
                 const char* what) {
    const std::int64_t width = width_of(in);
    QUINTET_CHECK(in.shape()[0] == in_rows && out.rank() == 2 && out.shape()[0] == out_rows &&
                      out.shape()[1] == width,
                  "expert exchange ({}): rows {} and out {} for {} rows in and {} out of width {}",
                  what, in.shape(), out.shape(), in_rows, out_rows, width);
    if (inside_overlapped_half()) {  // the other half of a DualPipe pair runs meanwhile
      comm_request moved = ep_.all_to_all_v_async(in, in_counts, out, out_counts);
      await_collective(moved);
    } else {
      ep_.all_to_all_v(in, in_counts, out, out_counts);
    }
  }

  // One all_to_all of int64 host counts (through device memory on a device communicator).
  void all_to_all_host(const std::vector<std::int64_t>& outgoing,
                       std::vector<std::int64_t>& incoming) {
    const shape extents{static_cast<std::int64_t>(outgoing.size())};
    const tensor_view<const std::int64_t, host> sent(outgoing.data(), extents);
    const tensor_view<std::int64_t, host> arrived(incoming.data(), extents);
    if constexpr (std::same_as<device_type, host>) {
      all_to_all_counts(sent, arrived);
    } else {
      tensor<std::int64_t, device_type> on_device(extents), back(extents);
      copy(on_device, sent);
      all_to_all_counts(on_device.view(), back.view());
      copy(arrived, back);
    }
  }

  // The counts' all_to_all: blocking, or inside an overlapped half started and awaited there.
  void all_to_all_counts(tensor_view<const std::int64_t, device_type> in,
                         tensor_view<std::int64_t, device_type> out) {
    if (!inside_overlapped_half()) {
      ep_.all_to_all(in, out);
      return;
    }
    const std::vector<std::int64_t> each(static_cast<std::size_t>(ep_.size()),
                                         in.numel() / ep_.size());
    comm_request moved = ep_.all_to_all_v_async(in, each, out, each);
    await_collective(moved);
  }

  Comm& ep_;
  expert_ownership ownership_;
};

// The exchange a layer of Plan on Mesh uses: expert_exchange over the mesh's ep group under
// ep<...>; none (the serial layer: every expert local, nothing moves) otherwise.
struct no_expert_exchange {};

template <class Plan, class Mesh>
struct expert_exchange_for {
  using type = no_expert_exchange;
};
template <class Plan, mesh_like Mesh>
requires uses_expert_parallel<Plan>
struct expert_exchange_for<Plan, Mesh> {
  using type = expert_exchange<communicator_of<Mesh>>;
};

}  // namespace quintet::parallel
