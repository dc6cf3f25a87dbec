// bf16: 16-bit brain floating point storage (1 sign, 8 exponent, 7 mantissa bits). Arithmetic
// happens in float; conversion from float rounds to nearest, ties to even, as hardware does.
#pragma once

#include <quintet/core/float_bits.hpp>

#include <cstdint>

namespace quintet {

struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  QUINTET_HOST_DEVICE explicit bf16(float value) : bits(round_from_float(value)) {}
  QUINTET_HOST_DEVICE explicit operator float() const {
    return detail::float_from_bits(std::uint32_t{bits} << 16);
  }

  QUINTET_HOST_DEVICE static bf16 from_bits(std::uint16_t raw) {
    bf16 value;
    value.bits = raw;
    return value;
  }

  // Round-to-nearest-even on the 16 bits that are dropped. NaN stays NaN (quieted), never rounds
  // into infinity; overflow past the largest finite value becomes infinity as IEEE rounding says.
  QUINTET_HOST_DEVICE static std::uint16_t round_from_float(float value) {
    const std::uint32_t f = detail::bits_of(value);
    if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x0040u);
    const std::uint32_t lsb = (f >> 16) & 1u;
    return static_cast<std::uint16_t>((f + 0x7fffu + lsb) >> 16);
  }

  friend QUINTET_HOST_DEVICE bool operator==(bf16 a, bf16 b) {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};

}  // namespace quintet
