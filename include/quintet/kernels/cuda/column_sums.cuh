// Sums over the rows of a (rows, n) matrix, per column, on cuda: the bias gradient and the layer
// norm's weight pass. Two passes, each in a fixed order, so the bits depend on the shape alone (no
// atomics): blocks of 32 columns x 8 row lanes sum chunks of rows (kernels/cuda/
// column_sums_geometry.hpp) into partial sums, then one thread per column adds its chunks' partial
// sums in chunk order. A few columns over many rows (768 over 16384) thus fill the device instead
// of 24 blocks.
//
// Terms: a functor called as terms(r, j, values) filling values[0 .. Count) for element (r, j);
// Finish: finish(j, totals) with the Count column totals.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/cuda/column_sums_geometry.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>

namespace quintet::kernels::cuda_impl {

// Block (column block, chunk): lane (x, y) sums rows first + y, first + y + 8, ... of the chunk in
// order, then lane y = 0 adds the 8 lanes' sums in lane order into partial[chunk][c][j].
template <int Count, class Acc, class Terms>
__global__ void __launch_bounds__(column_sum_columns* column_sum_row_lanes)
    column_partial_sums_kernel(Terms terms, std::int64_t rows, std::int64_t n,
                               std::int64_t chunk_rows, Acc* partial) {
  __shared__ Acc lane_sums[Count][column_sum_row_lanes][column_sum_columns];
  const std::int64_t j = std::int64_t{blockIdx.x} * column_sum_columns + threadIdx.x;
  const std::int64_t first = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t end = first + chunk_rows < rows ? first + chunk_rows : rows;
  Acc sums[Count];
#pragma unroll
  for (int c = 0; c < Count; ++c) sums[c] = 0;
  if (j < n) {
    for (std::int64_t r = first + threadIdx.y; r < end; r += column_sum_row_lanes) {
      Acc values[Count];
      terms(r, j, values);
#pragma unroll
      for (int c = 0; c < Count; ++c) sums[c] += values[c];
    }
  }
#pragma unroll
  for (int c = 0; c < Count; ++c) lane_sums[c][threadIdx.y][threadIdx.x] = sums[c];
  __syncthreads();
  if (threadIdx.y != 0 || j >= n) return;
#pragma unroll
  for (int c = 0; c < Count; ++c) {
    Acc sum = lane_sums[c][0][threadIdx.x];
    for (int lane = 1; lane < column_sum_row_lanes; ++lane) sum += lane_sums[c][lane][threadIdx.x];
    partial[(std::int64_t{blockIdx.y} * Count + c) * n + j] = sum;
  }
}

inline constexpr int column_total_threads = 256;

template <int Count, class Acc, class Finish>
__global__ void __launch_bounds__(column_total_threads)
    column_totals_kernel(const Acc* partial, std::int64_t chunks, std::int64_t n, Finish finish) {
  const std::int64_t j = std::int64_t{blockIdx.x} * column_total_threads + threadIdx.x;
  if (j >= n) return;
  Acc totals[Count];
#pragma unroll
  for (int c = 0; c < Count; ++c) {
    Acc sum = 0;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk)
      sum += partial[(chunk * Count + c) * n + j];
    totals[c] = sum;
  }
  finish(j, totals);
}

// finish(j, totals) once per column j < n with the Count sums over rows of terms(r, j, ...). The
// partial sums live in a temporary on the exec's stream. No rows: every total is 0.
template <int Count, class Acc, class Terms, class Finish>
void column_sums(const execution<cuda>& exec, std::int64_t rows, std::int64_t n, const Terms& terms,
                 const Finish& finish, const char* kernel) {
  if (n == 0) return;
  const column_sum_split split = column_sum_split_for(rows, n);
  QUINTET_CHECK(split.column_blocks <= 2147483647,
                "{} on cuda: {} columns need more than 2^31 - 1 blocks", kernel, n);
  tensor<Acc, cuda> partial(shape{split.chunks * Count * n}, exec.stream());
  const dim3 grid(static_cast<unsigned>(split.column_blocks), static_cast<unsigned>(split.chunks));
  const dim3 block(column_sum_columns, column_sum_row_lanes);
  column_partial_sums_kernel<Count, Acc>
      <<<grid, block, 0, exec.native()>>>(terms, rows, n, split.chunk_rows, partial.data());
  QUINTET_CUDA_CHECK(cudaGetLastError());
  const auto total_blocks =
      static_cast<unsigned>((n + column_total_threads - 1) / column_total_threads);
  column_totals_kernel<Count, Acc><<<total_blocks, column_total_threads, 0, exec.native()>>>(
      partial.data(), split.chunks, n, finish);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quintet::kernels::cuda_impl
