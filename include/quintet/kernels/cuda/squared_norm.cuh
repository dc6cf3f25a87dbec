// squared_norm on cuda tensors: sum of x[i]^2 in double, in a fixed order that depends only on the
// element count (so the same tensor gives the same bits on every run): one 256-thread block per
// chunk of host_impl::squared_norm_chunk elements, each thread summing its strided share in order
// and cub::BlockReduce (a fixed tree) combining the threads; then one block sums the chunk sums the
// same way. The result comes back to the host on the exec's stream.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cub/block/block_reduce.cuh>

#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

inline constexpr int squared_norm_threads = 256;

// sums[c] = sum of x[i]^2 over chunk c: thread t adds elements t, t + 256, ... of the chunk in
// order. The square is rounded before it is added (__dmul_rn keeps nvcc from fusing it into the
// sum), as the host does.
template <class T, int Threads>
__global__ void squared_norm_chunks_kernel(const T* x, std::int64_t count, double* sums) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  const std::int64_t begin = std::int64_t{blockIdx.x} * host_impl::squared_norm_chunk;
  const std::int64_t chunk_end = begin + host_impl::squared_norm_chunk;
  const std::int64_t end = chunk_end < count ? chunk_end : count;
  double partial = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += Threads) {
    const double value = static_cast<double>(widen(x[i]));
    partial += __dmul_rn(value, value);
  }
  const double sum = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) sums[blockIdx.x] = sum;
}

// *total = sum of sums[0 .. chunks): thread t adds sums t, t + 256, ... in order, then the block
// tree.
template <int Threads>
__global__ void squared_norm_total_kernel(const double* sums, std::int64_t chunks, double* total) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  double partial = 0.0;
  for (std::int64_t c = threadIdx.x; c < chunks; c += Threads) partial += sums[c];
  const double sum = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) *total = sum;
}

}  // namespace cuda_impl

template <>
struct squared_norm_engine<cuda> {
  // Blocks the calling thread until the sum is on the host (the exec's stream is synchronised).
  template <class T>
  static double run(const execution<cuda>& exec, const T* x, std::int64_t count) {
    if (count == 0) return 0.0;
    const std::int64_t chunks = host_impl::squared_norm_chunks(count);
    QUINTET_CHECK(chunks <= 2147483647,
                  "squared_norm on cuda: {} elements need more than 2^31 - 1 chunks of {}", count,
                  host_impl::squared_norm_chunk);
    // (chunks + 1): the chunks' sums, then the total.
    tensor<double, cuda> sums(shape{chunks + 1}, exec.stream());
    constexpr int threads = cuda_impl::squared_norm_threads;
    cuda_impl::squared_norm_chunks_kernel<T, threads>
        <<<static_cast<unsigned>(chunks), threads, 0, exec.native()>>>(x, count, sums.data());
    QUINTET_CUDA_CHECK(cudaGetLastError());
    cuda_impl::squared_norm_total_kernel<threads>
        <<<1, threads, 0, exec.native()>>>(sums.data(), chunks, sums.data() + chunks);
    QUINTET_CUDA_CHECK(cudaGetLastError());
    double total = 0.0;
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(&total, sums.data() + chunks, sizeof(double),
                                       cudaMemcpyDeviceToHost, exec.native()));
    exec.synchronize();
    return total;
  }
};

}  // namespace quintet::kernels
