// file_dtype: the element types a safetensors file can name, with their standard names ("F32",
// "BF16", ...) and sizes, and the map from quintet's element types. The reader recognises every
// byte-sized standard type so it can open files other tools wrote; quintet writes the ones it
// computes with (F32, F64, BF16, F16, I32, I64, U8). Sub-byte types (F4, F6_*) and complex types
// are not recognised: a file holding them is rejected as naming an unknown dtype.
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/half.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace quintet::checkpoint {

enum class file_dtype : std::uint8_t {
  boolean,
  u8,
  i8,
  u16,
  i16,
  u32,
  i32,
  u64,
  i64,
  f16,
  bf16,
  f32,
  f64,
  f8_e4m3,
  f8_e5m2,
};

namespace detail {
struct file_dtype_info {
  file_dtype type;
  std::string_view name;
  std::size_t size;
};
inline constexpr std::array<file_dtype_info, 15> file_dtypes{{
    {file_dtype::boolean, "BOOL", 1},
    {file_dtype::u8, "U8", 1},
    {file_dtype::i8, "I8", 1},
    {file_dtype::u16, "U16", 2},
    {file_dtype::i16, "I16", 2},
    {file_dtype::u32, "U32", 4},
    {file_dtype::i32, "I32", 4},
    {file_dtype::u64, "U64", 8},
    {file_dtype::i64, "I64", 8},
    {file_dtype::f16, "F16", 2},
    {file_dtype::bf16, "BF16", 2},
    {file_dtype::f32, "F32", 4},
    {file_dtype::f64, "F64", 8},
    {file_dtype::f8_e4m3, "F8_E4M3", 1},
    {file_dtype::f8_e5m2, "F8_E5M2", 1},
}};
constexpr bool file_dtypes_in_enum_order() {
  for (std::size_t i = 0; i < file_dtypes.size(); ++i)
    if (static_cast<std::size_t>(file_dtypes[i].type) != i) return false;
  return true;
}
static_assert(file_dtypes_in_enum_order(), "file_dtypes must list the types in enum order");
}  // namespace detail

// The standard safetensors name ("F32").
constexpr std::string_view name_of(file_dtype type) {
  return detail::file_dtypes[static_cast<std::size_t>(type)].name;
}

// Bytes per element.
constexpr std::size_t size_of(file_dtype type) {
  return detail::file_dtypes[static_cast<std::size_t>(type)].size;
}

// The type a standard name denotes, or nullopt for a name this reader does not know.
constexpr std::optional<file_dtype> parse_file_dtype(std::string_view name) {
  for (const auto& info : detail::file_dtypes)
    if (info.name == name) return info.type;
  return std::nullopt;
}

// F16, BF16, F32 and F64: the types region reads convert between.
constexpr bool is_floating(file_dtype type) {
  return type == file_dtype::f16 || type == file_dtype::bf16 || type == file_dtype::f32 ||
         type == file_dtype::f64;
}

// The file type of a quintet dtype.
constexpr file_dtype to_file_dtype(dtype type) {
  switch (type) {
    case dtype::f32:
      return file_dtype::f32;
    case dtype::f64:
      return file_dtype::f64;
    case dtype::bf16:
      return file_dtype::bf16;
    case dtype::f16:
      return file_dtype::f16;
    case dtype::i32:
      return file_dtype::i32;
    case dtype::i64:
      return file_dtype::i64;
  }
  return file_dtype::u8;
}

// file_dtype_of<T>: the file type of a C++ element type, for quintet's element types and
// std::uint8_t (raw bytes).
template <class T>
struct file_dtype_traits {};
template <element_type T>
struct file_dtype_traits<T> {
  static constexpr file_dtype value = to_file_dtype(dtype_of<T>);
};
template <>
struct file_dtype_traits<std::uint8_t> {
  static constexpr file_dtype value = file_dtype::u8;
};

template <class T>
concept file_element = requires {
  file_dtype_traits<std::remove_cv_t<T>>::value;
};

template <file_element T>
inline constexpr file_dtype file_dtype_of = file_dtype_traits<std::remove_cv_t<T>>::value;

}  // namespace quintet::checkpoint
