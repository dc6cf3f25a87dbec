// row_range, split_rows and token_batch assembly: the slicing a data-parallel rank and a
// micro-batch loop rely on, and the checks every source applies to a batch request.
#include <catch2/catch.hpp>

#include <quintet/data/token_batch.hpp>

#include <cstdint>
#include <span>

using quintet::row_range;
using quintet::split_rows;

TEST_CASE("split_rows gives equal consecutive parts that tile the whole", "[data][batch]") {
  for (const std::int64_t parts : {1, 2, 3, 4, 6, 12}) {
    std::int64_t expected_begin = 5;
    for (std::int64_t i = 0; i < parts; ++i) {
      const row_range part = split_rows({5, 17}, parts, i);
      CHECK(part.begin == expected_begin);
      CHECK(part.size() == 12 / parts);
      expected_begin = part.end;
    }
    CHECK(expected_begin == 17);
  }
  // Nested: micro-batch 1 of 2 of data-parallel rank 2 of 3 in a batch of 12.
  CHECK(split_rows(split_rows({0, 12}, 3, 2), 2, 1) == row_range{10, 12});
}

TEST_CASE("split_rows rejects parts that do not divide, bad indices and bad ranges",
          "[data][batch][errors]") {
  REQUIRE_THROWS_WITH(split_rows({0, 10}, 4, 0),
                      Catch::Contains("10 rows [0, 10) do not split into 4 equal parts"));
  REQUIRE_THROWS_WITH(split_rows({0, 8}, 4, 4), Catch::Contains("part 4 is out of range for 4"));
  REQUIRE_THROWS_WITH(split_rows({0, 8}, 4, -1), Catch::Contains("part -1 is out of range"));
  REQUIRE_THROWS_WITH(split_rows({0, 8}, 0, 0), Catch::Contains("into 0 parts"));
  REQUIRE_THROWS_WITH(split_rows({6, 2}, 2, 0), Catch::Contains("row range [6, 2)"));
  REQUIRE_THROWS_WITH(split_rows({-2, 2}, 2, 0), Catch::Contains("row range [-2, 2)"));
}

namespace {

// A source whose window of row r at step 7 is 100 r + 1, 100 r + 4, 100 r + 7, ...
struct counting_windows {
  void write_window(std::int64_t step, std::int64_t row, std::span<std::int32_t> window) const {
    CHECK(step == 7);
    for (std::size_t i = 0; i < window.size(); ++i)
      window[i] = static_cast<std::int32_t>(100 * row + 3 * i + 1);
  }
};

}  // namespace

TEST_CASE("assemble_token_batch shifts each window into inputs and targets", "[data][batch]") {
  const std::int64_t seq = 5;
  const auto batch = quintet::assemble_token_batch(counting_windows{}, 7, {3, 6}, seq);
  CHECK(batch.step == 7);
  CHECK(batch.rows == row_range{3, 6});
  CHECK(batch.row_count() == 3);
  CHECK(batch.seq() == seq);
  CHECK(batch.inputs.shape() == quintet::shape{3, seq});
  CHECK(batch.targets.shape() == quintet::shape{3, seq});
  for (std::int64_t r = 0; r < 3; ++r) {
    for (std::int64_t i = 0; i < seq; ++i) {
      CHECK(batch.inputs(r, i) == 100 * (r + 3) + 3 * i + 1);
      CHECK(batch.targets(r, i) == 100 * (r + 3) + 3 * (i + 1) + 1);
    }
  }
}

TEST_CASE("batch requests with a bad step, rows or sequence length are rejected",
          "[data][batch][errors]") {
  using quintet::check_batch_request;
  REQUIRE_NOTHROW(check_batch_request(0, {0, 1}, 1));
  REQUIRE_THROWS_WITH(check_batch_request(-1, {0, 4}, 8), Catch::Contains("batch step -1"));
  REQUIRE_THROWS_WITH(check_batch_request(0, {4, 4}, 8),
                      Catch::Contains("batch rows [4, 4) are out of range"));
  REQUIRE_THROWS_WITH(check_batch_request(0, {-1, 4}, 8),
                      Catch::Contains("batch rows [-1, 4) are out of range"));
  REQUIRE_THROWS_WITH(check_batch_request(0, {0, quintet::max_batch_rows + 1}, 8),
                      Catch::Contains("batch rows [0, 2147483649) are out of range"));
  REQUIRE_THROWS_WITH(check_batch_request(0, {0, 4}, 0),
                      Catch::Contains("sequence length 0 is out of range"));
  REQUIRE_THROWS_WITH(check_batch_request(0, {0, 4}, -3),
                      Catch::Contains("sequence length -3 is out of range"));
}
