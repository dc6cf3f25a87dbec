// Random initialisation: a shard initialised for its region equals the same slice of the whole
// tensor initialised at once, bit for bit, for every dimension, nested slices and every type.
#include <catch2/catch.hpp>

#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

using quintet::host;
using quintet::region;
using quintet::rng_key;
using quintet::shape;
using quintet::tensor;

namespace {

template <class T>
bool bitwise_equal(const tensor<T, host>& a, const tensor<T, host>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

template <class T>
void check_slices_match_whole(bool normal) {
  const shape global{6, 10, 8};
  const rng_key key{.seed = 11, .stream = quintet::rng_stream_for("layer.weight")};
  tensor<T, host> whole(global);
  normal ? quintet::fill_normal(whole, key, 0.5, 2.0)
         : quintet::fill_uniform(whole, key, -3.0, 1.0);
  for (int dim = 0; dim < 3; ++dim) {
    for (const auto& [begin, end] : {std::pair{0, 2}, std::pair{1, 4}, std::pair{2, 6}}) {
      const region where = region(global).slice(dim, begin, end);
      tensor<T, host> shard(where.local_shape());
      normal ? quintet::fill_normal(shard, key, 0.5, 2.0, where)
             : quintet::fill_uniform(shard, key, -3.0, 1.0, where);
      tensor<T, host> expected(where.local_shape());
      quintet::copy(expected, quintet::slice(whole, dim, begin, end));
      INFO("dim " << dim << " slice [" << begin << ", " << end << ")");
      REQUIRE(bitwise_equal(shard, expected));
    }
  }
  // Nested: a chunk of a chunk, as tp inside sp would cut it.
  const region nested = region(global).chunk(1, 2, 1).chunk(2, 4, 3);
  tensor<T, host> shard(nested.local_shape());
  normal ? quintet::fill_normal(shard, key, 0.5, 2.0, nested)
         : quintet::fill_uniform(shard, key, -3.0, 1.0, nested);
  tensor<T, host> expected(nested.local_shape());
  quintet::copy(expected, quintet::chunk(quintet::chunk(whole, 1, 2, 1), 2, 4, 3));
  REQUIRE(bitwise_equal(shard, expected));
}

}  // namespace

TEST_CASE("a shard initialised for its region equals that slice of the whole tensor",
          "[tensor][random]") {
  for (const bool normal : {false, true}) {
    check_slices_match_whole<float>(normal);
    check_slices_match_whole<double>(normal);
    check_slices_match_whole<quintet::bf16>(normal);
    check_slices_match_whole<quintet::half>(normal);
  }
}

TEST_CASE("filling a strided view for its region equals filling a dense shard",
          "[tensor][random]") {
  const rng_key key{.seed = 3, .stream = 4};
  tensor<float, host> whole(shape{4, 8});
  quintet::fill_normal(whole, key, 0.0, 1.0);
  tensor<float, host> target(shape{4, 8});
  quintet::fill_uniform(target, {.seed = 1, .stream = 1}, 0.0, 1.0);  // unrelated contents
  const region where = region(shape{4, 8}).slice(1, 3, 7);
  quintet::fill_normal(quintet::slice(target, 1, 3, 7), key, 0.0, 1.0, where);
  for (int i = 0; i < 4; ++i)
    for (int j = 3; j < 7; ++j) REQUIRE(target(i, j) == whole(i, j));
}

TEST_CASE("random values follow the element formula and the requested distribution",
          "[tensor][random]") {
  const rng_key key{.seed = 5, .stream = 6};
  tensor<double, host> u(shape{100, 100});
  quintet::fill_uniform(u, key, -2.0, 6.0);
  double sum = 0, sum2 = 0;
  for (std::int64_t i = 0; i < u.numel(); ++i) {
    const double x = u.data()[i];
    REQUIRE(x == std::fma(8.0, quintet::uniform_double(key, i), -2.0));
    sum += x;
    sum2 += x * x;
  }
  const double mean = sum / u.numel(), variance = sum2 / u.numel() - mean * mean;
  CHECK(std::abs(mean - 2.0) < 0.12);           // 5 standard errors of 8/sqrt(12 n)
  CHECK(std::abs(variance - 64.0 / 12) < 0.3);  // 5 standard errors of the variance

  tensor<float, host> z(shape{200, 100});
  quintet::fill_normal(z, key, 1.0, 0.5);
  sum = sum2 = 0;
  for (std::int64_t i = 0; i < z.numel(); ++i) {
    sum += z.data()[i];
    sum2 += double(z.data()[i]) * z.data()[i];
  }
  const double z_mean = sum / z.numel(), z_var = sum2 / z.numel() - z_mean * z_mean;
  CHECK(std::abs(z_mean - 1.0) < 0.018);  // 5 x 0.5/sqrt(2e4)
  CHECK(std::abs(z_var - 0.25) < 0.025);  // 5 x 0.25 sqrt(2/2e4)
}

namespace {

// Every element of `got` (the part `where` of a global tensor) against the one-off scalar draw of
// its global index: fill_normal's batched and threaded paths give each element its own value.
template <class T>
void require_scalar_draws(const tensor<T, host>& got, rng_key key, double mean, double stddev,
                          const region& where) {
  const shape& local = got.shape();
  for (std::int64_t i = 0; i < local[0]; ++i)
    for (std::int64_t j = 0; j < local[1]; ++j) {
      const auto index = static_cast<std::uint64_t>(where.global_index({i, j}));
      const double value = std::fma(stddev, quintet::normal_double(key, index), mean);
      const T expected = std::is_same_v<T, double> ? T(value) : T(static_cast<float>(value));
      if (std::memcmp(&got.data()[i * local[1] + j], &expected, sizeof(T)) != 0) {
        INFO("element (" << i << ", " << j << "), global index " << index);
        REQUIRE(false);
      }
    }
}

template <class T>
void check_large_normal_fills() {
  const rng_key key{.seed = 21, .stream = quintet::rng_stream_for("wte.weight")};
  // Consecutive elements: split over the cores in runs of an even length; from an odd global
  // index (row 515 of rows of 1025), so a run starts on the second element of a Box-Muller pair.
  const shape global{1031, 1025};
  for (const auto& [begin, end] : {std::pair{0, 1031}, std::pair{515, 1031}, std::pair{3, 4}}) {
    const region rows = region(global).slice(0, begin, end);
    tensor<T, host> shard(rows.local_shape());
    quintet::fill_normal(shard, key, 0.25, 0.02, rows);
    INFO("rows [" << begin << ", " << end << ")");
    require_scalar_draws(shard, key, 0.25, 0.02, rows);
  }
  // Not consecutive: row by row, each row starting at an odd or even index.
  const region columns = region(global).slice(1, 1, 1024);
  tensor<T, host> shard(columns.local_shape());
  quintet::fill_normal(shard, key, 0.25, 0.02, columns);
  require_scalar_draws(shard, key, 0.25, 0.02, columns);
}

}  // namespace

TEST_CASE("large and offset normal fills give every element its own scalar draw",
          "[tensor][random]") {
  check_large_normal_fills<float>();
  check_large_normal_fills<double>();
  check_large_normal_fills<quintet::bf16>();
}

TEST_CASE("random initialisation rejects a region of another shape and bad parameters",
          "[tensor][random]") {
  tensor<float, host> t(shape{4, 3});
  const rng_key key{};
  REQUIRE_THROWS_WITH(quintet::fill_normal(t, key, 0, 1, region(shape{4, 6}).chunk(1, 3, 0)),
                      Catch::Contains("region's local shape (4, 2) differs from the destination's "
                                      "shape (4, 3)"));
  REQUIRE_THROWS_WITH(quintet::fill_normal(t, key, 0, -1),
                      Catch::Contains("standard deviation -1"));
  REQUIRE_THROWS_WITH(quintet::fill_uniform(t, key, 2, 1),
                      Catch::Contains("low 2 is above high 1"));
  REQUIRE_THROWS_WITH(region(shape{4, 6}).slice(1, 5, 8),
                      Catch::Contains("slice [5, 8) is out of range for dimension 1 of extent 6"));
}
