// fill on cuda tensors: a grid-stride kernel over (possibly strided) views.
#pragma once

#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/fill.hpp>

namespace quintet {

namespace detail {
template <class T>
__global__ void fill_kernel(T* data, strided_layout layout, std::int64_t elements, T value) {
  std::int64_t coordinates[6];
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < elements;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    data[layout.offset_of(i, coordinates)] = value;
  }
}
}  // namespace detail

template <>
struct fill_engine<cuda> {
  template <class T>
  static void run(tensor_view<T, cuda> dst, T value) {
    if (dst.numel() == 0) return;
    detail::fill_kernel<<<detail::elementwise_blocks(dst.numel()), detail::elementwise_threads, 0,
                          native_stream(dst.stream())>>>(dst.data(), detail::strided_layout_of(dst),
                                                         dst.numel(), value);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace quintet
