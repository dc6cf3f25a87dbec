// dropout on cuda tensors: the host's mask bit for bit (the same Philox draw per global element
// index, compared with p in float) and the same single rounding of in * 1 / (1 - p), so the device
// and the host give the same bits for any region of the global tensor.
#pragma once

#include <quintet/core/philox.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/dropout.hpp>
#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/region.hpp>

#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

// The local block as rows of its innermost dimension, in a form a kernel takes by value: along a
// row the global indices are consecutive, so a row needs only the global index of its first
// element.
struct dropout_rows {
  int leading;                           // dimensions above the row: rank - 1 (0 for a scalar)
  std::int64_t extent[shape::max_rank];  // the local extents of those dimensions
  std::int64_t offset[shape::max_rank];  // the region's offsets along them
  std::int64_t global_stride[shape::max_rank];  // their row-major strides in the global tensor
  std::int64_t row_offset;                      // the region's offset along the innermost dimension

  // The global index of the first element of local row `row` (row-major over the leading dims).
  __host__ __device__ std::uint64_t first_global_index(std::int64_t row) const {
    std::int64_t index = row_offset;
    for (int d = leading - 1; d >= 0; --d) {
      const std::int64_t coordinate = row % extent[d];
      row /= extent[d];
      index += (offset[d] + coordinate) * global_stride[d];
    }
    return static_cast<std::uint64_t>(index);
  }
};

inline dropout_rows dropout_rows_of(const region& where) {
  const int rank = where.local_shape().rank();
  const auto global_strides = where.global_shape().row_major_strides();
  dropout_rows rows{};
  rows.leading = rank > 0 ? rank - 1 : 0;
  for (int d = 0; d < rows.leading; ++d) {
    rows.extent[d] = where.local_shape()[d];
    rows.offset[d] = where.offsets()[d];
    rows.global_stride[d] = global_strides[d];
  }
  rows.row_offset = rank > 0 ? where.offsets()[rank - 1] : 0;
  return rows;
}

// Each thread takes groups of 4 consecutive elements of a row (a Philox block holds 4 draws, so a
// group evaluates at most 2 blocks; rng_cursor keeps the last one).
inline constexpr int dropout_group = 4;

template <class T>
__global__ void dropout_kernel(const T* in, T* out, std::int64_t rows, std::int64_t length,
                               dropout_rows where, float probability, accumulator_t<T> keep_scale,
                               rng_key key) {
  const std::int64_t groups_per_row = (length + dropout_group - 1) / dropout_group;
  const std::int64_t groups = rows * groups_per_row;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  rng_cursor draws(key);
  for (std::int64_t group = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; group < groups;
       group += stride) {
    const std::int64_t row = group / groups_per_row;
    const std::int64_t column = (group - row * groups_per_row) * dropout_group;
    const std::uint64_t first = where.first_global_index(row) + static_cast<std::uint64_t>(column);
    const std::int64_t offset = row * length + column;
    const std::int64_t members = length - column < dropout_group ? length - column : dropout_group;
    for (std::int64_t m = 0; m < members; ++m) {
      // host_impl::dropout_keeps and the host's scaling: one 24-bit draw against p in float.
      const bool keep = draws.uniform_float(first + static_cast<std::uint64_t>(m)) >= probability;
      out[offset + m] = keep ? narrow<T>(widen(in[offset + m]) * keep_scale) : T(0.0f);
    }
  }
}

}  // namespace cuda_impl

template <>
struct dropout_engine<cuda> {
  template <class T>
  static void apply(const execution<cuda>& exec, const T* in, T* out, float probability,
                    rng_key key, const region& where) {
    const shape& local = where.local_shape();
    if (local.numel() == 0) return;
    const int rank = local.rank();
    const std::int64_t length = rank > 0 ? local[rank - 1] : 1;
    const std::int64_t rows = local.numel() / length;
    using acc = accumulator_t<T>;
    // The host's expression (host_impl::dropout_apply), so the scale has the host's bits.
    const acc keep_scale = acc(1) / (acc(1) - static_cast<acc>(probability));
    const std::int64_t groups =
        rows * ((length + cuda_impl::dropout_group - 1) / cuda_impl::dropout_group);
    const unsigned blocks = quintet::detail::elementwise_blocks(groups);
    constexpr int threads = quintet::detail::elementwise_threads;
    cuda_impl::dropout_kernel<<<blocks, threads, 0, exec.native()>>>(
        in, out, rows, length, cuda_impl::dropout_rows_of(where), probability, keep_scale, key);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace quintet::kernels
