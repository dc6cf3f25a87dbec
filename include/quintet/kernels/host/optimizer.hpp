// Host loops for the optimizer updates (AdamW, SGD with optional momentum) and the squared norm
// that global gradient clipping sums across parameters. Updates compute in accumulator_t<T>;
// the squared norm accumulates in double.
#pragma once

#include <quintet/kernels/accumulator.hpp>

#include <cmath>
#include <cstdint>

namespace quintet::kernels::host_impl {

// Per-call constants, bias corrections included, computed once in double by the caller.
template <class Acc>
struct adamw_constants {
  Acc lr, beta1, beta2, eps, weight_decay, grad_scale;
  Acc bias_correction1, bias_correction2;  // 1 - beta1^t, 1 - beta2^t
};

template <class T, class Acc = accumulator_t<T>>
void adamw_update(T* param, const T* grad, Acc* m, Acc* v, std::int64_t count,
                  const adamw_constants<Acc>& k) {
  for (std::int64_t i = 0; i < count; ++i) {
    const Acc g = k.grad_scale * widen(grad[i]);
    m[i] = k.beta1 * m[i] + (Acc(1) - k.beta1) * g;
    v[i] = k.beta2 * v[i] + (Acc(1) - k.beta2) * g * g;
    const Acc m_hat = m[i] / k.bias_correction1;
    const Acc v_hat = v[i] / k.bias_correction2;
    const Acc p = widen(param[i]);
    // Decoupled weight decay (Loshchilov & Hutter): the decay acts on p, not through the moments.
    param[i] = narrow<T>(p - k.lr * (m_hat / (std::sqrt(v_hat) + k.eps) + k.weight_decay * p));
  }
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

template <class T>
double squared_norm(const T* x, std::int64_t count) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < count; ++i) {
    const double value = static_cast<double>(widen(x[i]));
    sum += value * value;
  }
  return sum;
}

}  // namespace quintet::kernels::host_impl
