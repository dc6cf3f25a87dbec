// half: IEEE 754 binary16 storage (1 sign, 5 exponent, 10 mantissa bits). Arithmetic happens in
// float; conversion from float rounds to nearest, ties to even, including into subnormals.
#pragma once

#include <quintet/core/float_bits.hpp>

#include <cstdint>

namespace quintet {

struct half {
  std::uint16_t bits = 0;

  half() = default;
  QUINTET_HOST_DEVICE explicit half(float value) : bits(round_from_float(value)) {}
  QUINTET_HOST_DEVICE explicit operator float() const { return to_float(bits); }

  QUINTET_HOST_DEVICE static half from_bits(std::uint16_t raw) {
    half value;
    value.bits = raw;
    return value;
  }

  QUINTET_HOST_DEVICE static std::uint16_t round_from_float(float value) {
    const std::uint32_t f = detail::bits_of(value);
    const std::uint32_t sign = (f >> 16) & 0x8000u;
    const std::uint32_t magnitude = f & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
    if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
    if (magnitude < 0x38800000u) {
      // Below the smallest normal half (2^-14): the result is subnormal, in units of 2^-24.
      // Shift the full 24-bit significand right and round on the bits that fall off.
      const int exponent = static_cast<int>(magnitude >> 23);
      if (exponent < 102) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to zero
      const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
      const int shift = 126 - exponent;  // 14..24
      const std::uint32_t kept = significand >> shift;
      const std::uint32_t dropped = significand & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1);
      const std::uint32_t round_up = dropped > halfway || (dropped == halfway && (kept & 1u));
      return static_cast<std::uint16_t>(sign | (kept + round_up));
    }
    // Normal range: rebias the exponent (127 -> 15) and round on the 13 dropped mantissa bits;
    // a carry out of the mantissa correctly bumps the exponent (up to infinity).
    const std::uint32_t rebiased = magnitude - (112u << 23);
    const std::uint32_t lsb = (rebiased >> 13) & 1u;
    return static_cast<std::uint16_t>(sign | ((rebiased + 0xfffu + lsb) >> 13));
  }

  QUINTET_HOST_DEVICE static float to_float(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return detail::float_from_bits(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0) return detail::float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return detail::float_from_bits(sign);
    // Subnormal half: normalise into a float (always representable exactly).
    std::uint32_t float_exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    return detail::float_from_bits(sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }

  friend QUINTET_HOST_DEVICE bool operator==(half a, half b) {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};

}  // namespace quintet
