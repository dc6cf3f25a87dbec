// all_gather_from_host: a few values the host holds (each rank's positions, counts) gathered over
// any communicator in rank order, staged through the communicator's device when that is not the
// host.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>

#include <type_traits>

namespace quintet {

// in (count) on every rank -> (size, count): row r is rank r's in.
template <communicator Comm, comm_element T>
tensor<T, host> all_gather_from_host(Comm& group, const tensor<T, host>& in) {
  using Device = typename Comm::device_type;
  tensor<T, host> out(shape{group.size(), in.numel()});
  if constexpr (std::is_same_v<Device, host>) {
    group.all_gather(in, out);
  } else {
    tensor<T, Device> sent(in.shape()), received(out.shape());
    copy(sent, in);
    group.all_gather(sent, received);
    copy(out, received);
  }
  return out;
}

}  // namespace quintet
