// copy_box: copies the elements of box `part` from one row-major buffer to another, each buffer
// holding a box of the same global tensor, converting the element type on the way. This is the
// inner loop of a region read: source = a shard's bytes in the mapped file, destination = the
// caller's region, part = their intersection.
//
// Runs are as long as the layouts allow: trailing dimensions that `part` covers whole in both
// buffers merge into one contiguous run (a memcpy when the types agree). Conversions: between
// F16, BF16, F32 and F64 (through double; exact except F64 -> F16/BF16, which rounds twice);
// any other pair must be the same type.
#pragma once

#include <quintet/checkpoint/box.hpp>
#include <quintet/checkpoint/file_dtype.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace quintet::checkpoint {

// True when copy_box converts `from` to `to`.
constexpr bool can_convert(file_dtype from, file_dtype to) {
  return from == to || (is_floating(from) && is_floating(to));
}

namespace detail {

template <class T>
double load_element(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return static_cast<double>(static_cast<float>(value));
}
template <>
inline double load_element<float>(const std::byte* at) {
  float value;
  std::memcpy(&value, at, sizeof value);
  return value;
}
template <>
inline double load_element<double>(const std::byte* at) {
  double value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

template <class T>
void store_element(std::byte* at, double value) {
  T converted;
  if constexpr (std::is_same_v<T, double>) {
    converted = value;
  } else if constexpr (std::is_same_v<T, float>) {
    converted = static_cast<float>(value);
  } else {
    converted = T(static_cast<float>(value));
  }
  std::memcpy(at, &converted, sizeof(T));
}

template <class From, class To>
void convert_run(const std::byte* src, std::byte* dst, std::uint64_t count) {
  for (std::uint64_t i = 0; i < count; ++i)
    store_element<To>(dst + i * sizeof(To), load_element<From>(src + i * sizeof(From)));
}

template <class From>
void convert_run_from(const std::byte* src, std::byte* dst, file_dtype to, std::uint64_t count) {
  switch (to) {
    case file_dtype::f16:
      return convert_run<From, half>(src, dst, count);
    case file_dtype::bf16:
      return convert_run<From, bf16>(src, dst, count);
    case file_dtype::f32:
      return convert_run<From, float>(src, dst, count);
    case file_dtype::f64:
      return convert_run<From, double>(src, dst, count);
    default:
      QUINTET_FAIL("cannot convert to {}", name_of(to));
  }
}

// Copies `count` elements, converting from `from` to `to` (can_convert(from, to) holds).
inline void convert_elements(const std::byte* src, file_dtype from, std::byte* dst, file_dtype to,
                             std::uint64_t count) {
  if (from == to) {
    std::memcpy(dst, src, count * size_of(from));
    return;
  }
  switch (from) {
    case file_dtype::f16:
      return convert_run_from<half>(src, dst, to, count);
    case file_dtype::bf16:
      return convert_run_from<bf16>(src, dst, to, count);
    case file_dtype::f32:
      return convert_run_from<float>(src, dst, to, count);
    case file_dtype::f64:
      return convert_run_from<double>(src, dst, to, count);
    default:
      QUINTET_FAIL("cannot convert {} to {}", name_of(from), name_of(to));
  }
}

inline std::vector<std::uint64_t> row_major_strides(std::span<const std::uint64_t> extent) {
  std::vector<std::uint64_t> strides(extent.size(), 1);
  for (std::size_t d = extent.size(); d-- > 1;) strides[d - 1] = strides[d] * extent[d];
  return strides;
}

}  // namespace detail

// Copies box `part` from `src` (row-major elements of type `src_type` covering box `src_box`) to
// `dst` (elements of `dst_type` covering `dst_box`). `part` must lie inside both boxes.
inline void copy_box(std::span<const std::byte> src, file_dtype src_type, const box& src_box,
                     std::span<std::byte> dst, file_dtype dst_type, const box& dst_box,
                     const box& part) {
  const std::size_t rank = part.rank();
  QUINTET_CHECK(src_box.rank() == rank && dst_box.rank() == rank,
                "copy_box: boxes of ranks {}, {} and {}", src_box.rank(), dst_box.rank(), rank);
  for (std::size_t d = 0; d < rank; ++d) {
    QUINTET_CHECK(part.start[d] >= src_box.start[d] &&
                      part.start[d] + part.extent[d] <= src_box.start[d] + src_box.extent[d] &&
                      part.start[d] >= dst_box.start[d] &&
                      part.start[d] + part.extent[d] <= dst_box.start[d] + dst_box.extent[d],
                  "copy_box: {} is not inside both {} and {}", part.to_string(),
                  src_box.to_string(), dst_box.to_string());
  }
  QUINTET_CHECK(can_convert(src_type, dst_type), "cannot convert {} elements to {}",
                name_of(src_type), name_of(dst_type));
  QUINTET_CHECK(src.size() == src_box.volume() * size_of(src_type) &&
                    dst.size() == dst_box.volume() * size_of(dst_type),
                "copy_box: buffers of {} and {} bytes for boxes {} ({}) and {} ({})", src.size(),
                dst.size(), src_box.to_string(), name_of(src_type), dst_box.to_string(),
                name_of(dst_type));
  if (part.volume() == 0) return;

  // Dimensions [inner, rank) form one contiguous run in both buffers.
  std::size_t inner = rank == 0 ? 0 : rank - 1;
  while (inner > 0 && part.extent[inner] == src_box.extent[inner] &&
         part.extent[inner] == dst_box.extent[inner])
    --inner;
  std::uint64_t run = 1;
  for (std::size_t d = inner; d < rank; ++d) run *= part.extent[d];

  const auto src_strides = detail::row_major_strides(src_box.extent);
  const auto dst_strides = detail::row_major_strides(dst_box.extent);
  const std::size_t src_size = size_of(src_type), dst_size = size_of(dst_type);
  std::vector<std::uint64_t> index(inner, 0);  // over the outer dimensions [0, inner)
  for (;;) {
    std::uint64_t src_at = 0, dst_at = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const std::uint64_t i = part.start[d] + (d < inner ? index[d] : 0);
      src_at += (i - src_box.start[d]) * src_strides[d];
      dst_at += (i - dst_box.start[d]) * dst_strides[d];
    }
    detail::convert_elements(src.data() + src_at * src_size, src_type,
                             dst.data() + dst_at * dst_size, dst_type, run);
    std::size_t d = inner;
    while (d > 0 && ++index[d - 1] == part.extent[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace quintet::checkpoint
