// The optimizer updates on cuda tensors: AdamW and SGD elementwise, one launch over any flat range
// (optim::adamw calls it per parameter; a registry bucket of many parameters would be one launch),
// 16-byte accesses where every operand is aligned for them (kernels/cuda/map.cuh).
// Each element sees the host loop's operations in the host's order, every one rounded on its own
// (__fmul_rn and friends: nvcc would otherwise fuse a * b + c into one FMA, and --use_fast_math
// would approximate / and sqrt), so the device gives the host's bits wherever the host compiler
// does not fuse either (x86-64 without FMA, the default).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/map.cuh>
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

// host_impl::adamw_update, element by element, on packs of Lanes elements of each operand.
template <class T, class Acc>
struct adamw_op {
  T* param;
  const T* grad;
  Acc* m;
  Acc* v;
  host_impl::adamw_constants<Acc> k;

  static constexpr int lanes = vector_lanes<T, Acc>;
  bool aligned() const {
    return chunk_aligned(param, lanes, sizeof(T)) && chunk_aligned(grad, lanes, sizeof(T)) &&
           chunk_aligned(m, lanes, sizeof(Acc)) && chunk_aligned(v, lanes, sizeof(Acc));
  }

  __device__ void update(T& param_i, T grad_i, Acc& m_i, Acc& v_i) const {
    using namespace unfused;
    const Acc g = multiply(k.grad_scale, widen(grad_i));
    const Acc m_next = plus(multiply(k.beta1, m_i), multiply(minus(Acc(1), k.beta1), g));
    const Acc v_next =
        plus(multiply(k.beta2, v_i), multiply(multiply(minus(Acc(1), k.beta2), g), g));
    const Acc root = square_root(divide(v_next, k.bias_correction2));  // sqrt(v_hat)
    const Acc m_hat = divide(m_next, k.bias_correction1);
    const Acc p = widen(param_i);
    // Decoupled weight decay: p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay p).
    const Acc step =
        multiply(k.lr, plus(divide(m_hat, plus(root, k.eps)), multiply(k.weight_decay, p)));
    m_i = m_next;
    v_i = v_next;
    param_i = narrow<T>(minus(p, step));
  }

  template <int Lanes>
  __device__ void apply(std::int64_t first) const {
    auto p = load_pack<Lanes>(param + first);
    const auto g = load_pack<Lanes>(grad + first);
    auto m_pack = load_pack<Lanes>(m + first);
    auto v_pack = load_pack<Lanes>(v + first);
#pragma unroll
    for (int l = 0; l < Lanes; ++l)
      update(p.value[l], g.value[l], m_pack.value[l], v_pack.value[l]);
    store_pack<Lanes>(param + first, p);
    store_pack<Lanes>(m + first, m_pack);
    store_pack<Lanes>(v + first, v_pack);
  }
};

// host_impl::sgd_update, element by element on packs: g = grad_scale grad + weight_decay p; with a
// momentum buffer, buffer = momentum buffer + g and g = buffer; p -= lr g.
template <class T, class Acc>
struct sgd_op {
  T* param;
  const T* grad;
  Acc* buffer;  // nullptr: plain SGD
  host_impl::sgd_constants<Acc> k;

  static constexpr int lanes = vector_lanes<T, Acc>;
  bool aligned() const {
    return chunk_aligned(param, lanes, sizeof(T)) && chunk_aligned(grad, lanes, sizeof(T)) &&
           chunk_aligned(buffer, lanes, sizeof(Acc));  // nullptr is aligned
  }

  template <int Lanes>
  __device__ void apply(std::int64_t first) const {
    using namespace unfused;
    auto p = load_pack<Lanes>(param + first);
    const auto grads = load_pack<Lanes>(grad + first);
    lane_pack<Acc, Lanes> momentum{};
    if (buffer != nullptr) momentum = load_pack<Lanes>(buffer + first);
#pragma unroll
    for (int l = 0; l < Lanes; ++l) {
      const Acc p_l = widen(p.value[l]);
      Acc g = plus(multiply(k.grad_scale, widen(grads.value[l])), multiply(k.weight_decay, p_l));
      if (buffer != nullptr) {
        g = plus(multiply(k.momentum, momentum.value[l]), g);
        momentum.value[l] = g;
      }
      p.value[l] = narrow<T>(minus(p_l, multiply(k.lr, g)));
    }
    store_pack<Lanes>(param + first, p);
    if (buffer != nullptr) store_pack<Lanes>(buffer + first, momentum);
  }
};

}  // namespace cuda_impl

template <>
struct optimizer_engine<cuda> {
  template <class T, class Acc>
  static void adamw(const execution<cuda>& exec, T* param, const T* grad, Acc* m, Acc* v,
                    std::int64_t count, const host_impl::adamw_constants<Acc>& k) {
    const cuda_impl::adamw_op<T, Acc> op{param, grad, m, v, k};
    cuda_impl::chunked_for_each<decltype(op)::lanes>(exec, count, op.aligned(), op);
  }

  template <class T, class Acc>
  static void sgd(const execution<cuda>& exec, T* param, const T* grad, Acc* buffer,
                  std::int64_t count, const host_impl::sgd_constants<Acc>& k) {
    const cuda_impl::sgd_op<T, Acc> op{param, grad, buffer, k};
    cuda_impl::chunked_for_each<decltype(op)::lanes>(exec, count, op.aligned(), op);
  }
};

}  // namespace quintet::kernels
