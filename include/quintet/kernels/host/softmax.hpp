// Host loops for the row-wise softmax and its backward. Stable: the row maximum is subtracted
// before exponentiating, so no exponent overflows whatever the logits' scale.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/host/exponential.hpp>
#include <quintet/kernels/host/lanes.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace quintet::kernels::host_impl {

// y = exp(x - max) / sum exp(x - max) per row of n; y may be x.
template <class T>
void softmax_forward(const T* x, T* y, std::int64_t rows, std::int64_t n) {
  using acc = accumulator_t<T>;
  std::vector<acc> e(static_cast<std::size_t>(n));  // exp(x - max), evaluated once per element
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const acc peak = lane_max<acc>(n, [&](std::int64_t j) { return widen(xr[j]); });
    acc* shifted = e.data();
    lane_map(shifted, n, [&](std::int64_t j) { return widen(xr[j]) - peak; });
    exponentials(shifted, shifted, n);
    const acc inv = acc(1) / lane_sum<acc>(n, [&](std::int64_t j) { return e[j]; });
    lane_map(yr, n, [&](std::int64_t j) { return narrow<T>(e[j] * inv); });
  }
}

// dx = y (dy - sum_j dy_j y_j) per row; dx may be dy.
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, std::int64_t rows, std::int64_t n) {
  using acc = accumulator_t<T>;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * n;
    const T* dyr = dy + r * n;
    const acc dot = lane_sum<acc>(n, [&](std::int64_t j) { return widen(dyr[j]) * widen(yr[j]); });
    T* dxr = dx + r * n;
    lane_map(dxr, n,
             [&](std::int64_t j) { return narrow<T>(widen(yr[j]) * (widen(dyr[j]) - dot)); });
  }
}

}  // namespace quintet::kernels::host_impl
