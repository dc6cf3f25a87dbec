// Views of a part of a tensor: slice [begin, end) along any dimension, or the i-th of n equal
// chunks. No data moves; the view keeps the parent's strides.
//
//   t: (4, 6)                       chunk(t, 1, 3, 1): (4, 2), strides (6, 1)
//   . . | x x | . .
//   . . | x x | . .                 rank i of a 3-way split on dimension 1 owns columns [2i, 2i+2)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstdint>

namespace quintet {

template <element_type T, device_tag Device>
tensor_view<T, Device> slice(tensor_view<T, Device> v, int dim, std::int64_t begin,
                             std::int64_t end) {
  v.shape().check_dim(dim);
  QUINTET_CHECK(0 <= begin && begin <= end && end <= v.shape()[dim],
                "slice [{}, {}) is out of range for dimension {} of shape {}", begin, end, dim,
                v.shape());
  T* start = v.numel() == 0 ? v.data() : v.data() + begin * v.strides()[dim];
  return {start, v.shape().with_extent(dim, end - begin), v.strides(), v.device_index(),
          v.stream()};
}

template <element_type T, device_tag Device>
tensor_view<T, Device> chunk(tensor_view<T, Device> v, int dim, std::int64_t parts,
                             std::int64_t index) {
  v.shape().check_dim(dim);
  QUINTET_CHECK(parts > 0 && v.shape()[dim] % parts == 0,
                "dimension {} of shape {} does not split into {} equal parts", dim, v.shape(),
                parts);
  QUINTET_CHECK(0 <= index && index < parts, "part {} is out of range for {} parts", index, parts);
  const std::int64_t length = v.shape()[dim] / parts;
  return slice(v, dim, index * length, (index + 1) * length);
}

template <element_type T, device_tag Device>
tensor_view<T, Device> slice(tensor<T, Device>& t, int dim, std::int64_t begin, std::int64_t end) {
  return slice(t.view(), dim, begin, end);
}
template <element_type T, device_tag Device>
tensor_view<const T, Device> slice(const tensor<T, Device>& t, int dim, std::int64_t begin,
                                   std::int64_t end) {
  return slice(t.view(), dim, begin, end);
}
template <element_type T, device_tag Device>
tensor_view<T, Device> chunk(tensor<T, Device>& t, int dim, std::int64_t parts,
                             std::int64_t index) {
  return chunk(t.view(), dim, parts, index);
}
template <element_type T, device_tag Device>
tensor_view<const T, Device> chunk(const tensor<T, Device>& t, int dim, std::int64_t parts,
                                   std::int64_t index) {
  return chunk(t.view(), dim, parts, index);
}

}  // namespace quintet
