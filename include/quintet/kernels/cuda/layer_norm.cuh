// layer_norm on cuda tensors: one thread block per row, row statistics by cub::BlockReduce (the
// same shifted two-pass mean and variance as the host). The backward's input pass (dx) is a row
// kernel; its weight pass (dgamma, dbeta) a column kernel that sums over rows in a fixed order, so
// results do not depend on scheduling.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/tensor/cuda_memory.hpp>

#include <cub/block/block_reduce.cuh>

#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

// 256 threads per row: a 768..8192-wide row gives each thread 3..32 elements.
inline constexpr int layer_norm_threads = 256;

template <class T, class Acc, int Threads>
__global__ void layer_norm_forward_kernel(const T* x, const T* gamma, const T* beta, T* y,
                                          Acc* mean, Acc* rstd, std::int64_t n, Acc eps) {
  using reduce = cub::BlockReduce<Acc, Threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ Acc row_mean, row_rstd;
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  const Acc shift = widen(xr[0]);
  Acc partial = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += Threads) partial += widen(xr[j]) - shift;
  const Acc sum = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) row_mean = shift + sum / static_cast<Acc>(n);
  __syncthreads();
  const Acc mu = row_mean;
  partial = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += Threads) {
    const Acc d = widen(xr[j]) - mu;
    partial += d * d;
  }
  const Acc squares = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) {
    row_rstd = Acc(1) / sqrt(squares / static_cast<Acc>(n) + eps);
    mean[row] = mu;
    rstd[row] = row_rstd;
  }
  __syncthreads();
  const Acc inv = row_rstd;
  T* yr = y + row * n;
  for (std::int64_t j = threadIdx.x; j < n; j += Threads)
    yr[j] = narrow<T>((widen(xr[j]) - mu) * inv * widen(gamma[j]) + widen(beta[j]));
}

// dx per row: rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
template <class T, class Acc, int Threads>
__global__ void layer_norm_backward_input_kernel(const T* x, const T* gamma, const Acc* mean,
                                                 const Acc* rstd, const T* dy, T* dx,
                                                 std::int64_t n) {
  using reduce = cub::BlockReduce<Acc, Threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ Acc g_mean_shared, g_xhat_mean_shared;
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  const T* dyr = dy + row * n;
  const Acc mu = mean[row], inv = rstd[row];
  Acc g_partial = 0, g_xhat_partial = 0;
  for (std::int64_t j = threadIdx.x; j < n; j += Threads) {
    const Acc g = widen(dyr[j]) * widen(gamma[j]);
    g_partial += g;
    g_xhat_partial += g * (widen(xr[j]) - mu) * inv;
  }
  const Acc g_sum = reduce(storage).Sum(g_partial);
  __syncthreads();  // the temporary storage is reused
  const Acc g_xhat_sum = reduce(storage).Sum(g_xhat_partial);
  if (threadIdx.x == 0) {
    g_mean_shared = g_sum / static_cast<Acc>(n);
    g_xhat_mean_shared = g_xhat_sum / static_cast<Acc>(n);
  }
  __syncthreads();
  const Acc g_mean = g_mean_shared, g_xhat_mean = g_xhat_mean_shared;
  T* dxr = dx + row * n;
  for (std::int64_t j = threadIdx.x; j < n; j += Threads) {
    const Acc xhat = (widen(xr[j]) - mu) * inv;
    const Acc g = widen(dyr[j]) * widen(gamma[j]);
    dxr[j] = narrow<T>(inv * (g - g_mean - xhat * g_xhat_mean));
  }
}

// dgamma[j] += sum_rows dy xhat, dbeta[j] += sum_rows dy: a block is 32 columns x 8 row lanes;
// lanes stride over rows, then the 8 partial sums meet in shared memory (fixed order).
inline constexpr int column_tile = 32, row_lanes = 8;

template <class T, class Acc>
__global__ void layer_norm_backward_weight_kernel(const T* x, const Acc* mean, const Acc* rstd,
                                                  const T* dy, T* dgamma, T* dbeta,
                                                  std::int64_t rows, std::int64_t n) {
  __shared__ Acc gamma_part[row_lanes][column_tile], beta_part[row_lanes][column_tile];
  const std::int64_t j = std::int64_t{blockIdx.x} * column_tile + threadIdx.x;
  Acc gamma_sum = 0, beta_sum = 0;
  if (j < n) {
    for (std::int64_t r = threadIdx.y; r < rows; r += row_lanes) {
      const Acc d = widen(dy[r * n + j]);
      gamma_sum += d * (widen(x[r * n + j]) - mean[r]) * rstd[r];
      beta_sum += d;
    }
  }
  gamma_part[threadIdx.y][threadIdx.x] = gamma_sum;
  beta_part[threadIdx.y][threadIdx.x] = beta_sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    for (int lane = 1; lane < row_lanes; ++lane) {
      gamma_sum += gamma_part[lane][threadIdx.x];
      beta_sum += beta_part[lane][threadIdx.x];
    }
    dgamma[j] = narrow<T>(widen(dgamma[j]) + gamma_sum);
    dbeta[j] = narrow<T>(widen(dbeta[j]) + beta_sum);
  }
}

inline void check_rows_fit(std::int64_t rows, const char* kernel) {
  QUINTET_CHECK(rows <= 2147483647, "{} on cuda: {} rows exceed the grid's 2^31 - 1 blocks", kernel,
                rows);
}

}  // namespace cuda_impl

template <>
struct layer_norm_engine<cuda> {
  template <class T, class Acc>
  static void forward(const execution<cuda>& exec, const T* x, const T* gamma, const T* beta, T* y,
                      Acc* mean, Acc* rstd, std::int64_t rows, std::int64_t n, Acc eps) {
    if (rows == 0) return;
    cuda_impl::check_rows_fit(rows, "layer_norm_forward");
    constexpr int threads = cuda_impl::layer_norm_threads;
    cuda_impl::layer_norm_forward_kernel<T, Acc, threads>
        <<<static_cast<unsigned>(rows), threads, 0, exec.native()>>>(x, gamma, beta, y, mean, rstd,
                                                                     n, eps);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T, class Acc>
  static void backward_input(const execution<cuda>& exec, const T* x, const T* gamma,
                             const Acc* mean, const Acc* rstd, const T* dy, T* dx,
                             std::int64_t rows, std::int64_t n) {
    if (rows == 0) return;
    cuda_impl::check_rows_fit(rows, "layer_norm_backward_input");
    constexpr int threads = cuda_impl::layer_norm_threads;
    cuda_impl::layer_norm_backward_input_kernel<T, Acc, threads>
        <<<static_cast<unsigned>(rows), threads, 0, exec.native()>>>(x, gamma, mean, rstd, dy, dx,
                                                                     n);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T, class Acc>
  static void backward_weight(const execution<cuda>& exec, const T* x, const Acc* mean,
                              const Acc* rstd, const T* dy, T* dgamma, T* dbeta, std::int64_t rows,
                              std::int64_t n) {
    if (rows == 0) return;
    const dim3 block(cuda_impl::column_tile, cuda_impl::row_lanes);
    const auto column_blocks =
        static_cast<unsigned>((n + cuda_impl::column_tile - 1) / cuda_impl::column_tile);
    cuda_impl::layer_norm_backward_weight_kernel<T, Acc>
        <<<column_blocks, block, 0, exec.native()>>>(x, mean, rstd, dy, dgamma, dbeta, rows, n);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  // The two kernels are already apart (one block per row, then one per 32 columns), so the fused
  // backward is the input pass followed by the weight pass: the same launches, the same bits.
  template <class T, class Acc>
  static void backward(const execution<cuda>& exec, const T* x, const T* gamma, const Acc* mean,
                       const Acc* rstd, const T* dy, T* dx, T* dgamma, T* dbeta, std::int64_t rows,
                       std::int64_t n) {
    cuda_impl::check_rows_fit(rows, "layer_norm_backward");
    backward_input(exec, x, gamma, mean, rstd, dy, dx, rows, n);
    backward_weight(exec, x, mean, rstd, dy, dgamma, dbeta, rows, n);
  }
};

}  // namespace quintet::kernels
