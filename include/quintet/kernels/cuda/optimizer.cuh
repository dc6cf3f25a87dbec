// The optimizer updates on cuda tensors: AdamW and SGD elementwise over a list of tensors, one
// launch per group of tensors (kernels/cuda/multi_tensor.cuh: one block per unit of
// optimizer_unit elements, the group's pointers in the launch's parameters), 16-byte accesses in a
// tensor whose operands are all aligned for them (kernels/cuda/map.cuh).
// Each element sees the host loop's operations in the host's order, every one rounded on its own
// (__fmul_rn and friends: nvcc would otherwise fuse a * b + c into one FMA, and --use_fast_math
// would approximate / and sqrt), so the device gives the host's bits wherever the host compiler
// does not fuse either (x86-64 without FMA, the default).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/map.cuh>
#include <quintet/kernels/cuda/multi_tensor.cuh>
#include <quintet/kernels/cuda/unfused.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/optimizer.hpp>

#include <cstdint>
#include <span>

namespace quintet::kernels {

namespace cuda_impl {

// host_impl::adamw_update, element by element, on packs of Lanes elements of each operand.
template <class T, class Acc>
struct adamw_op {
  T* param;
  const T* grad;
  Acc* m;
  Acc* v;
  host_impl::adamw_constants<Acc> k;

  static constexpr int lanes = vector_lanes<T, Acc>;
  __host__ __device__ bool aligned() const {
    return chunk_aligned(param, lanes, sizeof(T)) && chunk_aligned(grad, lanes, sizeof(T)) &&
           chunk_aligned(m, lanes, sizeof(Acc)) && chunk_aligned(v, lanes, sizeof(Acc));
  }

  // The op over elements [begin, ...) of tensor t, with t's weight decay.
  __device__ static adamw_op at(const adamw_tensor<T, Acc>& t, std::int64_t begin,
                                const host_impl::adamw_constants<Acc>& k) {
    return {t.param + begin, t.grad + begin, t.m + begin, t.v + begin, constants_for(k, t.decays)};
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
  __host__ __device__ bool aligned() const {
    return chunk_aligned(param, lanes, sizeof(T)) && chunk_aligned(grad, lanes, sizeof(T)) &&
           chunk_aligned(buffer, lanes, sizeof(Acc));  // nullptr is aligned
  }

  __device__ static sgd_op at(const sgd_tensor<T, Acc>& t, std::int64_t begin,
                              const host_impl::sgd_constants<Acc>& k) {
    return {t.param + begin, t.grad + begin, t.buffer != nullptr ? t.buffer + begin : nullptr,
            constants_for(k, t.decays)};
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
  static void adamw(const execution<cuda>& exec, std::span<const adamw_tensor<T, Acc>> tensors,
                    const host_impl::adamw_constants<Acc>& k) {
    cuda_impl::for_each_list_unit<cuda_impl::adamw_op<T, Acc>, optimizer_unit>(exec, tensors, k,
                                                                               "adamw on cuda");
  }

  template <class T, class Acc>
  static void sgd(const execution<cuda>& exec, std::span<const sgd_tensor<T, Acc>> tensors,
                  const host_impl::sgd_constants<Acc>& k) {
    cuda_impl::for_each_list_unit<cuda_impl::sgd_op<T, Acc>, optimizer_unit>(exec, tensors, k,
                                                                             "sgd on cuda");
  }
};

}  // namespace quintet::kernels
