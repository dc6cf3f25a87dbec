// Loops over a row in blocks of 16 lanes. g++ -O2 vectorises only loops whose trip count is a
// known constant (its cheapest cost model adds no epilogues and no alias checks), so the row
// kernels run their loops through these two helpers:
//   lane_sum(n, term)     sum_{j < n} term(j) in 16 partial sums combined pairwise: the lanes also
//                         break one running sum's dependency, and rounding grows with n/16, not n;
//   lane_map(out, n, f)   out[j] = f(j), each block's 16 values computed before any is stored, so
//                         out may be one of f's inputs (the same elements, as in-place kernels do).
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

template <class T, class Value>
inline void lane_map(T* out, std::int64_t n, Value&& value) {
  std::int64_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes) {
    T block[sum_lanes];
    for (int lane = 0; lane < sum_lanes; ++lane) block[lane] = value(j + lane);
    for (int lane = 0; lane < sum_lanes; ++lane) out[j + lane] = block[lane];
  }
  for (; j < n; ++j) out[j] = value(j);
}

}  // namespace quintet::kernels::host_impl
