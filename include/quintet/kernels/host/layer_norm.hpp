// Host loops for layer normalisation over the last dimension and for the row-wise softmax.
// Statistics are computed in accumulator_t<T>; the variance in two passes (a shifted mean first,
// then the mean squared deviation) so rows with a large mean do not lose precision.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/host/lanes.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace quintet::kernels::host_impl {

// y = (x - mean) * rstd * gamma + beta per row of n; mean and rstd = 1 / sqrt(var + eps) saved.
template <class T, class Acc = accumulator_t<T>>
void layer_norm_forward(const T* x, const T* gamma, const T* beta, T* y, Acc* mean, Acc* rstd,
                        std::int64_t rows, std::int64_t n, Acc eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    // Sum x - x[0] rather than x: for a row far from zero the differences are small and exact,
    // so the mean keeps the precision that a plain float sum of large values loses.
    const Acc shift = widen(xr[0]);
    const Acc sum = lane_sum<Acc>(n, [&](std::int64_t j) { return widen(xr[j]) - shift; });
    const Acc mu = shift + sum / static_cast<Acc>(n);
    const Acc squares = lane_sum<Acc>(n, [&](std::int64_t j) {
      const Acc d = widen(xr[j]) - mu;
      return d * d;
    });
    const Acc inv = Acc(1) / std::sqrt(squares / static_cast<Acc>(n) + eps);
    T* yr = y + r * n;
    lane_map(yr, n, [&](std::int64_t j) {
      return narrow<T>((widen(xr[j]) - mu) * inv * widen(gamma[j]) + widen(beta[j]));
    });
    mean[r] = mu;
    rstd[r] = inv;
  }
}

// The backward is written as per-row pieces that the fused loop and the two passes share, so
// running the passes apart repeats the fused arithmetic exactly (same bits). With
// xhat = (x - mean) rstd and g = dy gamma:

// dx = rstd (g - mean(g) - xhat mean(g xhat)) for one row.
template <class T, class Acc>
inline void layer_norm_input_row(const T* xr, const T* gamma, Acc mu, Acc inv, const T* dyr, T* dxr,
                                 std::int64_t n) {
  const Acc g_sum =
      lane_sum<Acc>(n, [&](std::int64_t j) { return widen(dyr[j]) * widen(gamma[j]); });
  const Acc g_xhat_sum = lane_sum<Acc>(n, [&](std::int64_t j) {
    return widen(dyr[j]) * widen(gamma[j]) * (widen(xr[j]) - mu) * inv;
  });
  const Acc g_mean = g_sum / static_cast<Acc>(n), g_xhat_mean = g_xhat_sum / static_cast<Acc>(n);
  lane_map(dxr, n, [&](std::int64_t j) {
    const Acc xhat = (widen(xr[j]) - mu) * inv;
    const Acc g = widen(dyr[j]) * widen(gamma[j]);
    return narrow<T>(inv * (g - g_mean - xhat * g_xhat_mean));
  });
}

// gamma_sum += dy xhat, beta_sum += dy for one row: the sums over rows stay in Acc.
template <class T, class Acc>
inline void layer_norm_weight_row(const T* xr, Acc mu, Acc inv, const T* dyr, Acc* gamma_sum,
                                  Acc* beta_sum, std::int64_t n) {
  lane_map(gamma_sum, n, [&](std::int64_t j) {
    return gamma_sum[j] + widen(dyr[j]) * (widen(xr[j]) - mu) * inv;
  });
  lane_map(beta_sum, n, [&](std::int64_t j) { return beta_sum[j] + widen(dyr[j]); });
}

// dgamma += gamma_sum, dbeta += beta_sum: each parameter gradient is rounded to T once per call.
template <class T, class Acc>
inline void layer_norm_add_weight_sums(const std::vector<Acc>& gamma_sum,
                                       const std::vector<Acc>& beta_sum, T* dgamma, T* dbeta,
                                       std::int64_t n) {
  lane_map(dgamma, n, [&](std::int64_t j) { return narrow<T>(widen(dgamma[j]) + gamma_sum[j]); });
  lane_map(dbeta, n, [&](std::int64_t j) { return narrow<T>(widen(dbeta[j]) + beta_sum[j]); });
}

// The input pass: dx per row.
template <class T, class Acc = accumulator_t<T>>
void layer_norm_backward_input(const T* x, const T* gamma, const Acc* mean, const Acc* rstd,
                               const T* dy, T* dx, std::int64_t rows, std::int64_t n) {
  for (std::int64_t r = 0; r < rows; ++r)
    layer_norm_input_row(x + r * n, gamma, mean[r], rstd[r], dy + r * n, dx + r * n, n);
}

// The weight pass: dgamma += sum dy xhat, dbeta += sum dy over all rows, in row order.
template <class T, class Acc = accumulator_t<T>>
void layer_norm_backward_weight(const T* x, const Acc* mean, const Acc* rstd, const T* dy,
                                T* dgamma, T* dbeta, std::int64_t rows, std::int64_t n) {
  std::vector<Acc> gamma_sum(static_cast<std::size_t>(n), Acc(0)),
      beta_sum(static_cast<std::size_t>(n), Acc(0));
  for (std::int64_t r = 0; r < rows; ++r)
    layer_norm_weight_row(x + r * n, mean[r], rstd[r], dy + r * n, gamma_sum.data(),
                          beta_sum.data(), n);
  layer_norm_add_weight_sums(gamma_sum, beta_sum, dgamma, dbeta, n);
}

// Both passes in one sweep over the rows, each row read while it is in cache (faster than the two
// passes: docs/kernels.md). Each row's weight sums read dy before its dx is written, as before, so
// dx may still be dy here.
template <class T, class Acc = accumulator_t<T>>
void layer_norm_backward(const T* x, const T* gamma, const Acc* mean, const Acc* rstd, const T* dy,
                         T* dx, T* dgamma, T* dbeta, std::int64_t rows, std::int64_t n) {
  std::vector<Acc> gamma_sum(static_cast<std::size_t>(n), Acc(0)),
      beta_sum(static_cast<std::size_t>(n), Acc(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    layer_norm_weight_row(xr, mean[r], rstd[r], dyr, gamma_sum.data(), beta_sum.data(), n);
    layer_norm_input_row(xr, gamma, mean[r], rstd[r], dyr, dx + r * n, n);
  }
  layer_norm_add_weight_sums(gamma_sum, beta_sum, dgamma, dbeta, n);
}

}  // namespace quintet::kernels::host_impl
