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

// With xhat = (x - mean) rstd and g = dy gamma, per row:
//   dx = rstd (g - mean(g) - xhat mean(g xhat));
// over all rows: dgamma += sum dy xhat, dbeta += sum dy.
template <class T, class Acc = accumulator_t<T>>
void layer_norm_backward(const T* x, const T* gamma, const Acc* mean, const Acc* rstd, const T* dy,
                         T* dx, T* dgamma, T* dbeta, std::int64_t rows, std::int64_t n) {
  std::vector<Acc> gamma_sum(static_cast<std::size_t>(n), Acc(0)),
      beta_sum(static_cast<std::size_t>(n), Acc(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    const Acc mu = mean[r], inv = rstd[r];
    const Acc g_sum =
        lane_sum<Acc>(n, [&](std::int64_t j) { return widen(dyr[j]) * widen(gamma[j]); });
    const Acc g_xhat_sum = lane_sum<Acc>(n, [&](std::int64_t j) {
      return widen(dyr[j]) * widen(gamma[j]) * (widen(xr[j]) - mu) * inv;
    });
    Acc* gs = gamma_sum.data();
    Acc* bs = beta_sum.data();
    lane_map(gs, n,
             [&](std::int64_t j) { return gs[j] + widen(dyr[j]) * (widen(xr[j]) - mu) * inv; });
    lane_map(bs, n, [&](std::int64_t j) { return bs[j] + widen(dyr[j]); });
    const Acc g_mean = g_sum / static_cast<Acc>(n), g_xhat_mean = g_xhat_sum / static_cast<Acc>(n);
    T* dxr = dx + r * n;
    lane_map(dxr, n, [&](std::int64_t j) {
      const Acc xhat = (widen(xr[j]) - mu) * inv;
      const Acc g = widen(dyr[j]) * widen(gamma[j]);
      return narrow<T>(inv * (g - g_mean - xhat * g_xhat_mean));
    });
  }
  lane_map(dgamma, n, [&](std::int64_t j) { return narrow<T>(widen(dgamma[j]) + gamma_sum[j]); });
  lane_map(dbeta, n, [&](std::int64_t j) { return narrow<T>(widen(dbeta[j]) + beta_sum[j]); });
}

}  // namespace quintet::kernels::host_impl
