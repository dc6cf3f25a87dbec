// The tensor_like concept: what kernels and communicators need to know about a tensor, whether
// it owns its memory (quintet::tensor) or borrows it (quintet::tensor_view).
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/device.hpp>

#include <concepts>
#include <cstdint>

namespace quintet {

// tensor_like<X> requires:
//   X::value_type   an element_type (float, double, bf16, half, int32, int64), without const
//   X::device_type  a device_tag (host, cuda)
//   x.data()        pointer to the first element, convertible to const value_type*
//   x.shape()       the extents, x.strides() the strides in elements (row-major when contiguous)
//   x.numel()       the element count, x.device_index() which device of that kind holds it
template <class X>
concept tensor_like = requires(const X& x) {
  typename X::value_type;
  typename X::device_type;
  requires element_type<typename X::value_type>;
  requires device_tag<typename X::device_type>;
  { x.data() } -> std::convertible_to<const typename X::value_type*>;
  { x.shape() } -> std::convertible_to<quintet::shape>;
  { x.strides() } -> std::convertible_to<quintet::shape::index_array>;
  { x.numel() } -> std::convertible_to<std::int64_t>;
  { x.device_index() } -> std::convertible_to<int>;
};

// A tensor_like whose elements may be written through it.
template <class X>
concept mutable_tensor_like = tensor_like<X> && requires(const X& x) {
  { x.data() } -> std::same_as<typename X::value_type*>;
};

}  // namespace quintet
