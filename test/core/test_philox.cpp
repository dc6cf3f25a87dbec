// Philox4x32-10 against the published known-answer vectors (Random123's kat_vectors), and the
// uniform and normal draws built on it: ranges, moments, and the accuracy of the portable math.
#include <catch2/catch.hpp>

#include <quintet/core/philox.hpp>
#include <quintet/core/philox_avx2.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using quintet::philox_block;
using quintet::rng_key;

TEST_CASE("philox4x32_10 reproduces the Random123 known-answer vectors", "[core][philox]") {
  struct known_answer {
    philox_block counter;
    std::uint32_t key0, key1;
    philox_block expected;
  };
  const known_answer vectors[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const auto& v : vectors) {
    const philox_block out = quintet::philox4x32_10(v.counter, v.key0, v.key1);
    for (int i = 0; i < 4; ++i) CHECK(out.word[i] == v.expected.word[i]);
  }
}

TEST_CASE("draws depend on seed, stream and index, and on nothing else", "[core][philox]") {
  const rng_key key{.seed = 42, .stream = 7};
  CHECK(quintet::uniform_float(key, 1000) == quintet::uniform_float(key, 1000));
  CHECK(quintet::uniform_float(key, 1000) != quintet::uniform_float(key, 1001));
  CHECK(quintet::uniform_float(key, 5) != quintet::uniform_float({.seed = 43, .stream = 7}, 5));
  CHECK(quintet::uniform_float(key, 5) != quintet::uniform_float({.seed = 42, .stream = 8}, 5));
  // Indices past 2^32 use the high counter word.
  CHECK(quintet::uniform_double(key, 3) !=
        quintet::uniform_double(key, 3 + (std::uint64_t{1} << 33)));
  CHECK(quintet::rng_stream_for("blocks.0.attn.qkv.weight") !=
        quintet::rng_stream_for("blocks.1.attn.qkv.weight"));
  STATIC_REQUIRE(quintet::rng_stream_for("") == 0xcbf29ce484222325ull);
}

TEST_CASE("uniform draws lie in the unit interval with the moments of U(0, 1)", "[core][philox]") {
  const rng_key key{.seed = 2024, .stream = 1};
  constexpr int n = 200000;
  double sum_f = 0, sum2_f = 0, sum_d = 0, sum2_d = 0;
  for (int i = 0; i < n; ++i) {
    const float f = quintet::uniform_float(key, i);
    const double d = quintet::uniform_double(key, i);
    REQUIRE(f >= 0.0f);
    REQUIRE(f < 1.0f);
    REQUIRE(d >= 0.0);
    REQUIRE(d < 1.0);
    sum_f += f;
    sum2_f += double(f) * f;
    sum_d += d;
    sum2_d += d * d;
  }
  // Standard errors: mean 0.29/sqrt(n) = 6.5e-4, E[x^2] 0.30/sqrt(n) = 6.7e-4; allow 5 of them.
  CHECK(std::abs(sum_f / n - 0.5) < 3.3e-3);
  CHECK(std::abs(sum2_f / n - 1.0 / 3) < 3.4e-3);
  CHECK(std::abs(sum_d / n - 0.5) < 3.3e-3);
  CHECK(std::abs(sum2_d / n - 1.0 / 3) < 3.4e-3);
}

TEST_CASE("normal draws follow N(0, 1): moments and the Kolmogorov-Smirnov distance",
          "[core][philox]") {
  const rng_key key{.seed = 99, .stream = 3};
  constexpr int n = 100000;
  std::vector<double> draws(n);
  double sum = 0, sum2 = 0, sum4 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = quintet::normal_double(key, i);
    REQUIRE(std::isfinite(z));
    draws[i] = z;
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
  }
  // Standard errors: mean 1/sqrt(n) = 3.2e-3, variance sqrt(2/n) = 4.5e-3, kurtosis
  // sqrt(96/n) = 3.1e-2; allow 5 of them.
  CHECK(std::abs(sum / n) < 0.016);
  CHECK(std::abs(sum2 / n - 1.0) < 0.023);
  CHECK(std::abs(sum4 / n - 3.0) < 0.16);
  std::sort(draws.begin(), draws.end());
  double ks = 0;
  for (int i = 0; i < n; ++i) {
    const double cdf = 0.5 * std::erfc(-draws[i] / std::sqrt(2.0));
    ks = std::max({ks, std::abs(cdf - double(i) / n), std::abs(cdf - double(i + 1) / n)});
  }
  // The KS critical value at the 0.1% level is 1.95 / sqrt(n) = 6.2e-3.
  CHECK(ks < 6.2e-3);
}

TEST_CASE("the portable log, cosine and sine agree with the C library to double precision",
          "[core][philox]") {
  std::mt19937_64 engine(5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double worst_log = 0, worst_cos = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = i < 60 ? std::ldexp(1.0, -i) : 1.0 - unit(engine);  // (0, 1]
    worst_log = std::max(worst_log, std::abs(quintet::detail::log_unit_interval(u) - std::log(u)));
    const double a = unit(engine);
    const auto angle = quintet::detail::cos_sin_two_pi(a);
    worst_cos = std::max({worst_cos, std::abs(angle.cos - std::cos(2 * M_PI * a)),
                          std::abs(angle.sin - std::sin(2 * M_PI * a))});
  }
  CHECK(worst_log < 1e-13);  // |log u| <= 37: a few ulp of the largest values
  CHECK(worst_cos < 4e-15);  // the reference itself rounds 2 pi a: ~1e-15 near a = 1
  CHECK(quintet::detail::log_unit_interval(1.0) == 0.0);
  CHECK(quintet::detail::cos_sin_two_pi(0.0).cos == 1.0);
  CHECK(quintet::detail::cos_sin_two_pi(0.25).sin == 1.0);
  CHECK(quintet::detail::cos_sin_two_pi(0.5).cos == -1.0);
  CHECK(quintet::detail::cos_sin_two_pi(0.75).sin == -1.0);
}

#if QUINTET_PHILOX_AVX2
namespace {

// Four blocks' Philox and Box-Muller in AVX2 lanes, stored per lane.
struct lane_results {
  philox_block blocks[4];
  double even[4], odd[4];
};

[[gnu::target("avx2,fma")]] lane_results random_blocks_in_lanes(rng_key key, std::uint64_t first) {
  const quintet::detail::philox_words_x4 words = quintet::detail::random_blocks_x4(key, first);
  lane_results out{};
  for (int w = 0; w < 4; ++w) {
    alignas(32) std::uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), words.word[w]);
    for (int lane = 0; lane < 4; ++lane)
      out.blocks[lane].word[w] = static_cast<std::uint32_t>(lanes[lane]);
  }
  return out;
}

[[gnu::target("avx2,fma")]] lane_results box_muller_in_lanes(const philox_block (&blocks)[4]) {
  quintet::detail::philox_words_x4 words{};
  for (int w = 0; w < 4; ++w)
    words.word[w] = _mm256_setr_epi64x(blocks[0].word[w], blocks[1].word[w], blocks[2].word[w],
                                       blocks[3].word[w]);
  const quintet::detail::normal_pairs_x4 pairs = quintet::detail::box_muller_x4(words);
  lane_results out{};
  _mm256_storeu_pd(out.even, pairs.even);
  _mm256_storeu_pd(out.odd, pairs.odd);
  return out;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("Philox and Box-Muller in AVX2 lanes give the scalar bits", "[core][philox]") {
  if (!quintet::detail::cpu_has_avx2_fma()) {
    WARN("this CPU has no AVX2 with FMA: the lanes are not used, nothing to compare");
    return;
  }
  // Blocks across a 32-bit carry of the block number and a stream with both halves set.
  const rng_key key{.seed = 0x0123456789abcdefull, .stream = 0xfedcba9876543210ull};
  for (const std::uint64_t first :
       {std::uint64_t{0}, std::uint64_t{0xfffffffe}, std::uint64_t{77}}) {
    const lane_results lanes = random_blocks_in_lanes(key, first);
    for (int lane = 0; lane < 4; ++lane) {
      const philox_block expected = quintet::random_block(key, first + lane);
      for (int w = 0; w < 4; ++w) CHECK(lanes.blocks[lane].word[w] == expected.word[w]);
    }
  }
  // Box-Muller on chosen bits: the radius uniform at its ends (2^-53, 1) and on both sides of the
  // log's sqrt(1/2) switch; the angle uniform at each octant boundary k/8 and one step either
  // side (below 0 wraps to just below 1); then random blocks.
  std::vector<philox_block> blocks;
  const std::uint32_t radius_words[][2] = {
      {0, 0}, {0xffffffffu, 0xffffffffu}, {0xb504f333u, 0xf9de6484u}, {0xb504f334u, 0}, {1, 0}};
  for (std::uint32_t k = 0; k < 8; ++k) {
    const std::uint32_t at = k << 29;
    const std::uint32_t angle_words[][2] = {{at, 0}, {at, 1u << 11}, {at - 1, 0xffffffffu}};
    for (const auto& angle : angle_words) {
      for (const auto& radius : radius_words)
        blocks.push_back({{radius[0], radius[1], angle[0], angle[1]}});
    }
  }
  std::mt19937 generator(5);
  std::uniform_int_distribution<std::uint32_t> word;
  for (int i = 0; i < 400; ++i)
    blocks.push_back({{word(generator), word(generator), word(generator), word(generator)}});
  while (blocks.size() % 4 != 0) blocks.push_back(blocks.front());
  for (std::size_t i = 0; i < blocks.size(); i += 4) {
    const philox_block group[4] = {blocks[i], blocks[i + 1], blocks[i + 2], blocks[i + 3]};
    const lane_results lanes = box_muller_in_lanes(group);
    for (int lane = 0; lane < 4; ++lane) {
      const quintet::detail::normal_pair expected = quintet::detail::box_muller(group[lane]);
      INFO("block " << i + lane << " words " << group[lane].word[0] << " " << group[lane].word[1]
                    << " " << group[lane].word[2] << " " << group[lane].word[3]);
      CHECK(same_bits(lanes.even[lane], expected.even));
      CHECK(same_bits(lanes.odd[lane], expected.odd));
    }
  }
}
#endif
