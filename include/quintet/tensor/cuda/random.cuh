// Random initialisation on cuda tensors: the same Philox draws, element for element, as the host.
#pragma once

#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/random.hpp>

namespace quintet {

namespace detail {

// Where the local block sits in the global tensor, in a form a kernel can take by value.
struct device_region {
  int rank;
  std::int64_t offset[6];
  std::int64_t global_stride[6];

  __device__ std::int64_t global_index(const std::int64_t* local) const {
    std::int64_t index = 0;
    for (int d = 0; d < rank; ++d) index += (offset[d] + local[d]) * global_stride[d];
    return index;
  }
};

template <class T, class Distribution>
__global__ void random_kernel(T* data, strided_layout layout, device_region where,
                              std::int64_t elements, rng_key key, Distribution dist) {
  std::int64_t coordinates[6];
  rng_cursor draws(key);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < elements;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t offset = layout.offset_of(i, coordinates);
    data[offset] =
        random_value<T>(dist, draws, static_cast<std::uint64_t>(where.global_index(coordinates)));
  }
}

}  // namespace detail

template <>
struct random_engine<cuda> {
  template <class T, class Distribution>
  static void run(tensor_view<T, cuda> dst, rng_key key, Distribution dist, const region& where) {
    if (dst.numel() == 0) return;
    detail::device_region device_where{};
    device_where.rank = where.global_shape().rank();
    const auto global_strides = where.global_shape().row_major_strides();
    for (int d = 0; d < device_where.rank; ++d) {
      device_where.offset[d] = where.offsets()[d];
      device_where.global_stride[d] = global_strides[d];
    }
    detail::random_kernel<<<detail::elementwise_blocks(dst.numel()), detail::elementwise_threads,
                            0, native_stream(dst.stream())>>>(
        dst.data(), detail::strided_layout_of(dst), device_where, dst.numel(), key, dist);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace quintet
