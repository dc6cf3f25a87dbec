// Host loops for the optimizer updates (AdamW, SGD with optional momentum) and the squared norm
// that global gradient clipping sums across parameters. Updates compute in accumulator_t<T>;
// the squared norm accumulates in double.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/host/lanes.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace quintet::kernels::host_impl {

// Per-call constants, bias corrections included, computed once in double by the caller.
template <class Acc>
struct adamw_constants {
  Acc lr, beta1, beta2, eps, weight_decay, grad_scale;
  Acc bias_correction1, bias_correction2;  // 1 - beta1^t, 1 - beta2^t
};

// In blocks of sum_lanes elements, each block's square roots taken together (lane_sqrt), so the
// loop vectorises; every element sees the same operations in the same order as one at a time.
template <class T, class Acc = accumulator_t<T>>
void adamw_update(T* param, const T* grad, Acc* m, Acc* v, std::int64_t count,
                  const adamw_constants<Acc>& k) {
  const auto update = [&](std::int64_t first, int lanes) {
    Acc m_next[sum_lanes], v_next[sum_lanes], root[sum_lanes] = {};
    QUINTET_LANE_LOOP
    for (int j = 0; j < lanes; ++j) {
      const Acc g = k.grad_scale * widen(grad[first + j]);
      m_next[j] = k.beta1 * m[first + j] + (Acc(1) - k.beta1) * g;
      v_next[j] = k.beta2 * v[first + j] + (Acc(1) - k.beta2) * g * g;
      root[j] = v_next[j] / k.bias_correction2;  // v_hat
    }
    lane_sqrt(root);
    T p_next[sum_lanes];
    QUINTET_LANE_LOOP
    for (int j = 0; j < lanes; ++j) {
      const Acc m_hat = m_next[j] / k.bias_correction1;
      const Acc p = widen(param[first + j]);
      // Decoupled weight decay (Loshchilov & Hutter): the decay acts on p, not through the moments.
      p_next[j] = narrow<T>(p - k.lr * (m_hat / (root[j] + k.eps) + k.weight_decay * p));
    }
    QUINTET_LANE_LOOP
    for (int j = 0; j < lanes; ++j) {
      m[first + j] = m_next[j];
      v[first + j] = v_next[j];
      param[first + j] = p_next[j];
    }
  };
  std::int64_t i = 0;
  for (; i + sum_lanes <= count; i += sum_lanes) update(i, sum_lanes);
  if (i < count) update(i, static_cast<int>(count - i));
}

template <class Acc>
struct sgd_constants {
  Acc lr, momentum, weight_decay, grad_scale;
};

// g = grad_scale grad + weight_decay p; with momentum, buffer = momentum buffer + g and g = buffer
// (a zero-initialised buffer makes the first step plain SGD, as PyTorch does); p -= lr g.
template <class T, class Acc = accumulator_t<T>>
void sgd_update(T* param, const T* grad, Acc* buffer, std::int64_t count,
                const sgd_constants<Acc>& k) {
  for (std::int64_t i = 0; i < count; ++i) {
    const Acc p = widen(param[i]);
    Acc g = k.grad_scale * widen(grad[i]) + k.weight_decay * p;
    if (buffer != nullptr) {
      buffer[i] = k.momentum * buffer[i] + g;
      g = buffer[i];
    }
    param[i] = narrow<T>(p - k.lr * g);
  }
}

// The squared norm sums in double over fixed chunks of squared_norm_chunk elements from the
// start of x, each chunk in lanes (lane_sum: 16 partial sums, which also break the dependency of
// one running sum), and adds the chunks' sums in order. The chunks do not depend on how many
// threads sum them, so neither do the bits.
inline constexpr std::int64_t squared_norm_chunk = std::int64_t{1} << 14;

template <class T>
double squared_norm_of_chunk(const T* x, std::int64_t count) {
  return lane_sum<double>(count, [&](std::int64_t j) {
    const double value = static_cast<double>(widen(x[j]));
    return value * value;
  });
}

}  // namespace quintet::kernels::host_impl
