// Launch shapes for the elementwise tensor kernels (a grid-stride loop over the elements), and
// when a fill can be a memset.
#pragma once

#include <quintet/tensor/cuda_memory.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace quintet::detail {

// 256 threads and at most 4096 blocks: enough to fill an H100/H200 (132 SMs x 2048 threads) with
// a grid-stride loop; these kernels are memory-bound initialisers, not tuned hot paths.
inline constexpr int elementwise_threads = 256;

inline unsigned elementwise_blocks(std::int64_t elements) {
  const std::int64_t blocks = (elements + elementwise_threads - 1) / elementwise_threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 4096));
}

// The element offset, in a strided view, of the element with row-major linear index `linear`.
struct strided_layout {
  int rank;
  std::int64_t extent[6];
  std::int64_t stride[6];

  __device__ std::int64_t offset_of(std::int64_t linear, std::int64_t* coordinates) const {
    std::int64_t offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      coordinates[d] = linear % extent[d];
      linear /= extent[d];
      offset += coordinates[d] * stride[d];
    }
    return offset;
  }
};

template <class View>
strided_layout strided_layout_of(const View& v) {
  strided_layout layout{};
  layout.rank = v.rank();
  for (int d = 0; d < v.rank(); ++d) {
    layout.extent[d] = v.shape()[d];
    layout.stride[d] = v.strides()[d];
  }
  return layout;
}

// True when every byte of `value` is zero (+0.0, not -0.0): a fill cudaMemsetAsync can do.
template <class T>
bool all_bits_zero(const T& value) {
  const auto bytes = std::bit_cast<std::array<unsigned char, sizeof(T)>>(value);
  return std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) { return b == 0; });
}

}  // namespace quintet::detail
