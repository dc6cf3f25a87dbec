// all_reduce_from_host: a few values the host holds (a loss sum and count, a norm's squares, a
// batch hash) reduced in place over any communicator, staged through the communicator's device
// when that is not the host.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>

#include <type_traits>

namespace quintet {

template <communicator Comm, comm_element T>
void all_reduce_from_host(Comm& group, tensor<T, host>& values, reduce_op op) {
  using Device = typename Comm::device_type;
  if constexpr (std::is_same_v<Device, host>) {
    group.all_reduce(values, op);
  } else {
    tensor<T, Device> on_device(values.shape());
    copy(on_device, values);
    group.all_reduce(on_device, op);
    copy(values, on_device);
  }
}

}  // namespace quintet
