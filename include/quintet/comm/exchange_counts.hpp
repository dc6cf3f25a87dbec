// exchange_counts(comm, send_counts): how many elements every peer will send this rank, learnt
// from how many each rank sends every peer (one all_to_all of int64 counts): the out_counts that
// all_to_all_v needs when only the sending side knows the split (MoE dispatch).
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

namespace quintet {

// send_counts[j]: the elements this rank sends to rank j. Returns received[i]: the elements rank i
// sends to this rank. Collective. A cuda communicator moves the counts through device memory and
// returns once they are on the host.
template <communicator Comm>
std::vector<std::int64_t> exchange_counts(Comm& comm, std::span<const std::int64_t> send_counts) {
  using device = typename Comm::device_type;
  const int n = comm.size();
  QUINTET_CHECK(std::ssize(send_counts) == n,
                "exchange_counts: {} send counts given for a size-{} communicator",
                send_counts.size(), n);
  std::vector<std::int64_t> received(static_cast<std::size_t>(n));
  const quintet::shape extents{n};
  const tensor_view<const std::int64_t, host> sent_view(send_counts.data(), extents);
  const tensor_view<std::int64_t, host> received_view(received.data(), extents);
  if constexpr (std::same_as<device, host>) {
    comm.all_to_all(sent_view, received_view);
  } else {
    tensor<std::int64_t, device> sent(extents), arrived(extents);
    copy(sent, sent_view);
    comm.all_to_all(sent, arrived);
    copy(received_view, arrived);
  }
  return received;
}

}  // namespace quintet
