// The optimizer updates on cuda tensors: AdamW and SGD elementwise over a list of tensors, one
// launch per group of up to optimizer_capacity tensors (kernels/multi_tensor.hpp: one block per
// unit of optimizer_unit elements, the group's pointers in the launch's parameters), 16-byte
// accesses in a tensor whose operands are all aligned for them (kernels/cuda/map.cuh).
// Each element sees the host loop's operations in the host's order, every one rounded on its own
// (__fmul_rn and friends: nvcc would otherwise fuse a * b + c into one FMA, and --use_fast_math
// would approximate / and sqrt), so the device gives the host's bits wherever the host compiler
// does not fuse either (x86-64 without FMA, the default).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/map.cuh>
#include <quintet/kernels/cuda/unfused.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/kernels/optimizer.hpp>

#include <cstdint>
#include <span>
#include <vector>

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

// Tensors per launch (not tuned; ~4 launches for the GPT-2 124M shape's ~150 parameters): the
// group's records travel in the kernel's parameters, which every toolkit takes up to 4 KiB of.
inline constexpr int optimizer_capacity = 40;

// One launch's tensors: their records, and where each one's units start (multi_tensor::first_units
// of the group, from 0; first_unit[size] is the group's units).
template <class Record>
struct tensor_group {
  Record record[optimizer_capacity];
  std::int64_t first_unit[optimizer_capacity + 1];
  int size;
};

// Block b updates unit b of the group: Op::at binds the op to its tensor's range, which it walks
// in chunks of Lanes elements where the tensor's operands are all aligned for them (units start at
// multiples of optimizer_unit, which keeps each tensor's alignment), else one element at a time.
// The group is read in place (__grid_constant__): it is indexed by the block's tensor.
template <int Lanes, class Op, class Record, class Constants>
__global__ void optimizer_group_kernel(const __grid_constant__ tensor_group<Record> group,
                                       const Constants k) {
  const auto at = multi_tensor::locate(group.first_unit, group.size, optimizer_unit,
                                       std::int64_t{blockIdx.x});
  const Record& t = group.record[at.tensor];
  const std::int64_t remaining = t.count - at.begin;
  const std::int64_t count = remaining < optimizer_unit ? remaining : optimizer_unit;
  const Op op = Op::at(t, at.begin, k);
  const auto element = [&](std::int64_t i) { op.template apply<1>(i); };
  if (op.aligned()) {
    for_each_share(
        chunked_range{count, Lanes}, threadIdx.x, blockDim.x,
        [&](std::int64_t first) { op.template apply<Lanes>(first); }, element);
  } else {
    for_each_share(chunked_range{count, 1}, threadIdx.x, blockDim.x, element, element);
  }
}

// Every tensor of the list in launches of up to optimizer_capacity tensors. The operands were
// checked by the entry point and the block counts are checked here before the first launch; a
// launch that fails still leaves the earlier groups updated.
template <class Op, class Record, class Constants>
void update_tensors(const execution<cuda>& exec, std::span<const Record> tensors,
                    const Constants& k) {
  static_assert(sizeof(tensor_group<Record>) + sizeof(Constants) <= 4096,
                "a launch's parameters stay within 4 KiB");
  std::vector<std::int64_t> counts;
  counts.reserve(tensors.size());
  for (const Record& t : tensors) counts.push_back(t.count);
  const std::vector<std::int64_t> first = multi_tensor::first_units(counts, optimizer_unit);
  const auto groups = multi_tensor::groups_of(tensors.size(), optimizer_capacity);
  for (const auto range : groups)
    QUINTET_CHECK(first[range.end] - first[range.begin] <= 2147483647,
                  "adamw/sgd on cuda: {} units of {} elements exceed one launch's blocks",
                  first[range.end] - first[range.begin], optimizer_unit);
  for (const auto range : groups) {
    const std::int64_t units = first[range.end] - first[range.begin];
    if (units == 0) continue;  // only tensors without elements
    tensor_group<Record> group{};
    group.size = static_cast<int>(range.size());
    for (std::size_t i = 0; i < range.size(); ++i) {
      group.record[i] = tensors[range.begin + i];
      group.first_unit[i] = first[range.begin + i] - first[range.begin];
    }
    group.first_unit[range.size()] = units;
    constexpr int threads = quintet::detail::elementwise_threads;
    optimizer_group_kernel<Op::lanes, Op>
        <<<static_cast<unsigned>(units), threads, 0, exec.native()>>>(group, k);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace cuda_impl

template <>
struct optimizer_engine<cuda> {
  template <class T, class Acc>
  static void adamw(const execution<cuda>& exec, std::span<const adamw_tensor<T, Acc>> tensors,
                    const host_impl::adamw_constants<Acc>& k) {
    cuda_impl::update_tensors<cuda_impl::adamw_op<T, Acc>>(exec, tensors, k);
  }

  template <class T, class Acc>
  static void sgd(const execution<cuda>& exec, std::span<const sgd_tensor<T, Acc>> tensors,
                  const host_impl::sgd_constants<Acc>& k) {
    cuda_impl::update_tensors<cuda_impl::sgd_op<T, Acc>>(exec, tensors, k);
  }
};

}  // namespace quintet::kernels
