// How the CUDA column sums cut a (rows, columns) matrix, on the host: chunks that cover every row
// once, none empty, enough blocks to fill a large GPU, and no more chunks than 64-row ones.
#include <catch2/catch.hpp>

#include <quintet/kernels/cuda/column_sums_geometry.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace geometry = quintet::kernels::cuda_impl;

TEST_CASE("column sums: chunks of rows cover the matrix and fill the device", "[kernels][tiling]") {
  for (const auto& [rows, columns] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                                      {7, 1000},
                                      {1000, 3},
                                      {1031, 1025},
                                      {16384, 768},
                                      {16384, 50304},
                                      {65536, 768},
                                      {64, 1},
                                      {65, 1},
                                      {3000, 40}}) {
    INFO(rows << " rows, " << columns << " columns");
    const auto split = geometry::column_sum_split_for(rows, columns);
    REQUIRE(split.column_blocks * geometry::column_sum_columns >= columns);
    REQUIRE((split.column_blocks - 1) * geometry::column_sum_columns < columns);
    REQUIRE(split.chunks >= 1);
    REQUIRE(split.chunks <= 65535);  // the grid's y dimension
    REQUIRE(split.chunk_rows >= 1);
    REQUIRE(split.chunks * split.chunk_rows >= rows);       // every row in a chunk
    REQUIRE((split.chunks - 1) * split.chunk_rows < rows);  // the last chunk is not empty
    // Enough blocks, unless the rows run out of 64-row chunks first.
    const std::int64_t blocks = split.column_blocks * split.chunks;
    const bool rows_ran_out =
        split.chunks == std::max<std::int64_t>(rows / geometry::column_sum_least_chunk_rows, 1);
    REQUIRE((blocks >= geometry::column_sum_target_blocks || rows_ran_out));
    // Chunks of at least 64 rows where there are that many.
    if (rows >= geometry::column_sum_least_chunk_rows)
      REQUIRE(split.chunk_rows >= geometry::column_sum_least_chunk_rows);
  }
  // The layer norm of the GPT-2 124M step (16 x 1024 rows of 768): 24 column blocks of 43 chunks.
  const auto gpt = geometry::column_sum_split_for(16384, 768);
  REQUIRE(gpt.column_blocks == 24);
  REQUIRE(gpt.chunks == 43);
  // No rows: one chunk, so each column still receives its total (0).
  const auto empty = geometry::column_sum_split_for(0, 100);
  REQUIRE(empty.chunks == 1);
  REQUIRE(empty.chunk_rows == 1);
}
