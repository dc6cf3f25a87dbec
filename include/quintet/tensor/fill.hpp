// fill(dst, value): every element of a tensor or view set to one value.
#pragma once

#include <quintet/tensor/device_memory.hpp>
#include <quintet/tensor/layout.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>

namespace quintet {

// fill_engine<Device>::run(view, value): the device's implementation. The cuda one lives in
// <quintet/tensor/cuda/fill.cuh> and needs nvcc.
template <class Device>
struct fill_engine {
  static_assert(detail::always_false<Device>,
                "fill on this device needs its implementation: for quintet::cuda include "
                "<quintet/tensor/cuda/fill.cuh> in a translation unit compiled by nvcc");
};

template <>
struct fill_engine<host> {
  template <class T>
  static void run(tensor_view<T, host> dst, T value) {
    const int rank = dst.rank();
    const std::int64_t length = rank > 0 ? dst.shape()[rank - 1] : 1;
    const std::int64_t step = rank > 0 ? dst.strides()[rank - 1] : 1;
    detail::for_each_row(dst.shape(), dst.strides(), [&](const auto&, std::int64_t offset) {
      T* row = dst.data() + offset;
      for (std::int64_t i = 0; i < length; ++i) row[i * step] = value;
    });
  }
};

template <class Dst>
  requires mutable_tensor_like<decltype(view_of(std::declval<Dst&>()))>
void fill(Dst&& destination, typename std::remove_cvref_t<Dst>::value_type value) {
  const auto dst = view_of(destination);
  fill_engine<typename decltype(dst)::device_type>::run(dst, value);
}

}  // namespace quintet
