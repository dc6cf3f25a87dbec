// The optimizer updates on cuda tensors: AdamW and SGD elementwise, one launch over any flat range
// (optim::adamw calls it per parameter; a registry bucket of many parameters would be one launch).
// Each element sees the host loop's operations in the host's order, every one rounded on its own
// (__fmul_rn and friends: nvcc would otherwise fuse a * b + c into one FMA, and --use_fast_math
// would approximate / and sqrt), so the device gives the host's bits wherever the host compiler
// does not fuse either (x86-64 without FMA, the default).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/elementwise.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/optimizer.hpp>

#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

// Correctly rounded single operations, never fused or approximated, in float and in double.
namespace unfused {
__device__ __forceinline__ float multiply(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double multiply(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float plus(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double plus(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float minus(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double minus(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float divide(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double divide(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float square_root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double square_root(double a) { return __dsqrt_rn(a); }
}  // namespace unfused

// host_impl::adamw_update for one element.
template <class T, class Acc>
struct adamw_op {
  T* param;
  const T* grad;
  Acc* m;
  Acc* v;
  host_impl::adamw_constants<Acc> k;

  __device__ void operator()(std::int64_t i) const {
    using namespace unfused;
    const Acc g = multiply(k.grad_scale, widen(grad[i]));
    const Acc m_next = plus(multiply(k.beta1, m[i]), multiply(minus(Acc(1), k.beta1), g));
    const Acc v_next =
        plus(multiply(k.beta2, v[i]), multiply(multiply(minus(Acc(1), k.beta2), g), g));
    const Acc root = square_root(divide(v_next, k.bias_correction2));  // sqrt(v_hat)
    const Acc m_hat = divide(m_next, k.bias_correction1);
    const Acc p = widen(param[i]);
    // Decoupled weight decay: p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay p).
    const Acc step =
        multiply(k.lr, plus(divide(m_hat, plus(root, k.eps)), multiply(k.weight_decay, p)));
    m[i] = m_next;
    v[i] = v_next;
    param[i] = narrow<T>(minus(p, step));
  }
};

// host_impl::sgd_update for one element: g = grad_scale grad + weight_decay p; with a momentum
// buffer, buffer = momentum buffer + g and g = buffer; p -= lr g.
template <class T, class Acc>
struct sgd_op {
  T* param;
  const T* grad;
  Acc* buffer;  // nullptr: plain SGD
  host_impl::sgd_constants<Acc> k;

  __device__ void operator()(std::int64_t i) const {
    using namespace unfused;
    const Acc p = widen(param[i]);
    Acc g = plus(multiply(k.grad_scale, widen(grad[i])), multiply(k.weight_decay, p));
    if (buffer != nullptr) {
      g = plus(multiply(k.momentum, buffer[i]), g);
      buffer[i] = g;
    }
    param[i] = narrow<T>(minus(p, multiply(k.lr, g)));
  }
};

}  // namespace cuda_impl

template <>
struct optimizer_engine<cuda> {
  template <class T, class Acc>
  static void adamw(const execution<cuda>& exec, T* param, const T* grad, Acc* m, Acc* v,
                    std::int64_t count, const host_impl::adamw_constants<Acc>& k) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::adamw_op<T, Acc>{param, grad, m, v, k});
  }

  template <class T, class Acc>
  static void sgd(const execution<cuda>& exec, T* param, const T* grad, Acc* buffer,
                  std::int64_t count, const host_impl::sgd_constants<Acc>& k) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::sgd_op<T, Acc>{param, grad, buffer, k});
  }
};

}  // namespace quintet::kernels
