// bf16 and half: conversion from float is checked against a double-precision reference that
// rounds to nearest, ties to even, by searching the representable neighbours; every one of the
// 65536 bit patterns is checked for exact round trips.
#include <catch2/catch.hpp>

#include <quintet/core/bf16.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/half.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

// The value of a 16-bit pattern as a double, decoded from the format's parameters.
double decode(std::uint16_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const bool negative = bits >> 15;
  const int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exponent_bits) - 1) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(mantissa + (1 << mantissa_bits), exponent - bias - mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Reference rounding: the two finite patterns that bracket `value` (patterns of one sign are
// ordered like their magnitudes, so a binary search finds them), the nearer one, ties to the even
// pattern; from the largest finite value plus half an ulp upward, infinity. All exact in double.
std::uint16_t reference_round(float value, int exponent_bits, int mantissa_bits) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double target = std::fabs(static_cast<double>(value));
  const auto infinity = static_cast<std::uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits);
  const auto largest_bits = static_cast<std::uint16_t>(infinity - 1);
  const double largest = decode(largest_bits, exponent_bits, mantissa_bits);
  const double ulp = largest - decode(largest_bits - 1, exponent_bits, mantissa_bits);
  if (target >= largest + ulp / 2) return sign | infinity;
  if (target >= largest) return sign | largest_bits;
  std::uint16_t below = 0, above = largest_bits;  // decode(below) <= target < decode(above)
  while (above - below > 1) {
    const auto middle = static_cast<std::uint16_t>((below + above) / 2);
    (decode(middle, exponent_bits, mantissa_bits) <= target ? below : above) = middle;
  }
  const double down = target - decode(below, exponent_bits, mantissa_bits);
  const double up = decode(above, exponent_bits, mantissa_bits) - target;
  if (down < up || (down == up && (below & 1) == 0)) return sign | below;
  return sign | above;
}

std::vector<float> probe_values() {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 65504.0f, 65519.99f, 65520.0f,
                               65536.0f, 1e-8f, 2.98e-8f, 5.96e-8f, 6.1e-5f, 3.0e38f, 1.0e-40f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  // Exact ties and their neighbours for both formats: 1 + k/2^11 and 1 + k/2^8 for odd k.
  for (int k = 1; k < 64; k += 2) {
    for (float base : {1.0f, 3.0e-5f, 1.0e-6f, 1024.0f}) {
      for (int shift : {8, 11}) {
        const float tie = base * (1.0f + std::ldexp(static_cast<float>(k), -shift));
        values.push_back(tie);
        values.push_back(std::nextafter(tie, 0.0f));
        values.push_back(std::nextafter(tie, 1e30f));
        values.push_back(-tie);
      }
    }
  }
  std::mt19937 engine(1234);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 3000; ++i) {
    const float value = std::bit_cast<float>(any_bits(engine));
    if (!std::isnan(value)) values.push_back(value);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 3000; ++i) values.push_back(normal(engine) * std::ldexp(1.0f, i % 40 - 28));
  return values;
}

}  // namespace

TEST_CASE("half rounds float to nearest even, matching the double reference", "[core][dtype]") {
  for (const float value : probe_values()) {
    INFO("value " << value);
    CHECK(quintet::half(value).bits == reference_round(value, 5, 10));
  }
}

TEST_CASE("bf16 rounds float to nearest even, matching the double reference", "[core][dtype]") {
  for (const float value : probe_values()) {
    INFO("value " << value);
    CHECK(quintet::bf16(value).bits == reference_round(value, 8, 7));
  }
}

TEST_CASE("every half and bf16 pattern converts to float exactly and back unchanged",
          "[core][dtype]") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto raw = static_cast<std::uint16_t>(bits);
    const float h = static_cast<float>(quintet::half::from_bits(raw));
    const float b = static_cast<float>(quintet::bf16::from_bits(raw));
    const double expected_h = decode(raw, 5, 10);
    const double expected_b = decode(raw, 8, 7);
    if (std::isnan(expected_h)) {
      mismatches += !std::isnan(h) + !std::isnan(static_cast<float>(quintet::half(h)));
    } else {
      mismatches += (h != expected_h) + (quintet::half(h).bits != raw);
    }
    if (std::isnan(expected_b)) {
      mismatches += !std::isnan(b) + !std::isnan(static_cast<float>(quintet::bf16(b)));
    } else {
      mismatches += (b != expected_b) + (quintet::bf16(b).bits != raw);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("NaN stays NaN and never becomes infinity", "[core][dtype]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A NaN whose payload lives only in the low bits that bf16 drops.
  const float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  CHECK(std::isnan(static_cast<float>(quintet::half(nan))));
  CHECK(std::isnan(static_cast<float>(quintet::bf16(nan))));
  CHECK(std::isnan(static_cast<float>(quintet::half(low_payload_nan))));
  CHECK(std::isnan(static_cast<float>(quintet::bf16(low_payload_nan))));
}

TEST_CASE("dtype traits name and size every element type", "[core][dtype]") {
  using quintet::dtype;
  STATIC_REQUIRE(quintet::dtype_of<float> == dtype::f32);
  STATIC_REQUIRE(quintet::dtype_of<const double> == dtype::f64);
  STATIC_REQUIRE(quintet::dtype_of<quintet::bf16> == dtype::bf16);
  STATIC_REQUIRE(quintet::dtype_of<quintet::half> == dtype::f16);
  STATIC_REQUIRE(quintet::dtype_of<std::int32_t> == dtype::i32);
  STATIC_REQUIRE(quintet::dtype_of<std::int64_t> == dtype::i64);
  STATIC_REQUIRE(quintet::size_of(dtype::bf16) == sizeof(quintet::bf16));
  STATIC_REQUIRE(quintet::size_of(dtype::f16) == 2);
  STATIC_REQUIRE(quintet::size_of(dtype::i64) == 8);
  STATIC_REQUIRE(quintet::floating_element<quintet::half>);
  STATIC_REQUIRE(!quintet::floating_element<std::int32_t>);
  STATIC_REQUIRE(!quintet::element_type<char>);
  CHECK(quintet::name_of(dtype::bf16) == "bf16");
}
