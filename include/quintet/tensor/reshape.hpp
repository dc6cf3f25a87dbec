// reshape: the same contiguous elements seen with another shape of equal element count.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

namespace quintet {

template <element_type T, device_tag Device>
tensor_view<T, Device> reshape(tensor_view<T, Device> v, shape extents) {
  QUINTET_CHECK(extents.numel() == v.numel(),
                "cannot reshape {} ({} elements) to {} ({} elements)", v.shape(), v.numel(),
                extents, extents.numel());
  QUINTET_CHECK(v.is_contiguous(), "cannot reshape a non-contiguous view of shape {}; copy it "
                "into a tensor first", v.shape());
  return {v.data(), extents, extents.row_major_strides(), v.device_index(), v.stream()};
}

template <element_type T, device_tag Device>
tensor_view<T, Device> reshape(tensor<T, Device>& t, shape extents) {
  return reshape(t.view(), extents);
}
template <element_type T, device_tag Device>
tensor_view<const T, Device> reshape(const tensor<T, Device>& t, shape extents) {
  return reshape(t.view(), extents);
}

}  // namespace quintet
