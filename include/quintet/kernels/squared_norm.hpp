// squared_norm(exec, x): sum of x[i]^2, accumulated in double on the host. Global gradient
// clipping adds these over every gradient (each element counted once across ranks) and takes
// the square root. Host only.
#pragma once

#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/operand.hpp>

namespace quintet::kernels {

template <class Device>
struct squared_norm_engine {
  static_assert(quintet::detail::always_false<Device>,
                "squared_norm has only a host implementation: its CUDA twin is not written yet");
};

template <>
struct squared_norm_engine<host> {
  template <class T>
  static double run(const execution<host>&, const T* x, std::int64_t count) {
    return host_impl::squared_norm(x, count);
  }
};

template <device_tag Device, class X>
double squared_norm(const execution<Device>& exec, const X& x) {
  const auto xv = input_view(x);
  detail::check_operand_types<Device, decltype(xv)>();
  require_contiguous(xv, "squared_norm", "x");
  return squared_norm_engine<Device>::run(exec, xv.data(), xv.numel());
}

}  // namespace quintet::kernels
