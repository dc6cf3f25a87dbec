// layer_norm on cuda tensors. The forward and the backward's input pass (dx) are row operations of
// kernels/cuda/row_groups.cuh: a row of up to 1024 elements is held in a warp's registers (x read
// from memory once), longer ones in a block's, the longest streamed; the statistics are the host's
// shifted two passes. The weight pass (dgamma, dbeta) is a column sum over the rows in a fixed
// order (kernels/cuda/column_sums.cuh). Every result depends on the shape alone, not on scheduling.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/column_sums.cuh>
#include <quintet/kernels/cuda/row_groups.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/tensor/cuda_memory.hpp>

#include <cstdint>
#include <type_traits>

namespace quintet::kernels {

namespace cuda_impl {

// Whether element i of a lane's register tile lies inside a row of n.
template <class Tile>
__device__ __forceinline__ bool inside_row(int lane, int i, std::int64_t n) {
  return Tile::column(lane, i / Tile::width) + i % Tile::width < n;
}

// y = (x - mean) rstd gamma + beta per row of n, with shift = x[0], mean = shift + sum(x - shift)
// / n, rstd = 1 / sqrt(sum((x - mean)^2) / n + eps), as the host computes them.
template <class T>
struct layer_norm_forward_rows {
  using acc = accumulator_t<T>;
  static constexpr int register_arrays = 1;
  const T* x;
  const T* gamma;
  const T* beta;
  T* y;
  acc* mean;
  acc* rstd;
  std::int64_t n;
  acc eps;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    constexpr int width = vector_width<T>;
    const T* xr = x + row * n;
    T* yr = y + row * n;
    const acc shift = widen(xr[0]);
    const acc count = static_cast<acc>(n);
    if constexpr (Items > 0) {
      using tile = row_tile<T, Group::lanes, Items>;
      const int lane = group.lane();
      acc v[Items];
      tile::load(xr, n, lane, vectorised, v, shift);  // past the end: shift, adding 0 below
      acc partial = 0;
#pragma unroll
      for (int i = 0; i < Items; ++i) partial += v[i] - shift;
      const acc mu = shift + group.sum(partial) / count;
      partial = 0;
#pragma unroll
      for (int i = 0; i < Items; ++i) {
        const acc d = inside_row<tile>(lane, i, n) ? v[i] - mu : acc(0);
        partial += d * d;
      }
      const acc inv = acc(1) / sqrt(group.sum(partial) / count + eps);
      if (group.leader()) {
        mean[row] = mu;
        rstd[row] = inv;
      }
#pragma unroll
      for (int k = 0; k < tile::chunks; ++k) {
        acc g[width], b[width];
        load_widened(gamma, tile::column(lane, k), n, vectorised, g, acc(0));
        load_widened(beta, tile::column(lane, k), n, vectorised, b, acc(0));
#pragma unroll
        for (int w = 0; w < width; ++w) {
          acc& value = v[k * width + w];
          value = (value - mu) * inv * g[w] + b[w];
        }
      }
      tile::store(yr, n, lane, vectorised, v);
    } else {
      acc partial = 0;
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc v[width];
        load_widened(xr, column, n, vectorised, v, shift);
#pragma unroll
        for (int w = 0; w < width; ++w) partial += v[w] - shift;
      }
      const acc mu = shift + group.sum(partial) / count;
      partial = 0;
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc v[width];
        load_widened(xr, column, n, vectorised, v, mu);  // past the end: mu, adding 0
#pragma unroll
        for (int w = 0; w < width; ++w) partial += (v[w] - mu) * (v[w] - mu);
      }
      const acc inv = acc(1) / sqrt(group.sum(partial) / count + eps);
      if (group.leader()) {
        mean[row] = mu;
        rstd[row] = inv;
      }
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc v[width], g[width], b[width];
        load_widened(xr, column, n, vectorised, v, acc(0));
        load_widened(gamma, column, n, vectorised, g, acc(0));
        load_widened(beta, column, n, vectorised, b, acc(0));
#pragma unroll
        for (int w = 0; w < width; ++w) v[w] = (v[w] - mu) * inv * g[w] + b[w];
        store_narrowed(yr, column, n, vectorised, v);
      }
    }
  }
};

// dx = rstd (g - mean(g) - xhat mean(g xhat)) per row, g = dy gamma, xhat = (x - mean) rstd.
template <class T>
struct layer_norm_backward_input_rows {
  using acc = accumulator_t<T>;
  static constexpr int register_arrays = 2;
  const T* x;
  const T* gamma;
  const acc* mean;
  const acc* rstd;
  const T* dy;
  T* dx;
  std::int64_t n;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    constexpr int width = vector_width<T>;
    const T* xr = x + row * n;
    const T* dyr = dy + row * n;
    T* dxr = dx + row * n;
    const acc mu = mean[row], inv = rstd[row], count = static_cast<acc>(n);
    acc g_partial = 0, g_xhat_partial = 0;
    if constexpr (Items > 0) {
      using tile = row_tile<T, Group::lanes, Items>;
      const int lane = group.lane();
      acc xhat[Items], g[Items];
      tile::load(xr, n, lane, vectorised, xhat, mu);  // past the end: xhat 0
      tile::load(dyr, n, lane, vectorised, g, acc(0));
#pragma unroll
      for (int k = 0; k < tile::chunks; ++k) {
        acc gam[width];
        load_widened(gamma, tile::column(lane, k), n, vectorised, gam, acc(0));
#pragma unroll
        for (int w = 0; w < width; ++w) {
          const int i = k * width + w;
          g[i] *= gam[w];
          xhat[i] = (xhat[i] - mu) * inv;
          g_partial += g[i];
          g_xhat_partial += g[i] * xhat[i];
        }
      }
      const acc g_mean = group.sum(g_partial) / count;
      const acc g_xhat_mean = group.sum(g_xhat_partial) / count;
#pragma unroll
      for (int i = 0; i < Items; ++i) g[i] = inv * (g[i] - g_mean - xhat[i] * g_xhat_mean);
      tile::store(dxr, n, lane, vectorised, g);
    } else {
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc xs[width], ds[width], gam[width];
        load_widened(xr, column, n, vectorised, xs, mu);
        load_widened(dyr, column, n, vectorised, ds, acc(0));
        load_widened(gamma, column, n, vectorised, gam, acc(0));
#pragma unroll
        for (int w = 0; w < width; ++w) {
          const acc g = ds[w] * gam[w];
          g_partial += g;
          g_xhat_partial += g * (xs[w] - mu) * inv;
        }
      }
      const acc g_mean = group.sum(g_partial) / count;
      const acc g_xhat_mean = group.sum(g_xhat_partial) / count;
      for (std::int64_t column = first_column<T>(group); column < n;
           column += column_step<T, Group>) {
        acc xs[width], ds[width], gam[width];
        load_widened(xr, column, n, vectorised, xs, mu);
        load_widened(dyr, column, n, vectorised, ds, acc(0));
        load_widened(gamma, column, n, vectorised, gam, acc(0));
#pragma unroll
        for (int w = 0; w < width; ++w) {
          const acc xhat = (xs[w] - mu) * inv;
          ds[w] = inv * (ds[w] * gam[w] - g_mean - xhat * g_xhat_mean);
        }
        store_narrowed(dxr, column, n, vectorised, ds);
      }
    }
  }
};

// The weight pass's terms for element (r, j): dy xhat for dgamma, dy for dbeta.
template <class T>
struct layer_norm_weight_terms {
  using acc = accumulator_t<T>;
  const T* x;
  const acc* mean;
  const acc* rstd;
  const T* dy;
  std::int64_t n;
  __device__ void operator()(std::int64_t r, std::int64_t j, acc (&values)[2]) const {
    const acc d = widen(dy[r * n + j]);
    values[0] = d * (widen(x[r * n + j]) - mean[r]) * rstd[r];
    values[1] = d;
  }
};

template <class T>
struct layer_norm_weight_finish {
  T* dgamma;
  T* dbeta;
  __device__ void operator()(std::int64_t j, const accumulator_t<T> (&totals)[2]) const {
    dgamma[j] = narrow<T>(widen(dgamma[j]) + totals[0]);
    dbeta[j] = narrow<T>(widen(dbeta[j]) + totals[1]);
  }
};

}  // namespace cuda_impl

template <>
struct layer_norm_engine<cuda> {
  template <class T, class Acc>
  static void forward(const execution<cuda>& exec, const T* x, const T* gamma, const T* beta, T* y,
                      Acc* mean, Acc* rstd, std::int64_t rows, std::int64_t n, Acc eps) {
    static_assert(std::is_same_v<Acc, accumulator_t<T>>, "layer_norm: statistics of accumulator_t");
    if (rows == 0 || n == 0) return;
    const bool vectorised = cuda_impl::vectorisable(x, n) && cuda_impl::vectorisable(y, n) &&
                            cuda_impl::vectorisable(gamma, n) && cuda_impl::vectorisable(beta, n);
    cuda_impl::launch_register_rows(
        exec,
        cuda_impl::layer_norm_forward_rows<T>{x, gamma, beta, y, mean, rstd, n, eps, vectorised},
        rows, n);
  }

  template <class T, class Acc>
  static void backward_input(const execution<cuda>& exec, const T* x, const T* gamma,
                             const Acc* mean, const Acc* rstd, const T* dy, T* dx,
                             std::int64_t rows, std::int64_t n) {
    if (rows == 0 || n == 0) return;
    const bool vectorised = cuda_impl::vectorisable(x, n) && cuda_impl::vectorisable(dy, n) &&
                            cuda_impl::vectorisable(dx, n) && cuda_impl::vectorisable(gamma, n);
    cuda_impl::launch_register_rows(
        exec,
        cuda_impl::layer_norm_backward_input_rows<T>{x, gamma, mean, rstd, dy, dx, n, vectorised},
        rows, n);
  }

  template <class T, class Acc>
  static void backward_weight(const execution<cuda>& exec, const T* x, const Acc* mean,
                              const Acc* rstd, const T* dy, T* dgamma, T* dbeta, std::int64_t rows,
                              std::int64_t n) {
    if (rows == 0) return;
    cuda_impl::column_sums<2, Acc>(
        exec, rows, n, cuda_impl::layer_norm_weight_terms<T>{x, mean, rstd, dy, n},
        cuda_impl::layer_norm_weight_finish<T>{dgamma, dbeta}, "layer_norm_backward_weight");
  }

  // The input pass, then the weight pass: the same launches as calling them apart, the same bits.
  template <class T, class Acc>
  static void backward(const execution<cuda>& exec, const T* x, const T* gamma, const Acc* mean,
                       const Acc* rstd, const T* dy, T* dx, T* dgamma, T* dbeta, std::int64_t rows,
                       std::int64_t n) {
    backward_input(exec, x, gamma, mean, rstd, dy, dx, rows, n);
    backward_weight(exec, x, mean, rstd, dy, dgamma, dbeta, rows, n);
  }
};

}  // namespace quintet::kernels
