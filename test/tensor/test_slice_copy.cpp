// Slices along every dimension, equal chunks, and copies between strided layouts, checked against
// element-by-element index arithmetic; values_on_host against the same.
#include <catch2/catch.hpp>

#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <vector>

using quintet::host;
using quintet::shape;
using quintet::tensor;

namespace {

// t(i, j, k) = 100 i + 10 j + k, so every element names its own position.
tensor<int, host> numbered(shape extents) {
  tensor<int, host> t(extents);
  for (std::int64_t i = 0; i < extents[0]; ++i)
    for (std::int64_t j = 0; j < extents[1]; ++j)
      for (std::int64_t k = 0; k < extents[2]; ++k) t(i, j, k) = int(100 * i + 10 * j + k);
  return t;
}

}  // namespace

TEST_CASE("a slice along any dimension addresses the parent's elements", "[tensor][slice]") {
  const auto t = numbered(shape{4, 5, 6});
  for (int dim = 0; dim < 3; ++dim) {
    const auto s = quintet::slice(t, dim, 1, 3);
    CHECK(s.shape() == t.shape().with_extent(dim, 2));
    CHECK(s.is_contiguous() == (dim == 0));
    for (std::int64_t i = 0; i < s.shape()[0]; ++i)
      for (std::int64_t j = 0; j < s.shape()[1]; ++j)
        for (std::int64_t k = 0; k < s.shape()[2]; ++k) {
          std::int64_t index[3] = {i, j, k};
          index[dim] += 1;
          REQUIRE(s(i, j, k) == t(index[0], index[1], index[2]));
        }
  }
}

TEST_CASE("chunks split a dimension into equal parts", "[tensor][slice]") {
  const auto t = numbered(shape{2, 6, 3});
  const auto c = quintet::chunk(t, 1, 3, 2);  // columns 4 and 5
  CHECK(c.shape() == shape{2, 2, 3});
  CHECK(c(1, 0, 2) == 142);
  REQUIRE_THROWS_WITH(quintet::chunk(t, 1, 4, 0),
                      Catch::Contains("dimension 1 of shape (2, 6, 3) does not split into 4"));
  REQUIRE_THROWS_WITH(quintet::chunk(t, 1, 3, 3), Catch::Contains("part 3 is out of range"));
}

TEST_CASE("slices out of range are rejected naming the range and shape", "[tensor][slice]") {
  const auto t = numbered(shape{2, 3, 4});
  REQUIRE_THROWS_WITH(quintet::slice(t, 2, 3, 5),
                      Catch::Contains("slice [3, 5) is out of range for dimension 2 of shape (2, 3, 4)"));
  REQUIRE_THROWS_WITH(quintet::slice(t, 1, 2, 1), Catch::Contains("slice [2, 1)"));
  REQUIRE_THROWS_WITH(quintet::slice(t, 3, 0, 1), Catch::Contains("dimension 3 is out of range"));
}

TEST_CASE("copy materialises a strided slice and writes into one", "[tensor][copy]") {
  const auto t = numbered(shape{3, 4, 5});
  for (int dim = 0; dim < 3; ++dim) {
    const auto source = quintet::slice(t, dim, 1, 3);
    tensor<int, host> dense(source.shape());
    quintet::copy(dense, source);
    for (std::int64_t i = 0; i < dense.numel(); ++i) {
      // Recover (i, j, k) of the dense copy and compare with the slice.
      const auto strides = dense.shape().row_major_strides();
      const std::int64_t a = i / strides[0], b = i % strides[0] / strides[1], c = i % strides[1];
      REQUIRE(dense.data()[i] == source(a, b, c));
    }
    // And back: write the dense block into the same place of a zeroed tensor.
    tensor<int, host> target(t.shape());
    quintet::fill(target, 0);
    quintet::copy(quintet::slice(target, dim, 1, 3), dense);
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 4; ++j)
        for (std::int64_t k = 0; k < 5; ++k) {
          const std::int64_t index[3] = {i, j, k};
          const bool inside = index[dim] >= 1 && index[dim] < 3;
          REQUIRE(target(i, j, k) == (inside ? t(i, j, k) : 0));
        }
  }
}

TEST_CASE("copy between two strided views of different layouts", "[tensor][copy]") {
  const auto t = numbered(shape{4, 6, 3});
  tensor<int, host> target(shape{6, 4, 3});
  quintet::fill(target, -1);
  // (2, 3, 3) block from columns 3..5 of rows 2..3 into rows 4..5, columns 1..3.
  const auto source = quintet::slice(quintet::slice(t, 0, 2, 4), 1, 3, 6);
  const auto destination = quintet::slice(quintet::slice(target, 0, 4, 6), 1, 1, 4);
  quintet::copy(destination, source);
  CHECK(target(4, 1, 0) == t(2, 3, 0));
  CHECK(target(5, 3, 2) == t(3, 5, 2));
  CHECK(target(3, 1, 0) == -1);
  CHECK(target(4, 0, 0) == -1);
}

TEST_CASE("copy handles a strided innermost dimension and rank 0", "[tensor][copy]") {
  int storage[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const quintet::tensor_view<int, host> every_other(storage, shape{4}, {2});
  tensor<int, host> dense(shape{4});
  quintet::copy(dense, every_other);
  CHECK((dense(0) == 0 && dense(1) == 2 && dense(2) == 4 && dense(3) == 6));

  tensor<double, host> scalar_a(shape{}), scalar_b(shape{});
  quintet::fill(scalar_a, 2.5);
  quintet::copy(scalar_b, scalar_a);
  CHECK(scalar_b() == 2.5);
}

TEST_CASE("values_on_host lists a strided view's elements in row-major order", "[tensor][copy]") {
  const auto t = numbered(shape{3, 4, 5});
  const auto middle = quintet::slice(quintet::slice(t, 1, 1, 3), 2, 2, 5);  // (3, 2, 3)
  const std::vector<int> values = quintet::values_on_host(middle);
  REQUIRE(values.size() == 18);
  std::size_t at = 0;
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 2; ++j)
      for (std::int64_t k = 0; k < 3; ++k) REQUIRE(values[at++] == t(i, j + 1, k + 2));
  REQUIRE(quintet::values_on_host(quintet::slice(t, 0, 1, 1)).empty());
}

TEST_CASE("copy rejects mismatched shapes naming both", "[tensor][copy]") {
  tensor<float, host> a(shape{2, 3}), b(shape{3, 2});
  REQUIRE_THROWS_WITH(quintet::copy(a, b), Catch::Contains("copy needs equal shapes, got (2, 3) and (3, 2)"));
}

TEST_CASE("fill writes every element of a strided view and nothing else", "[tensor][fill]") {
  tensor<float, host> t(shape{3, 4});
  quintet::fill(t, 0.0f);
  quintet::fill(quintet::slice(t, 1, 1, 3), 2.0f);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) REQUIRE(t(i, j) == ((j == 1 || j == 2) ? 2.0f : 0.0f));
}
