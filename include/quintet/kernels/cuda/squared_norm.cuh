// squared_norm and squared_norms on cuda tensors: sums of x[i]^2 in double, in a fixed order that
// depends only on each tensor's element count (so the same tensor gives the same bits on every run,
// alone or in a list): one 256-thread block per chunk of host_impl::squared_norm_chunk elements,
// each thread summing its strided share in order and cub::BlockReduce (a fixed tree) combining the
// threads; then one block per tensor sums its chunks' sums the same way. A list goes in launches
// of up to squared_norm_capacity tensors (kernels/multi_tensor.hpp); every tensor's sum comes back
// to the host in one copy, after one synchronisation of the exec's stream.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace quintet::kernels {

namespace cuda_impl {

inline constexpr int squared_norm_threads = 256;
// Tensors per group (not tuned; 2 groups, 4 launches, for the GPT-2 124M shape's ~150 gradients):
// their pointers and chunks travel in the kernels' parameters, which every toolkit takes up to
// 4 KiB of.
inline constexpr int squared_norm_capacity = 128;

template <class T>
struct squared_norm_group {
  const T* x[squared_norm_capacity];
  std::int64_t count[squared_norm_capacity];
  std::int64_t first_unit[squared_norm_capacity + 1];  // of the group's chunks, from 0
  int size;
};
static_assert(sizeof(squared_norm_group<double>) + 2 * sizeof(double*) <= 4096,
              "a launch's parameters stay within 4 KiB");

// sums[b] = sum of x[i]^2 over the group's chunk b: thread t adds elements t, t + 256, ... of the
// chunk in order. The square is rounded before it is added (__dmul_rn keeps nvcc from fusing it
// into the sum), as the host does.
// The group is read in place (__grid_constant__): it is indexed by the block's tensor.
template <class T, int Threads>
__global__ void squared_norm_chunks_kernel(const __grid_constant__ squared_norm_group<T> group,
                                           double* sums) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  constexpr std::int64_t chunk = host_impl::squared_norm_chunk;
  const auto at =
      multi_tensor::locate(group.first_unit, group.size, chunk, std::int64_t{blockIdx.x});
  const T* x = group.x[at.tensor];
  const std::int64_t chunk_end = at.begin + chunk;
  const std::int64_t end = chunk_end < group.count[at.tensor] ? chunk_end : group.count[at.tensor];
  double partial = 0.0;
  for (std::int64_t i = at.begin + threadIdx.x; i < end; i += Threads) {
    const double value = static_cast<double>(widen(x[i]));
    partial += __dmul_rn(value, value);
  }
  const double sum = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) sums[blockIdx.x] = sum;
}

// totals[b] = the sum of the group's tensor b's chunk sums: thread t adds its sums t, t + 256, ...
// in order, then the block tree (a tensor without elements: 0).
template <class T, int Threads>
__global__ void squared_norm_totals_kernel(const __grid_constant__ squared_norm_group<T> group,
                                           const double* sums, double* totals) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  const std::int64_t first = group.first_unit[blockIdx.x];
  const std::int64_t chunks = group.first_unit[blockIdx.x + 1] - first;
  double partial = 0.0;
  for (std::int64_t c = threadIdx.x; c < chunks; c += Threads) partial += sums[first + c];
  const double sum = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) totals[blockIdx.x] = sum;
}

}  // namespace cuda_impl

template <>
struct squared_norm_engine<cuda> {
  // Blocks the calling thread until the sums are on the host (the exec's stream is synchronised).
  template <class T>
  static std::vector<double> run(const execution<cuda>& exec, std::span<const T* const> xs,
                                 std::span<const std::int64_t> counts) {
    std::vector<double> totals(xs.size(), 0.0);
    if (xs.empty()) return totals;
    constexpr std::int64_t chunk = host_impl::squared_norm_chunk;
    const auto plan = multi_tensor::plan_launches(counts, chunk, cuda_impl::squared_norm_capacity,
                                                  "squared_norm on cuda");
    const std::int64_t chunks = plan.first.back();
    const auto listed = static_cast<std::int64_t>(xs.size());
    // The chunks' sums, then the totals.
    tensor<double, cuda> sums(shape{chunks + listed}, exec.stream());
    constexpr int threads = cuda_impl::squared_norm_threads;
    for (const auto range : plan.groups) {
      const std::int64_t units = plan.units(range);
      cuda_impl::squared_norm_group<T> group{};
      group.size = static_cast<int>(range.size());
      std::copy(xs.begin() + range.begin, xs.begin() + range.end, group.x);
      std::copy(counts.begin() + range.begin, counts.begin() + range.end, group.count);
      plan.group_first_units(range, group.first_unit);
      double* group_sums = sums.data() + plan.first[range.begin];
      if (units > 0) {
        cuda_impl::squared_norm_chunks_kernel<T, threads>
            <<<static_cast<unsigned>(units), threads, 0, exec.native()>>>(group, group_sums);
        QUINTET_CUDA_CHECK(cudaGetLastError());
      }
      cuda_impl::squared_norm_totals_kernel<T, threads>
          <<<static_cast<unsigned>(range.size()), threads, 0, exec.native()>>>(
              group, group_sums, sums.data() + chunks + static_cast<std::int64_t>(range.begin));
      QUINTET_CUDA_CHECK(cudaGetLastError());
    }
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(totals.data(), sums.data() + chunks,
                                       xs.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                       exec.native()));
    exec.synchronize();
    return totals;
  }
};

}  // namespace quintet::kernels
