// accumulator_t<T>: the type kernels compute and accumulate in for element type T. double for
// double tensors, float for everything else (the 16-bit types are storage: they compute in float).
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/core/dtype.hpp>

#include <type_traits>

namespace quintet::kernels {

template <floating_element T>
using accumulator_t =
    std::conditional_t<std::is_same_v<std::remove_cv_t<T>, double>, double, float>;

// Element -> accumulator and back; bf16 and half convert explicitly, float and double are free.
template <class T>
QUINTET_HOST_DEVICE inline accumulator_t<T> widen(T value) {
  return static_cast<accumulator_t<T>>(value);
}

template <class T>
QUINTET_HOST_DEVICE inline T narrow(accumulator_t<T> value) {
  return static_cast<T>(value);
}

}  // namespace quintet::kernels
