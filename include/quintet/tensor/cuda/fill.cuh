// fill on cuda tensors: a contiguous view of zero bits by cudaMemsetAsync (one driver call;
// zeroing gradients and accumulators is most fills), any other contiguous fill by a flat
// grid-stride loop, and a strided view by a loop that maps each linear index to its offset.
#pragma once

#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/fill.hpp>

#include <cstddef>

namespace quintet {

namespace detail {
template <class T>
__global__ void fill_contiguous_kernel(T* data, std::int64_t elements, T value) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < elements;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    data[i] = value;
  }
}

template <class T>
__global__ void fill_strided_kernel(T* data, strided_layout layout, std::int64_t elements,
                                    T value) {
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
    const std::int64_t elements = dst.numel();
    if (elements == 0) return;
    const cudaStream_t stream = native_stream(dst.stream());
    if (dst.is_contiguous() && detail::all_bits_zero(value)) {
      QUINTET_CUDA_CHECK(
          cudaMemsetAsync(dst.data(), 0, static_cast<std::size_t>(elements) * sizeof(T), stream));
      return;
    }
    const unsigned blocks = detail::elementwise_blocks(elements);
    if (dst.is_contiguous())
      detail::fill_contiguous_kernel<<<blocks, detail::elementwise_threads, 0, stream>>>(
          dst.data(), elements, value);
    else
      detail::fill_strided_kernel<<<blocks, detail::elementwise_threads, 0, stream>>>(
          dst.data(), detail::strided_layout_of(dst), elements, value);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace quintet
