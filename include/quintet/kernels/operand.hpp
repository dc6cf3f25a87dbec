// How kernel entry points take their operands: any tensor or view, turned into a view (const for
// inputs, writable for outputs), with the checks every kernel repeats (device, contiguity, shape).
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace quintet::kernels {

// input_view(x): a read-only view of a tensor or view.
template <class X>
auto input_view(const X& x) {
  const auto v = view_of(x);
  using view = std::remove_const_t<decltype(v)>;
  return tensor_view<const typename view::value_type, typename view::device_type>(v);
}

// output_view(x): a writable view; a const tensor or a view of const data is rejected at compile
// time with a message naming the rule.
template <class X>
auto output_view(X&& x) {
  auto v = view_of(x);
  static_assert(
      mutable_tensor_like<decltype(v)>,
      "a kernel output must be writable: pass a non-const tensor or a view of mutable data");
  return v;
}

template <class X>
using value_type_of =
    typename std::remove_cvref_t<decltype(view_of(std::declval<X&>()))>::value_type;

template <class X>
using device_of = typename std::remove_cvref_t<decltype(view_of(std::declval<X&>()))>::device_type;

// Kernels address their operands densely; a strided view must be copied into a tensor first.
template <class View>
void require_contiguous(const View& v, std::string_view kernel, std::string_view operand) {
  QUINTET_CHECK(v.is_contiguous(),
                "{}: {} of shape {} must be contiguous (copy the view into a tensor)", kernel,
                operand, v.shape());
}

template <class View>
void require_rank_at_least(const View& v, int rank, std::string_view kernel,
                           std::string_view operand) {
  QUINTET_CHECK(v.rank() >= rank, "{}: {} has shape {}, of rank {}; rank {} or more is needed",
                kernel, operand, v.shape(), v.rank(), rank);
}

template <class View>
void require_shape(const View& v, const shape& expected, std::string_view kernel,
                   std::string_view operand) {
  QUINTET_CHECK(v.shape() == expected, "{}: {} has shape {}, expected {}", kernel, operand,
                v.shape(), expected);
}

// The last extent of a view (1 for a scalar) and the number of rows before it.
template <class View>
std::int64_t row_length(const View& v) {
  return v.rank() == 0 ? 1 : v.shape()[v.rank() - 1];
}
template <class View>
std::int64_t row_count(const View& v) {
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < v.rank(); ++d) rows *= v.shape()[d];
  return rows;
}

// The shape of a view without its last dimension: one entry per row (per-row statistics).
template <class View>
shape leading_shape(const View& v) {
  const auto extents = v.shape().extents();
  return shape(extents.first(extents.empty() ? 0 : extents.size() - 1));
}

namespace detail {

// Same element type, same device kind as the context, floating point.
template <class Device, class First, class... Rest>
constexpr void check_operand_types() {
  static_assert((std::same_as<typename First::value_type, typename Rest::value_type> && ...),
                "kernel operands must have one element type");
  static_assert(floating_element<typename First::value_type>,
                "kernels compute on float, double, bf16 or half tensors");
  static_assert(std::same_as<typename First::device_type, Device> &&
                    (std::same_as<typename Rest::device_type, Device> && ...),
                "the execution context and the operands must be on the same device kind");
}

}  // namespace detail

}  // namespace quintet::kernels
