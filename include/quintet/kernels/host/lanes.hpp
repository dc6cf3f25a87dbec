// Loops over a row in blocks of 16 lanes. g++ -O2 vectorises only loops whose trip count is a
// known constant (its cheapest cost model adds no epilogues and no alias checks), so the row
// kernels run their loops through these two helpers:
//   lane_sum(n, term)     sum_{j < n} term(j) in 16 partial sums combined pairwise: the lanes also
//                         break one running sum's dependency, and rounding grows with n/16, not n;
//   lane_map(out, n, f)   out[j] = f(j), each block's 16 values computed before any is stored, so
//                         out may be one of f's inputs (the same elements, as in-place kernels do).
// lane_sqrt(block) takes the square roots of one block in place: a loop calling std::sqrt does not
// vectorise (it may set errno), so on x86 it is the SSE instruction, which rounds as std::sqrt.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

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

// (The portable loop sits in an else branch: after an early return nvcc reports it unreachable.)
template <class Acc>
inline void lane_sqrt(Acc (&block)[sum_lanes]) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<Acc, float>) {
    for (int lane = 0; lane < sum_lanes; lane += 4)
      _mm_storeu_ps(block + lane, _mm_sqrt_ps(_mm_loadu_ps(block + lane)));
  } else if constexpr (std::is_same_v<Acc, double>) {
    for (int lane = 0; lane < sum_lanes; lane += 2)
      _mm_storeu_pd(block + lane, _mm_sqrt_pd(_mm_loadu_pd(block + lane)));
  } else
#endif
  {
    for (int lane = 0; lane < sum_lanes; ++lane) block[lane] = std::sqrt(block[lane]);
  }
}

}  // namespace quintet::kernels::host_impl
