// Philox4x32-10 (Salmon et al., SC'11), a counter-based RNG: every draw is a pure function of
// (seed, stream, index), so any rank can produce any slice of a random tensor without
// communicating, and the host and CUDA produce the same bits.
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/core/float_bits.hpp>

#include <cmath>
#include <cstdint>
#include <string_view>

namespace quintet {

struct philox_block {
  std::uint32_t word[4];
};

namespace detail {
// Philox4x32's round multipliers and key schedule increments (the AVX2 lanes of philox_avx2.hpp
// use the same).
inline constexpr std::uint32_t philox_multiplier0 = 0xD2511F53u, philox_multiplier1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_weyl0 = 0x9E3779B9u, philox_weyl1 = 0xBB67AE85u;
}  // namespace detail

// One Philox4x32 evaluation with 10 rounds: a bijection of the 128-bit counter keyed by 64 bits.
QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE philox_block philox4x32_10(philox_block counter,
                                                                    std::uint32_t key0,
                                                                    std::uint32_t key1) {
  std::uint32_t* c = counter.word;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += detail::philox_weyl0;
      key1 += detail::philox_weyl1;
    }
    const std::uint64_t product0 = std::uint64_t{detail::philox_multiplier0} * c[0];
    const std::uint64_t product1 = std::uint64_t{detail::philox_multiplier1} * c[2];
    const std::uint32_t next[4] = {
        static_cast<std::uint32_t>(product1 >> 32) ^ c[1] ^ key0,
        static_cast<std::uint32_t>(product1),
        static_cast<std::uint32_t>(product0 >> 32) ^ c[3] ^ key1,
        static_cast<std::uint32_t>(product0),
    };
    for (int i = 0; i < 4; ++i) c[i] = next[i];
  }
  return counter;
}

// The key of a random stream: `seed` picks the experiment, `stream` the purpose (one stream per
// parameter, one per dropout site, ...). Elements are addressed by a 64-bit index.
struct rng_key {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};

// A stable stream number for a name (64-bit FNV-1a), so that parameter `blocks.3.attn.qkv.weight`
// draws the same numbers on every rank, in every run, whatever order layers are built in.
constexpr std::uint64_t rng_stream_for(std::string_view name) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const char ch : name) {
    hash ^= static_cast<unsigned char>(ch);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The 128 random bits of block `block` of stream `key`: counter = (block, stream), key = seed.
QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE philox_block random_block(rng_key key,
                                                                   std::uint64_t block) {
  const philox_block counter{
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
       static_cast<std::uint32_t>(key.stream), static_cast<std::uint32_t>(key.stream >> 32)}};
  return philox4x32_10(counter, static_cast<std::uint32_t>(key.seed),
                       static_cast<std::uint32_t>(key.seed >> 32));
}

namespace detail {

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double fused_multiply_add(double a, double b, double c) {
#if QUINTET_DEVICE_PASS
  return ::fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE float fused_multiply_add(float a, float b, float c) {
#if QUINTET_DEVICE_PASS
  return ::fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double square_root(double x) {
#if QUINTET_DEVICE_PASS
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// The transcendental functions below use only IEEE operations that are correctly rounded on every
// target (+, -, *, /, sqrt, explicit fma) and never an expression a compiler may contract, so host
// and device compute the same bits. Math libraries differ in the last ulp; these do not.

// Constants and series coefficients of the functions below, each written once; the AVX2 lanes of
// philox_avx2.hpp evaluate the same. Coefficients are in Horner order, highest power first.
inline constexpr double sqrt_half = 0.70710678118654752440;
inline constexpr double ln2 = 0.69314718055994530942;
inline constexpr double half_pi = 1.57079632679489661923;

struct series_coefficients {
  static constexpr int atanh_terms = 12, sine_terms = 10, cosine_terms = 10;
  double atanh[atanh_terms];    // 1/23, 1/21, ..., 1/3, 1: atanh(s)/s in powers of s^2
  double sine[sine_terms];      // -1/19!, 1/17!, ..., -1/3!, 1: sin(x)/x in powers of x^2
  double cosine[cosine_terms];  // -1/18!, 1/16!, ..., -1/2!, 1: cos(x) in powers of x^2
};

QUINTET_HOST_DEVICE constexpr series_coefficients series_coefficients_of() {
  return {
      {1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7,
       1.0 / 5, 1.0 / 3, 1.0},
      {-1.0 / 121645100408832000.0, 1.0 / 355687428096000.0, -1.0 / 1307674368000.0,
       1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0,
       -1.0 / 6.0, 1.0},
      {-1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, -1.0 / 87178291200.0, 1.0 / 479001600.0,
       -1.0 / 3628800.0, 1.0 / 40320.0, -1.0 / 720.0, 1.0 / 24.0, -0.5, 1.0}};
}

// Natural log of u in (0, 1], u normal: u = m 2^e with m in [sqrt(1/2), sqrt(2)), then
// log m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...) with s = (m-1)/(m+1), |s| <= 0.172.
QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double log_unit_interval(double u) {
  const std::uint64_t bits = bits_of(u);
  int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1022;
  double m = double_from_bits((bits & 0x000fffffffffffffull) | (std::uint64_t{1022} << 52));
  if (m < sqrt_half) {
    m *= 2.0;
    exponent -= 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  constexpr series_coefficients series_of = series_coefficients_of();
  double series = series_of.atanh[0];
  for (int i = 1; i < series_coefficients::atanh_terms; ++i)
    series = fused_multiply_add(series, s2, series_of.atanh[i]);
  return fused_multiply_add(static_cast<double>(exponent), ln2, (2.0 * s) * series);
}

// sin(x) and cos(x) for |x| <= pi/4 by Taylor series to x^19 and x^18 (error < 1e-17).
QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double sin_small(double x) {
  const double y = x * x;
  constexpr series_coefficients series_of = series_coefficients_of();
  double p = series_of.sine[0];
  for (int i = 1; i < series_coefficients::sine_terms; ++i)
    p = fused_multiply_add(p, y, series_of.sine[i]);
  return x * p;
}

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double cos_small(double x) {
  const double y = x * x;
  constexpr series_coefficients series_of = series_coefficients_of();
  double p = series_of.cosine[0];
  for (int i = 1; i < series_coefficients::cosine_terms; ++i)
    p = fused_multiply_add(p, y, series_of.cosine[i]);
  return p;
}

// cos(2 pi u) and sin(2 pi u) for u in [0, 1): quadrant and octant come from exact operations on u.
struct cos_sin {
  double cos, sin;
};

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE cos_sin cos_sin_two_pi(double u) {
  const double quarters = 4.0 * u;  // exact
  const int quadrant = static_cast<int>(quarters);
  double r = quarters - quadrant;  // exact, in [0, 1): the angle is (quadrant + r) pi/2
  // Within a quadrant, cos and sin of r pi/2; past the octant use the complementary angle.
  const bool complement = r > 0.5;
  if (complement) r = 1.0 - r;  // exact (Sterbenz)
  const double x = r * half_pi;
  const double c = complement ? sin_small(x) : cos_small(x);
  const double s = complement ? cos_small(x) : sin_small(x);
  switch (quadrant) {
    case 0:
      return {c, s};
    case 1:
      return {-s, c};
    case 2:
      return {-c, -s};
    default:
      return {s, -c};
  }
}

// Uniform doubles from 53 random bits: [0, 1) and (0, 1].
QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double unit_closed_open(std::uint32_t high,
                                                                 std::uint32_t low) {
  const std::uint64_t bits53 = ((std::uint64_t{high} << 32) | low) >> 11;
  return static_cast<double>(bits53) * 0x1.0p-53;
}

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE double unit_open_closed(std::uint32_t high,
                                                                 std::uint32_t low) {
  const std::uint64_t bits53 = ((std::uint64_t{high} << 32) | low) >> 11;
  return static_cast<double>(bits53 + 1) * 0x1.0p-53;
}

// The standard normals of elements 2k and 2k + 1 of a stream from its block k, computed in double:
// Box-Muller on the block's two uniform doubles, r cos(theta) and r sin(theta).
struct normal_pair {
  double even, odd;
};

QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE normal_pair box_muller(const philox_block& bits) {
  const double radius_uniform = unit_open_closed(bits.word[0], bits.word[1]);
  const double angle_uniform = unit_closed_open(bits.word[2], bits.word[3]);
  const double radius = square_root(-2.0 * log_unit_interval(radius_uniform));
  const cos_sin angle = cos_sin_two_pi(angle_uniform);
  return {radius * angle.cos, radius * angle.sin};
}

}  // namespace detail

// Draws for element `index` of a stream. Consecutive elements share Philox blocks (four uniform
// floats, two uniform doubles or two normals per block); rng_cursor keeps the last block so a loop
// over consecutive indices evaluates each block once. Values depend only on (key, index).
class rng_cursor {
 public:
  QUINTET_HOST_DEVICE explicit rng_cursor(rng_key key) : key_(key) {}

  // Uniform float in [0, 1): 24 random bits, exact in float.
  QUINTET_HOST_DEVICE float uniform_float(std::uint64_t index) {
    return static_cast<float>(block(index / 4).word[index % 4] >> 8) * 0x1.0p-24f;
  }

  // Uniform double in [0, 1): 53 random bits.
  QUINTET_HOST_DEVICE double uniform_double(std::uint64_t index) {
    const philox_block& bits = block(index / 2);
    const int lane = static_cast<int>(index % 2) * 2;
    return detail::unit_closed_open(bits.word[lane], bits.word[lane + 1]);
  }

  // Standard normal, computed in double: Box-Muller on one block gives the pair (2k, 2k+1)
  // (detail::box_muller).
  QUINTET_HOST_DEVICE double normal_double(std::uint64_t index) {
    const detail::normal_pair pair = detail::box_muller(block(index / 2));
    return index % 2 == 0 ? pair.even : pair.odd;
  }

 private:
  QUINTET_HOST_DEVICE const philox_block& block(std::uint64_t block_index) {
    if (!valid_ || block_index != block_index_) {
      bits_ = random_block(key_, block_index);
      block_index_ = block_index;
      valid_ = true;
    }
    return bits_;
  }

  rng_key key_;
  std::uint64_t block_index_ = 0;
  bool valid_ = false;
  philox_block bits_{};
};

// One-off draws (each evaluates a whole block; loops should use an rng_cursor).
QUINTET_HOST_DEVICE inline float uniform_float(rng_key key, std::uint64_t index) {
  return rng_cursor(key).uniform_float(index);
}
QUINTET_HOST_DEVICE inline double uniform_double(rng_key key, std::uint64_t index) {
  return rng_cursor(key).uniform_double(index);
}
QUINTET_HOST_DEVICE inline double normal_double(rng_key key, std::uint64_t index) {
  return rng_cursor(key).normal_double(index);
}

}  // namespace quintet
