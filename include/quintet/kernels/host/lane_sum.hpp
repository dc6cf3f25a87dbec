// lane_sum(n, term): sum_{j < n} term(j) in 16 independent partial sums combined pairwise. The
// lanes break the loop-carried dependency of one running sum, so g++ -O2 vectorises row
// reductions (layer norm, softmax), and the rounding error grows with n / 16, not n.
#pragma once

#include <cstdint>

namespace quintet::kernels::host_impl {

inline constexpr int sum_lanes = 16;

template <class Acc, class Term>
inline Acc lane_sum(std::int64_t n, Term&& term) {
  Acc partial[sum_lanes] = {};
  std::int64_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes)
    for (int lane = 0; lane < sum_lanes; ++lane) partial[lane] += term(j + lane);
  for (int lane = 0; j < n; ++j, ++lane) partial[lane] += term(j);
  for (int width = sum_lanes / 2; width > 0; width /= 2)
    for (int lane = 0; lane < width; ++lane) partial[lane] += partial[lane + width];
  return partial[0];
}

}  // namespace quintet::kernels::host_impl
