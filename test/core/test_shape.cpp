// shape: extents, element counts, row-major strides, and the errors for bad extents.
#include <catch2/catch.hpp>

#include <quintet/core/shape.hpp>

#include <cstdint>

using quintet::shape;

TEST_CASE("shape counts elements and computes row-major strides", "[core][shape]") {
  const shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  const auto strides = s.row_major_strides();
  CHECK(strides[0] == 12);
  CHECK(strides[1] == 4);
  CHECK(strides[2] == 1);
  CHECK(s.to_string() == "(2, 3, 4)");
  CHECK(shape{5}.to_string() == "(5,)");
  CHECK(fmt::format("{}", s) == "(2, 3, 4)");
}

TEST_CASE("a rank-0 shape is a scalar and a zero extent empties the tensor", "[core][shape]") {
  CHECK(shape{}.rank() == 0);
  CHECK(shape{}.numel() == 1);
  CHECK(shape{3, 0, 5}.numel() == 0);
}

TEST_CASE("shape equality compares rank and extents", "[core][shape]") {
  CHECK(shape{2, 3} == shape{2, 3});
  CHECK_FALSE(shape{2, 3} == shape{3, 2});
  CHECK_FALSE(shape{6} == shape{6, 1});
  CHECK(shape{2, 3}.with_extent(1, 7) == shape{2, 7});
}

TEST_CASE("shape rejects bad extents with a message naming them", "[core][shape]") {
  REQUIRE_THROWS_WITH((shape{1, 2, 3, 4, 5, 6, 7}),
                      Catch::Contains("rank 7 exceeds the maximum rank 6"));
  REQUIRE_THROWS_WITH((shape{4, -2}), Catch::Contains("extent -2 of dimension 1 is negative"));
  REQUIRE_THROWS_WITH((shape{std::int64_t{1} << 40, std::int64_t{1} << 40, 1 << 30}),
                      Catch::Contains("more elements than a 64-bit index can count"));
  REQUIRE_THROWS_WITH((shape{2, 3}.extent(2)),
                      Catch::Contains("dimension 2 is out of range for shape (2, 3)"));
}
