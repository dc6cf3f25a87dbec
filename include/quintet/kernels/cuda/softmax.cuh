// softmax on cuda tensors: row operations of kernels/cuda/row_groups.cuh (a row read once into
// registers by a warp or a block up to 16384 floats, 8192 in the backward; longer rows streamed).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/row_groups.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/softmax.hpp>

#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

// --- softmax -------------------------------------------------------------------------------------

// y = exp(x - max) / sum exp(x - max) per row of n, as the host: e evaluated once, then e * (1 /
// sum). y may be x: each element is read and written by the same thread, read first.
template <class T>
struct softmax_forward_rows {
  using acc = accumulator_t<T>;
  static constexpr int register_arrays = 1;
  const T* x;
  T* y;
  std::int64_t n;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    if constexpr (Items > 0) {
      using tile = row_tile<T, Group::lanes, Items>;
      acc e[Items];
      tile::load(xr, n, group.lane(), vectorised, e, minus_infinity<acc>);
      const acc inv = acc(1) / exp_statistics_of(group, e).total;
#pragma unroll
      for (int i = 0; i < Items; ++i) e[i] *= inv;
      tile::store(yr, n, group.lane(), vectorised, e);
    } else {
      const auto statistics = streamed_exp_statistics<T>(group, xr, n, vectorised);
      const acc inv = acc(1) / statistics.total;
      constexpr int width = vector_width<T>;
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc values[width];
        load_widened(xr, column, n, vectorised, values, acc(0));
#pragma unroll
        for (int i = 0; i < width; ++i) values[i] = exponential(values[i] - statistics.peak) * inv;
        store_narrowed(yr, column, n, vectorised, values);
      }
    }
  }
};

// dx = y (dy - sum_j dy_j y_j) per row of n. dx may be dy (each element read before it is
// written, by the same thread).
template <class T>
struct softmax_backward_rows {
  using acc = accumulator_t<T>;
  static constexpr int register_arrays = 2;
  const T* y;
  const T* dy;
  T* dx;
  std::int64_t n;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    const T* yr = y + row * n;
    const T* dyr = dy + row * n;
    T* dxr = dx + row * n;
    if constexpr (Items > 0) {
      using tile = row_tile<T, Group::lanes, Items>;
      acc ys[Items], ds[Items];
      tile::load(yr, n, group.lane(), vectorised, ys, acc(0));
      tile::load(dyr, n, group.lane(), vectorised, ds, acc(0));
      acc dot = 0;
#pragma unroll
      for (int i = 0; i < Items; ++i) dot += ds[i] * ys[i];
      dot = group.sum(dot);
#pragma unroll
      for (int i = 0; i < Items; ++i) ds[i] = ys[i] * (ds[i] - dot);
      tile::store(dxr, n, group.lane(), vectorised, ds);
    } else {
      constexpr int width = vector_width<T>;
      acc dot = 0;
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc ys[width], ds[width];
        load_widened(yr, column, n, vectorised, ys, acc(0));
        load_widened(dyr, column, n, vectorised, ds, acc(0));
#pragma unroll
        for (int i = 0; i < width; ++i) dot += ds[i] * ys[i];
      }
      dot = group.sum(dot);
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc ys[width], ds[width];
        load_widened(yr, column, n, vectorised, ys, acc(0));
        load_widened(dyr, column, n, vectorised, ds, acc(0));
#pragma unroll
        for (int i = 0; i < width; ++i) ds[i] = ys[i] * (ds[i] - dot);
        store_narrowed(dxr, column, n, vectorised, ds);
      }
    }
  }
};

}  // namespace cuda_impl

template <>
struct softmax_engine<cuda> {
  template <class T>
  static void forward(const execution<cuda>& exec, const T* x, T* y, std::int64_t rows,
                      std::int64_t n) {
    if (rows == 0 || n == 0) return;
    const bool vectorised = cuda_impl::vectorisable(x, n) && cuda_impl::vectorisable(y, n);
    cuda_impl::launch_register_rows(exec, cuda_impl::softmax_forward_rows<T>{x, y, n, vectorised},
                                    rows, n);
  }

  template <class T>
  static void backward(const execution<cuda>& exec, const T* y, const T* dy, T* dx,
                       std::int64_t rows, std::int64_t n) {
    if (rows == 0 || n == 0) return;
    const bool vectorised = cuda_impl::vectorisable(y, n) && cuda_impl::vectorisable(dy, n) &&
                            cuda_impl::vectorisable(dx, n);
    cuda_impl::launch_register_rows(
        exec, cuda_impl::softmax_backward_rows<T>{y, dy, dx, n, vectorised}, rows, n);
  }
};

}  // namespace quintet::kernels
