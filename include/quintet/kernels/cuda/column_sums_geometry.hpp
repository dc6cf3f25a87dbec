// How the CUDA column sums (kernels/cuda/column_sums.cuh) cut a (rows, columns) matrix: blocks of
// 32 columns x 8 row lanes, the rows split into chunks so that a matrix of few columns (a bias or
// a layer norm's 768) still fills the device. Plain C++, tested on the host.
#pragma once

#include <cstdint>

namespace quintet::kernels::cuda_impl {

inline constexpr int column_sum_columns = 32, column_sum_row_lanes = 8;
// Enough blocks for every SM of a large GPU several times over (an H200 has 132), and at least
// this many rows per chunk, so the partial sums stay a small fraction of the matrix.
inline constexpr std::int64_t column_sum_target_blocks = 1024;
inline constexpr std::int64_t column_sum_least_chunk_rows = 64;

struct column_sum_split {
  std::int64_t column_blocks, chunks, chunk_rows;
};

// chunks * chunk_rows >= rows, every chunk but the last full and none empty; no rows: one chunk
// (of nothing), so each column still gets its total, 0.
constexpr column_sum_split column_sum_split_for(std::int64_t rows, std::int64_t columns) {
  const std::int64_t column_blocks = (columns + column_sum_columns - 1) / column_sum_columns;
  if (rows <= 0) return {column_blocks, 1, 1};
  const std::int64_t wanted = (column_sum_target_blocks + column_blocks - 1) / column_blocks;
  const std::int64_t most = rows / column_sum_least_chunk_rows;  // chunks of >= 64 rows
  std::int64_t chunks = wanted < most ? wanted : most;
  if (chunks < 1) chunks = 1;
  const std::int64_t chunk_rows = (rows + chunks - 1) / chunks;
  return {column_blocks, (rows + chunk_rows - 1) / chunk_rows, chunk_rows};
}

}  // namespace quintet::kernels::cuda_impl
