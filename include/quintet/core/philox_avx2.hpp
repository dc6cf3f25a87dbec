// Philox4x32-10 and Box-Muller on four consecutive blocks of a stream at once, with AVX2 and FMA
// (x86-64 host code built by GCC or Clang; QUINTET_PHILOX_AVX2 says whether it exists). Each lane
// performs the scalar code's operations of philox.hpp in the same order, and every one of them is
// correctly rounded or exact, so a lane's normals are the scalar normals bit for bit. Callers are
// compiled for the same target ([[gnu::target("avx2,fma")]]) and choose it at run time
// (detail::cpu_has_avx2_fma).
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/core/philox.hpp>

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define QUINTET_PHILOX_AVX2 1
#include <immintrin.h>
#else
#define QUINTET_PHILOX_AVX2 0
#endif

#if QUINTET_PHILOX_AVX2

// Inlined into its caller, which must be compiled for AVX2 and FMA too.
#define QUINTET_AVX2_INLINE [[gnu::target("avx2,fma"), gnu::always_inline]] inline

namespace quintet::detail {

inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// The four 32-bit words of four Philox blocks, word w of block i in the low half of 64-bit lane i
// of word[w] (the high halves are zero).
struct philox_words_x4 {
  __m256i word[4];
};

QUINTET_AVX2_INLINE __m256i low_words(__m256i lanes) {
  return _mm256_and_si256(lanes, _mm256_set1_epi64x(0xffffffffll));
}

// random_block(key, first_block + i) in lane i.
QUINTET_AVX2_INLINE philox_words_x4 random_blocks_x4(rng_key key, std::uint64_t first_block) {
  const __m256i blocks = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first_block)),
                                          _mm256_setr_epi64x(0, 1, 2, 3));
  __m256i c0 = low_words(blocks);
  __m256i c1 = _mm256_srli_epi64(blocks, 32);
  __m256i c2 = _mm256_set1_epi64x(static_cast<long long>(key.stream & 0xffffffffu));
  __m256i c3 = _mm256_set1_epi64x(static_cast<long long>(key.stream >> 32));
  const __m256i multiplier0 = _mm256_set1_epi64x(philox_multiplier0);
  const __m256i multiplier1 = _mm256_set1_epi64x(philox_multiplier1);
  auto key0 = static_cast<std::uint32_t>(key.seed);
  auto key1 = static_cast<std::uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += philox_weyl0;
      key1 += philox_weyl1;
    }
    // _mm256_mul_epu32 multiplies the low 32 bits of each 64-bit lane into a 64-bit product.
    const __m256i product0 = _mm256_mul_epu32(multiplier0, c0);
    const __m256i product1 = _mm256_mul_epu32(multiplier1, c2);
    const __m256i next0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(product1, 32), c1),
                                           _mm256_set1_epi64x(key0));
    const __m256i next2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(product0, 32), c3),
                                           _mm256_set1_epi64x(key1));
    c1 = low_words(product1);
    c3 = low_words(product0);
    c0 = next0;
    c2 = next2;
  }
  return {{c0, c1, c2, c3}};
}

// An integer below 2^53 + 1 in each 64-bit lane, as a double: its two 32-bit halves converted
// exactly through the 2^52 exponent, then hi 2^32 + lo, exact since the sum is representable.
QUINTET_AVX2_INLINE __m256d exact_double_of(__m256i value) {
  const __m256i two52_bits = _mm256_set1_epi64x(0x4330000000000000ll);
  const __m256d two52 = _mm256_set1_pd(0x1.0p52);
  const __m256d high = _mm256_sub_pd(
      _mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(value, 32), two52_bits)), two52);
  const __m256d low =
      _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(low_words(value), two52_bits)), two52);
  return _mm256_fmadd_pd(high, _mm256_set1_pd(0x1.0p32), low);
}

// unit_open_closed / unit_closed_open of the words (high, low) lane by lane.
QUINTET_AVX2_INLINE __m256i top_53_bits(__m256i high, __m256i low) {
  return _mm256_srli_epi64(_mm256_or_si256(_mm256_slli_epi64(high, 32), low), 11);
}

QUINTET_AVX2_INLINE __m256d fma_x4(__m256d a, __m256d b, double c) {
  return _mm256_fmadd_pd(a, b, _mm256_set1_pd(c));
}

// log_unit_interval lane by lane.
QUINTET_AVX2_INLINE __m256d log_unit_interval_x4(__m256d u) {
  const __m256i bits = _mm256_castpd_si256(u);
  const __m256i exponent_field =
      _mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff));
  const __m256i two52_bits = _mm256_set1_epi64x(0x4330000000000000ll);
  __m256d exponent =
      _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(exponent_field, two52_bits)),
                    _mm256_set1_pd(0x1.0p52 + 1022.0));  // the field minus 1022, exact
  __m256d m = _mm256_castsi256_pd(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000fffffffffffffll)),
                      _mm256_set1_epi64x(0x3fe0000000000000ll)));
  const __m256d below = _mm256_cmp_pd(m, _mm256_set1_pd(sqrt_half), _CMP_LT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(2.0)), below);
  exponent = _mm256_sub_pd(exponent, _mm256_and_pd(below, _mm256_set1_pd(1.0)));
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d s = _mm256_div_pd(_mm256_sub_pd(m, one), _mm256_add_pd(m, one));
  const __m256d s2 = _mm256_mul_pd(s, s);
  constexpr series_coefficients series_of = series_coefficients_of();
  __m256d series = _mm256_set1_pd(series_of.atanh[0]);
  for (int i = 1; i < series_coefficients::atanh_terms; ++i)
    series = fma_x4(series, s2, series_of.atanh[i]);
  return _mm256_fmadd_pd(exponent, _mm256_set1_pd(ln2),
                         _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), s), series));
}

// sin_small / cos_small lane by lane.
QUINTET_AVX2_INLINE __m256d sin_small_x4(__m256d x) {
  const __m256d y = _mm256_mul_pd(x, x);
  constexpr series_coefficients series_of = series_coefficients_of();
  __m256d p = _mm256_set1_pd(series_of.sine[0]);
  for (int i = 1; i < series_coefficients::sine_terms; ++i) p = fma_x4(p, y, series_of.sine[i]);
  return _mm256_mul_pd(x, p);
}

QUINTET_AVX2_INLINE __m256d cos_small_x4(__m256d x) {
  const __m256d y = _mm256_mul_pd(x, x);
  constexpr series_coefficients series_of = series_coefficients_of();
  __m256d p = _mm256_set1_pd(series_of.cosine[0]);
  for (int i = 1; i < series_coefficients::cosine_terms; ++i) p = fma_x4(p, y, series_of.cosine[i]);
  return p;
}

QUINTET_AVX2_INLINE __m256d negated_where(__m256d value, __m256d mask) {
  return _mm256_xor_pd(value, _mm256_and_pd(mask, _mm256_set1_pd(-0.0)));
}

QUINTET_AVX2_INLINE __m256d equal_x4(__m256d value, double to) {
  return _mm256_cmp_pd(value, _mm256_set1_pd(to), _CMP_EQ_OQ);
}

// box_muller lane by lane: the standard normals of elements 2k and 2k + 1 of the stream for the
// block k in each lane.
struct normal_pairs_x4 {
  __m256d even, odd;
};

QUINTET_AVX2_INLINE normal_pairs_x4 box_muller_x4(const philox_words_x4& bits) {
  const __m256d two_minus53 = _mm256_set1_pd(0x1.0p-53);
  const __m256d radius_uniform =
      _mm256_mul_pd(exact_double_of(_mm256_add_epi64(top_53_bits(bits.word[0], bits.word[1]),
                                                     _mm256_set1_epi64x(1))),
                    two_minus53);
  const __m256d angle_uniform =
      _mm256_mul_pd(exact_double_of(top_53_bits(bits.word[2], bits.word[3])), two_minus53);
  const __m256d radius =
      _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_unit_interval_x4(radius_uniform)));

  // cos_sin_two_pi: the quadrant and the angle within it exactly, the complement past the octant.
  const __m256d quarters = _mm256_mul_pd(_mm256_set1_pd(4.0), angle_uniform);
  const __m256d quadrant = _mm256_round_pd(quarters, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_sub_pd(quarters, quadrant);
  const __m256d complement = _mm256_cmp_pd(r, _mm256_set1_pd(0.5), _CMP_GT_OQ);
  r = _mm256_blendv_pd(r, _mm256_sub_pd(_mm256_set1_pd(1.0), r), complement);
  const __m256d x = _mm256_mul_pd(r, _mm256_set1_pd(half_pi));
  const __m256d cos_x = cos_small_x4(x), sin_x = sin_small_x4(x);
  const __m256d c = _mm256_blendv_pd(cos_x, sin_x, complement);
  const __m256d s = _mm256_blendv_pd(sin_x, cos_x, complement);
  // Quadrants 0..3 give (c, s), (-s, c), (-c, -s), (s, -c).
  const __m256d first = equal_x4(quadrant, 1.0), third = equal_x4(quadrant, 3.0);
  const __m256d odd_quadrant = _mm256_or_pd(first, third);
  const __m256d cosine = negated_where(_mm256_blendv_pd(c, s, odd_quadrant),
                                       _mm256_or_pd(first, equal_x4(quadrant, 2.0)));
  const __m256d sine = negated_where(_mm256_blendv_pd(s, c, odd_quadrant),
                                     _mm256_cmp_pd(quadrant, _mm256_set1_pd(2.0), _CMP_GE_OQ));
  return {_mm256_mul_pd(radius, cosine), _mm256_mul_pd(radius, sine)};
}

}  // namespace quintet::detail

#undef QUINTET_AVX2_INLINE

#endif  // QUINTET_PHILOX_AVX2
