// Bit-level views of float and double, usable in host code and in CUDA kernels alike; the 16-bit storage
// types build their rounding on these.
#pragma once

#include <quintet/core/config.hpp>

#include <bit>
#include <cstdint>

namespace quintet::detail {

QUINTET_HOST_DEVICE inline std::uint32_t bits_of(float value) {
#if QUINTET_DEVICE_PASS
  return __float_as_uint(value);
#else
  return std::bit_cast<std::uint32_t>(value);
#endif
}

QUINTET_HOST_DEVICE inline float float_from_bits(std::uint32_t bits) {
#if QUINTET_DEVICE_PASS
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

QUINTET_HOST_DEVICE inline std::uint64_t bits_of(double value) {
#if QUINTET_DEVICE_PASS
  return static_cast<std::uint64_t>(__double_as_longlong(value));
#else
  return std::bit_cast<std::uint64_t>(value);
#endif
}

QUINTET_HOST_DEVICE inline double double_from_bits(std::uint64_t bits) {
#if QUINTET_DEVICE_PASS
  return __longlong_as_double(static_cast<long long>(bits));
#else
  return std::bit_cast<double>(bits);
#endif
}

}  // namespace quintet::detail
