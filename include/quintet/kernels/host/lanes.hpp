// Loops over a row in blocks of 16 lanes. g++ -O2 vectorises only loops whose trip count is a
// known constant (its cheapest cost model adds no epilogues and no alias checks), so the row
// kernels run their loops through these helpers:
//   lane_sum(n, term)     sum_{j < n} term(j) in 16 partial sums combined pairwise: the lanes also
//                         break one running sum's dependency, and rounding grows with n/16, not n;
//   lane_max(n, term)     max_{j < n} term(j) in 16 partial maxima (the same value in any order);
//   lane_map(out, n, f)   out[j] = f(j), each block's 16 values computed before any is stored, so
//                         out may be one of f's inputs (the same elements, as in-place kernels do).
// Each fixed-length lane loop is marked QUINTET_LANE_LOOP: g++ -O3 would otherwise unroll its 16
// iterations completely before the loop vectoriser runs, and the straight-line code left is
// vectorised worse or not at all (the exponentials ran 1.5x slower at -O3 than at -O2, AdamW 2.4x,
// and wider instruction sets gained nothing). Kept a loop, it becomes one vector operation per
// 4, 8 or 16 lanes, whichever the target has.
// lane_sqrt(block) takes the square roots of one block in place: a loop calling std::sqrt does not
// vectorise (it may set errno), so on x86 it is the SSE instruction, which rounds as std::sqrt.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define QUINTET_LANE_LOOP _Pragma("GCC unroll 1")
#else
#define QUINTET_LANE_LOOP
#endif

namespace quintet::kernels::host_impl {

inline constexpr int sum_lanes = 16;

template <class Acc, class Term>
inline Acc lane_sum(std::int64_t n, Term&& term) {
  Acc partial[sum_lanes] = {};
  std::int64_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes) {
    QUINTET_LANE_LOOP
    for (int lane = 0; lane < sum_lanes; ++lane) partial[lane] += term(j + lane);
  }
  for (int lane = 0; j < n; ++j, ++lane) partial[lane] += term(j);
  for (int width = sum_lanes / 2; width > 0; width /= 2)
    for (int lane = 0; lane < width; ++lane) partial[lane] += partial[lane + width];
  return partial[0];
}

// max_{j < n} term(j), -inf for n = 0, in 16 partial maxima combined pairwise. A maximum does not
// depend on the order it is taken in, and NaN terms are passed over as std::max(peak, NaN) does,
// so this is the running maximum's value (up to the sign of a zero maximum, which no caller can
// tell: they subtract it and exponentiate).
template <class Acc, class Term>
inline Acc lane_max(std::int64_t n, Term&& term) {
  Acc partial[sum_lanes];
  for (Acc& p : partial) p = -std::numeric_limits<Acc>::infinity();
  std::int64_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes) {
    QUINTET_LANE_LOOP
    for (int lane = 0; lane < sum_lanes; ++lane)
      partial[lane] = std::max(partial[lane], term(j + lane));
  }
  for (int lane = 0; j < n; ++j, ++lane) partial[lane] = std::max(partial[lane], term(j));
  for (int width = sum_lanes / 2; width > 0; width /= 2)
    for (int lane = 0; lane < width; ++lane)
      partial[lane] = std::max(partial[lane], partial[lane + width]);
  return partial[0];
}

template <class T, class Value>
inline void lane_map(T* out, std::int64_t n, Value&& value) {
  std::int64_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes) {
    T block[sum_lanes];
    QUINTET_LANE_LOOP
    for (int lane = 0; lane < sum_lanes; ++lane) block[lane] = value(j + lane);
    QUINTET_LANE_LOOP
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
