// The row machinery of the CUDA row kernels (softmax, cross-entropy, layer norm; embedding uses the
// 16-byte chunks): a row of up to 16384 floats (8192 with two arrays held) is read once into
// registers, by a warp or a block, and reduced by warp shuffles or cub::BlockReduce; longer rows
// are streamed. Reduction orders depend only on the row length: the same inputs give the same
// bits.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/tensor/cuda_memory.hpp>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace quintet::kernels::cuda_impl {

// --- chunks: the 16-byte pieces a thread reads and writes ----------------------------------------

// Elements of T in one 16-byte access, the widest a thread can issue.
template <class T>
inline constexpr int vector_width = 16 / static_cast<int>(sizeof(T));

// True when rows of `pitch` elements starting at `pointer` can be accessed in 16-byte vectors.
template <class T>
bool vectorisable(const T* pointer, std::int64_t pitch) {
  return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0 && pitch % vector_width<T> == 0;
}

// Elements [column, column + W) of a row of `length` into `out` (those past the end untouched):
// one 16-byte load when the row allows it and the chunk is whole, else element by element.
template <class T>
__device__ __forceinline__ void load_chunk(const T* row, std::int64_t column, std::int64_t length,
                                           bool vectorised, T* out) {
  constexpr int width = vector_width<T>;
  if (vectorised && column + width <= length) {
    const uint4 bits = *reinterpret_cast<const uint4*>(row + column);
    std::memcpy(out, &bits, sizeof(bits));
  } else {
#pragma unroll
    for (int i = 0; i < width; ++i)
      if (column + i < length) out[i] = row[column + i];
  }
}

template <class T>
__device__ __forceinline__ void store_chunk(T* row, std::int64_t column, std::int64_t length,
                                            bool vectorised, const T* in) {
  constexpr int width = vector_width<T>;
  if (vectorised && column + width <= length) {
    uint4 bits;
    std::memcpy(&bits, in, sizeof(bits));
    *reinterpret_cast<uint4*>(row + column) = bits;
  } else {
#pragma unroll
    for (int i = 0; i < width; ++i)
      if (column + i < length) row[column + i] = in[i];
  }
}

// A chunk widened to the accumulator type; `fill` stands for the elements past the end.
template <class T, class Acc>
__device__ __forceinline__ void load_widened(const T* row, std::int64_t column, std::int64_t length,
                                             bool vectorised, Acc* out, Acc fill) {
  T raw[vector_width<T>];
  load_chunk(row, column, length, vectorised, raw);
#pragma unroll
  for (int i = 0; i < vector_width<T>; ++i) out[i] = column + i < length ? widen(raw[i]) : fill;
}

template <class T, class Acc>
__device__ __forceinline__ void store_narrowed(T* row, std::int64_t column, std::int64_t length,
                                               bool vectorised, const Acc* in) {
  T raw[vector_width<T>];
#pragma unroll
  for (int i = 0; i < vector_width<T>; ++i) raw[i] = narrow<T>(in[i]);
  store_chunk(row, column, length, vectorised, raw);
}

// --- arithmetic in the accumulator type ----------------------------------------------------------

__device__ __forceinline__ float exponential(float x) { return expf(x); }
__device__ __forceinline__ double exponential(double x) { return exp(x); }
__device__ __forceinline__ float logarithm(float x) { return logf(x); }
__device__ __forceinline__ double logarithm(double x) { return log(x); }

// fmax never picks a NaN, as the host's std::max(peak, x) from -inf never does; a NaN in a row
// still reaches every output through the sum of exponentials, on both devices.
struct larger_of {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};

template <class Acc>
inline constexpr Acc minus_infinity = -std::numeric_limits<Acc>::infinity();

// --- thread groups that own a row ----------------------------------------------------------------

// A warp per row, 4 rows per block. Sums run as a butterfly: each lane adds the value of the lane
// `offset` away, a + b and b + a are the same bits, so every lane ends with the same result.
template <class Acc>
struct warp_rows {
  static constexpr int lanes = 32;
  static constexpr int rows_per_block = 4;
  static constexpr int threads = lanes * rows_per_block;
  struct storage {};

  __device__ explicit warp_rows(storage&) {}
  __device__ int lane() const { return static_cast<int>(threadIdx.x) % lanes; }
  __device__ bool leader() const { return lane() == 0; }
  __device__ std::int64_t first_row() const {
    return std::int64_t{blockIdx.x} * rows_per_block + threadIdx.x / lanes;
  }
  __device__ std::int64_t row_stride() const { return std::int64_t{gridDim.x} * rows_per_block; }

  __device__ Acc sum(Acc value) {
#pragma unroll
    for (int offset = lanes / 2; offset > 0; offset /= 2)
      value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
  }
  __device__ Acc max(Acc value) {
#pragma unroll
    for (int offset = lanes / 2; offset > 0; offset /= 2)
      value = larger_of{}(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
  }
};

// A block of Threads per row; cub::BlockReduce's tree is fixed for a block size, so are its sums.
template <class Acc, int Threads>
struct block_rows {
  static constexpr int lanes = Threads;
  static constexpr int rows_per_block = 1;
  static constexpr int threads = Threads;
  using reduce = cub::BlockReduce<Acc, Threads>;
  struct storage {
    typename reduce::TempStorage temp;
    Acc result[2];
  };

  __device__ explicit block_rows(storage& shared) : shared_(shared) {}
  __device__ int lane() const { return static_cast<int>(threadIdx.x); }
  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ std::int64_t first_row() const { return blockIdx.x; }
  __device__ std::int64_t row_stride() const { return gridDim.x; }

  __device__ Acc sum(Acc value) { return broadcast(reduce(shared_.temp).Sum(value)); }
  __device__ Acc max(Acc value) {
    return broadcast(reduce(shared_.temp).Reduce(value, larger_of{}));
  }

 private:
  // Thread 0 holds the reduction; one barrier publishes it and also ends every thread's use of
  // the temporary storage, which the next reduction reuses. Results alternate between two slots:
  // a slot is rewritten two reductions later, after the barrier of the one in between, which each
  // thread reaches only once it has read this one.
  __device__ Acc broadcast(Acc value) {
    if (threadIdx.x == 0) shared_.result[slot_] = value;
    __syncthreads();
    const Acc result = shared_.result[slot_];
    slot_ ^= 1;
    return result;
  }

  storage& shared_;
  int slot_ = 0;
};

// A row held in registers by a group of Lanes threads, Items elements each: chunk k of a lane
// covers columns [(k Lanes + lane) W, (k Lanes + lane + 1) W), W = vector_width<T>, so the group's
// k-th access is one contiguous span. The streamed loops below visit a lane's chunks in the same
// order.
template <class T, int Lanes, int Items>
struct row_tile {
  using acc = accumulator_t<T>;
  static constexpr int width = vector_width<T>;
  static_assert(Items % width == 0, "a thread holds whole chunks");
  static constexpr int chunks = Items / width;

  __device__ static std::int64_t column(int lane, int chunk) {
    return (std::int64_t{chunk} * Lanes + lane) * width;
  }
  __device__ static void load(const T* row, std::int64_t length, int lane, bool vectorised,
                              acc (&values)[Items], acc fill) {
#pragma unroll
    for (int k = 0; k < chunks; ++k)
      load_widened(row, column(lane, k), length, vectorised, values + k * width, fill);
  }
  __device__ static void store(T* row, std::int64_t length, int lane, bool vectorised,
                               const acc (&values)[Items]) {
#pragma unroll
    for (int k = 0; k < chunks; ++k)
      store_narrowed(row, column(lane, k), length, vectorised, values + k * width);
  }
};

// The first column of a lane's chunks in a streamed row, and the step to its next chunk.
template <class T, class Group>
__device__ std::int64_t first_column(const Group& group) {
  return std::int64_t{group.lane()} * vector_width<T>;
}
template <class T, class Group>
inline constexpr std::int64_t column_step = std::int64_t{Group::lanes} * vector_width<T>;

// A row's maximum and its sum of exp(x - max), the statistics of the softmax and of the
// log-sum-exp. In registers: `e` receives exp(x - max) (0 past the end of the row).
template <class Acc>
struct exp_statistics {
  Acc peak, total;
};

template <class Group, class Acc, int Items>
__device__ exp_statistics<Acc> exp_statistics_of(Group& group, Acc (&e)[Items]) {
  Acc peak = minus_infinity<Acc>;
#pragma unroll
  for (int i = 0; i < Items; ++i) peak = larger_of{}(peak, e[i]);
  peak = group.max(peak);
  Acc total = 0;
#pragma unroll
  for (int i = 0; i < Items; ++i) {
    e[i] = exponential(e[i] - peak);  // -inf past the end: exp gives 0
    total += e[i];
  }
  return {peak, group.sum(total)};
}

// Streamed: one pass for the maximum, one for the sum.
template <class T, class Group, class Acc = accumulator_t<T>>
__device__ exp_statistics<Acc> streamed_exp_statistics(Group& group, const T* row,
                                                       std::int64_t length, bool vectorised) {
  constexpr int width = vector_width<T>;
  Acc peak = minus_infinity<Acc>;
  for (std::int64_t column = first_column<T>(group); column < length;
       column += column_step<T, Group>) {
    Acc values[width];
    load_widened(row, column, length, vectorised, values, minus_infinity<Acc>);
#pragma unroll
    for (int i = 0; i < width; ++i) peak = larger_of{}(peak, values[i]);
  }
  peak = group.max(peak);
  Acc total = 0;
  for (std::int64_t column = first_column<T>(group); column < length;
       column += column_step<T, Group>) {
    Acc values[width];
    load_widened(row, column, length, vectorised, values, minus_infinity<Acc>);
#pragma unroll
    for (int i = 0; i < width; ++i) total += exponential(values[i] - peak);
  }
  return {peak, group.sum(total)};
}

// --- launching a row operation -------------------------------------------------------------------

// Runs rows.run<Items>(group, row) for every row, each row owned by one Group (Items == 0: the
// operation streams the row through global memory). Rows are visited grid-stride, so any number
// fits the grid; the loop condition is the same for the whole group, as its reductions need.
template <class Group, int Items, class Rows>
__global__ void __launch_bounds__(Group::threads) row_kernel(Rows rows_op, std::int64_t rows) {
  __shared__ typename Group::storage storage;
  Group group(storage);
  for (std::int64_t row = group.first_row(); row < rows; row += group.row_stride())
    rows_op.template run<Items>(group, row);
}

inline constexpr std::int64_t max_grid_blocks = 2147483647;  // gridDim.x < 2^31

template <class Group, int Items, class Rows>
void launch_rows(const execution<cuda>& exec, const Rows& rows_op, std::int64_t rows) {
  const std::int64_t blocks = std::min<std::int64_t>(
      (rows + Group::rows_per_block - 1) / Group::rows_per_block, max_grid_blocks);
  row_kernel<Group, Items>
      <<<static_cast<unsigned>(blocks), Group::threads, 0, exec.native()>>>(rows_op, rows);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

// A row operation that holds its row in registers, launched by row length. A thread keeps at most
// 32 words of row per operand array (32 floats or 16 doubles): a warp per row up to 32 times that,
// blocks of 256 up to 8192 floats (the rows of a few thousand elements that attention and the loss
// produce), blocks of 512 up to 16384 for operations that hold one array (Rows::register_arrays;
// with two, 64 words of row exceed what 128 registers a thread leave, measured with ptxas -v as
// spills), and longer rows streamed by blocks of 512.
template <class Rows>
void launch_register_rows(const execution<cuda>& exec, const Rows& rows_op, std::int64_t rows,
                          std::int64_t length) {
  using acc = typename Rows::acc;
  constexpr int most = sizeof(acc) == 8 ? 16 : 32;
  constexpr int half = most / 2, quarter = most / 4;
  if (length <= 32 * quarter) {
    launch_rows<warp_rows<acc>, quarter>(exec, rows_op, rows);
  } else if (length <= 32 * most) {
    launch_rows<warp_rows<acc>, most>(exec, rows_op, rows);
  } else if (length <= 256 * quarter) {
    launch_rows<block_rows<acc, 256>, quarter>(exec, rows_op, rows);
  } else if (length <= 256 * half) {
    launch_rows<block_rows<acc, 256>, half>(exec, rows_op, rows);
  } else if (length <= 256 * most) {
    launch_rows<block_rows<acc, 256>, most>(exec, rows_op, rows);
  } else {
    if constexpr (Rows::register_arrays == 1) {
      if (length <= 512 * most) return launch_rows<block_rows<acc, 512>, most>(exec, rows_op, rows);
    }
    launch_rows<block_rows<acc, 512>, 0>(exec, rows_op, rows);
  }
}

// A row operation that reads its row once whatever its length: a warp per row up to 1024
// elements, a block of 512 beyond.
template <class Rows>
void launch_streamed_rows(const execution<cuda>& exec, const Rows& rows_op, std::int64_t rows,
                          std::int64_t length) {
  using acc = typename Rows::acc;
  if (length <= 1024) {
    launch_rows<warp_rows<acc>, 0>(exec, rows_op, rows);
  } else {
    launch_rows<block_rows<acc, 512>, 0>(exec, rows_op, rows);
  }
}

}  // namespace quintet::kernels::cuda_impl
