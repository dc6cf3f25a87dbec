// squared_norm(exec, x): sum of x[i]^2, accumulated in double on the host, in fixed chunks whose
// sums are added in order (host_impl::squared_norm), the chunks split over the context's threads.
// Global gradient clipping adds these over every gradient (each element counted once across
// ranks) and takes the square root. Host here; cuda (also double, also a fixed order) in
// <quintet/kernels/cuda/squared_norm.cuh>.
#pragma once

#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/operand.hpp>

#include <cstdint>
#include <vector>

namespace quintet::kernels {

template <class Device>
struct squared_norm_engine {
  static_assert(quintet::detail::always_false<Device>,
                "squared_norm on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/squared_norm.cuh> in a translation unit compiled by nvcc");
};

template <>
struct squared_norm_engine<host> {
  // The chunks' sums over the threads, then added in order: host_impl::squared_norm's bits.
  template <class T>
  static double run(const execution<host>& exec, const T* x, std::int64_t count) {
    constexpr std::int64_t grain = execution<host>::grain_for(host_impl::squared_norm_chunk);
    const std::int64_t chunks = host_impl::squared_norm_chunks(count);
    if (exec.threads() == 1 || chunks < 2 * grain) return host_impl::squared_norm(x, count);
    std::vector<double> sums(static_cast<std::size_t>(chunks));
    exec.parallel_for(chunks, grain, [&](std::int64_t first, std::int64_t last) {
      host_impl::squared_norm_chunk_sums(x, count, first, last, sums.data());
    });
    double sum = 0.0;
    for (const double chunk_sum : sums) sum += chunk_sum;
    return sum;
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
