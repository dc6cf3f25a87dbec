// Element types the library moves and computes on, as a compile-time trait and as a runtime tag
// (communicators, checkpoints and error messages need to name a type at run time).
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/core/half.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace quintet {

enum class dtype : std::uint8_t { f32, f64, bf16, f16, i32, i64 };

template <class T>
struct dtype_traits;  // specialised below for every supported element type

template <>
struct dtype_traits<float> {
  static constexpr dtype id = dtype::f32;
};
template <>
struct dtype_traits<double> {
  static constexpr dtype id = dtype::f64;
};
template <>
struct dtype_traits<bf16> {
  static constexpr dtype id = dtype::bf16;
};
template <>
struct dtype_traits<half> {
  static constexpr dtype id = dtype::f16;
};
template <>
struct dtype_traits<std::int32_t> {
  static constexpr dtype id = dtype::i32;
};
template <>
struct dtype_traits<std::int64_t> {
  static constexpr dtype id = dtype::i64;
};

// element_type: one of the types above; cv-qualifiers are ignored so views of const data qualify.
template <class T>
concept element_type = requires { dtype_traits<std::remove_cv_t<T>>::id; };

// floating_element: the element types that carry real numbers (what kernels and initialisers
// accept). The 16-bit ones are storage types: they convert to float to compute.
template <class T>
concept floating_element =
    element_type<T> && (std::floating_point<std::remove_cv_t<T>> ||
                        std::same_as<std::remove_cv_t<T>, bf16> ||
                        std::same_as<std::remove_cv_t<T>, half>);

template <element_type T>
inline constexpr dtype dtype_of = dtype_traits<std::remove_cv_t<T>>::id;

constexpr std::size_t size_of(dtype type) {
  switch (type) {
    case dtype::f32: return 4;
    case dtype::f64: return 8;
    case dtype::bf16: return 2;
    case dtype::f16: return 2;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
  }
  return 0;
}

constexpr std::string_view name_of(dtype type) {
  switch (type) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
  }
  return "unknown";
}

}  // namespace quintet
