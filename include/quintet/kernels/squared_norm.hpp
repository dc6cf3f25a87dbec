// squared_norm(exec, x): sum of x[i]^2, accumulated in double on the host, in fixed chunks of
// host_impl::squared_norm_chunk elements whose sums are added in order, the chunks split over the
// context's threads.
// squared_norms(exec, list) gives each tensor of a list the same number in one pass (the chunks of
// every tensor split over the threads together; on cuda two launches per group of tensors and one
// synchronisation for all, kernels/multi_tensor.hpp). Global gradient clipping adds these over
// every gradient (each element counted once across ranks) and takes the square root. Host here;
// cuda (also double, also a fixed order) in <quintet/kernels/cuda/squared_norm.cuh>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/kernels/operand.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
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
  // Each chunk of each tensor summed (the chunks over the threads), then each tensor's chunk sums
  // added in order from 0: a tensor's bits do not depend on the threads or on the list.
  template <class T>
  static std::vector<double> run(const execution<host>& exec, std::span<const T* const> xs,
                                 std::span<const std::int64_t> counts) {
    constexpr std::int64_t chunk = host_impl::squared_norm_chunk;
    const std::vector<std::int64_t> first = multi_tensor::first_units(counts, chunk);
    const int listed = static_cast<int>(xs.size());
    std::vector<double> sums(static_cast<std::size_t>(first.back()));
    const auto sum_chunks = [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t u = begin; u < end; ++u) {
        const auto at = multi_tensor::locate(first.data(), listed, chunk, u);
        const auto t = static_cast<std::size_t>(at.tensor);
        sums[static_cast<std::size_t>(u)] = host_impl::squared_norm_of_chunk(
            xs[t] + at.begin, std::min(chunk, counts[t] - at.begin));
      }
    };
    constexpr std::int64_t grain = execution<host>::grain_for(chunk);
    if (exec.threads() == 1 || first.back() < 2 * grain)
      sum_chunks(0, first.back());
    else
      exec.parallel_for(first.back(), grain, sum_chunks);
    std::vector<double> totals(xs.size(), 0.0);
    for (std::size_t t = 0; t < xs.size(); ++t)
      for (std::int64_t u = first[t]; u < first[t + 1]; ++u)
        totals[t] += sums[static_cast<std::size_t>(u)];
    return totals;
  }
};

// The squared norm of each tensor of the list (contiguous views), in list order.
template <class T, device_tag Device>
std::vector<double> squared_norms(const execution<Device>& exec,
                                  const std::vector<tensor_view<const T, Device>>& list) {
  std::vector<const T*> xs;
  std::vector<std::int64_t> counts;
  xs.reserve(list.size());
  counts.reserve(list.size());
  for (const auto& x : list) {
    require_contiguous(x, "squared_norms", "each tensor");
    xs.push_back(x.data());
    counts.push_back(x.numel());
  }
  return squared_norm_engine<Device>::template run<T>(exec, xs, counts);
}

template <device_tag Device, class X>
double squared_norm(const execution<Device>& exec, const X& x) {
  const auto xv = input_view(x);
  detail::check_operand_types<Device, decltype(xv)>();
  require_contiguous(xv, "squared_norm", "x");
  using T = std::remove_const_t<typename decltype(xv)::value_type>;
  const T* data = xv.data();
  const std::int64_t count = xv.numel();
  return squared_norm_engine<Device>::template run<T>(exec, std::span<const T* const>(&data, 1),
                                                      std::span<const std::int64_t>(&count, 1))[0];
}

}  // namespace quintet::kernels
