// The elementwise kernels on cuda tensors: grid-stride loops over the elements with the host's
// arithmetic element for element, and the bias gradient as column sums over the rows in a fixed
// order (kernels/cuda/column_sums.cuh: deterministic, no atomics).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/column_sums.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/host/elementwise.hpp>
#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>

#include <cstdint>
#include <type_traits>

namespace quintet::kernels {

namespace cuda_impl {

// op(i) for every i < count, each element by one thread of a grid-stride loop (the launch shape of
// the tensor initialisers: 256 threads, at most 4096 blocks).
template <class Op>
__global__ void grid_stride_for_each_kernel(std::int64_t count, Op op) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride)
    op(i);
}

template <class Op>
void grid_stride_for_each(const execution<cuda>& exec, std::int64_t count, Op op) {
  if (count == 0) return;
  const unsigned blocks = quintet::detail::elementwise_blocks(count);
  constexpr int threads = quintet::detail::elementwise_threads;
  grid_stride_for_each_kernel<<<blocks, threads, 0, exec.native()>>>(count, op);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

// x (rows, n) += bias (n). The column follows the grid stride incrementally (stride mod n added,
// n subtracted on wrapping), so the loop needs no 64-bit division per element.
template <class T>
__global__ void bias_add_kernel(T* x, const T* bias, std::int64_t count, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t column_step = stride % n;
  std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t column = i % n;
  for (; i < count; i += stride) {
    x[i] = narrow<T>(widen(x[i]) + widen(bias[column]));
    column += column_step;
    if (column >= n) column -= n;
  }
}

// dbias[j] += sum_rows dy[r, j], summed by column_sums (fixed order, no atomics).
template <class T>
struct bias_grad_terms {
  const T* dy;
  std::int64_t n;
  __device__ void operator()(std::int64_t r, std::int64_t j, accumulator_t<T> (&values)[1]) const {
    values[0] = widen(dy[r * n + j]);
  }
};

template <class T>
struct bias_grad_finish {
  T* dbias;
  __device__ void operator()(std::int64_t j, const accumulator_t<T> (&totals)[1]) const {
    dbias[j] = narrow<T>(widen(dbias[j]) + totals[0]);
  }
};

// GELU as the host evaluates it (host_impl::gelu_forward, gelu_backward): x s with
// s = 1 / (1 + e), e = exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3), the same constants. For float
// the exponent is clamped to [-174, 88.7] as the host's exponentials() does, so e stays finite; the
// exponential itself is CUDA's expf / exp, which may differ from the host's in the last ulp.
template <class Acc>
__device__ inline Acc gelu_exponential(Acc v) {
  using k = host_impl::gelu_constants<Acc>;
  const Acc exponent = Acc(-2) * k::sqrt_2_over_pi * (v + k::cubic * v * v * v);
  if constexpr (std::is_same_v<Acc, float>) {
    // std::max(std::min(x, 88.7f), -174.0f) written out: a NaN passes through, as on the host.
    const float below = 88.7f < exponent ? 88.7f : exponent;
    return ::expf(below < -174.0f ? -174.0f : below);
  } else {
    return ::exp(exponent);
  }
}

template <class T>
struct gelu_forward_op {
  const T* x;
  T* y;
  __device__ void operator()(std::int64_t i) const {
    using acc = accumulator_t<T>;
    const acc v = widen(x[i]);
    y[i] = narrow<T>(v / (acc(1) + gelu_exponential(v)));
  }
};

// The slope s + 2 x s (1 - s) u'(x), u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2), as on the host.
template <class T>
struct gelu_backward_op {
  const T* x;
  const T* dy;
  T* dx;
  __device__ void operator()(std::int64_t i) const {
    using acc = accumulator_t<T>;
    using k = host_impl::gelu_constants<acc>;
    const acc v = widen(x[i]);
    const acc s = acc(1) / (acc(1) + gelu_exponential(v));
    const acc du = k::sqrt_2_over_pi * (acc(1) + acc(3) * k::cubic * v * v);
    dx[i] = narrow<T>(widen(dy[i]) * (s + acc(2) * v * s * (acc(1) - s) * du));
  }
};

template <class T>
struct add_op {
  const T* a;
  const T* b;
  T* out;
  __device__ void operator()(std::int64_t i) const {
    out[i] = narrow<T>(widen(a[i]) + widen(b[i]));
  }
};

template <class T>
struct scale_op {
  T* x;
  accumulator_t<T> alpha;
  __device__ void operator()(std::int64_t i) const { x[i] = narrow<T>(widen(x[i]) * alpha); }
};

template <class T>
struct fill_op {
  T* x;
  T value;
  __device__ void operator()(std::int64_t i) const { x[i] = value; }
};

// host_impl::convert: exact when widening; to bf16 or half through float (a double rounds to float
// first, then to 16 bits, as on the host).
template <class From, class To>
struct convert_op {
  const From* in;
  To* out;
  __device__ void operator()(std::int64_t i) const {
    if constexpr (std::is_same_v<To, float> || std::is_same_v<To, double>)
      out[i] = static_cast<To>(widen(in[i]));
    else
      out[i] = To(static_cast<float>(widen(in[i])));
  }
};

// host_impl::accumulate: the addend widened exactly, the sum rounded once in the sum's type.
template <class From, class To>
struct accumulate_op {
  const From* from;
  To* into;
  __device__ void operator()(std::int64_t i) const {
    into[i] = into[i] + static_cast<To>(widen(from[i]));
  }
};

}  // namespace cuda_impl

template <>
struct elementwise_engine<cuda> {
  template <class T>
  static void bias_add(const execution<cuda>& exec, T* x, const T* bias, std::int64_t rows,
                       std::int64_t n) {
    const std::int64_t count = rows * n;
    if (count == 0) return;
    const unsigned blocks = quintet::detail::elementwise_blocks(count);
    constexpr int threads = quintet::detail::elementwise_threads;
    cuda_impl::bias_add_kernel<<<blocks, threads, 0, exec.native()>>>(x, bias, count, n);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T>
  static void bias_grad(const execution<cuda>& exec, const T* dy, T* dbias, std::int64_t rows,
                        std::int64_t n) {
    // No early return for rows == 0: the host still adds its zero sums (-0 becomes +0).
    cuda_impl::column_sums<1, accumulator_t<T>>(exec, rows, n, cuda_impl::bias_grad_terms<T>{dy, n},
                                                cuda_impl::bias_grad_finish<T>{dbias}, "bias_grad");
  }

  template <class T>
  static void gelu_forward(const execution<cuda>& exec, const T* x, T* y, std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::gelu_forward_op<T>{x, y});
  }

  template <class T>
  static void gelu_backward(const execution<cuda>& exec, const T* x, const T* dy, T* dx,
                            std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::gelu_backward_op<T>{x, dy, dx});
  }

  template <class T>
  static void add(const execution<cuda>& exec, const T* a, const T* b, T* out, std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::add_op<T>{a, b, out});
  }

  template <class T>
  static void scale(const execution<cuda>& exec, T* x, accumulator_t<T> alpha, std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::scale_op<T>{x, alpha});
  }

  template <class T>
  static void fill(const execution<cuda>& exec, T* x, T value, std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::fill_op<T>{x, value});
  }

  template <class From, class To>
  static void convert(const execution<cuda>& exec, const From* in, To* out, std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::convert_op<From, To>{in, out});
  }

  template <class From, class To>
  static void accumulate(const execution<cuda>& exec, const From* from, To* into,
                         std::int64_t count) {
    cuda_impl::grid_stride_for_each(exec, count, cuda_impl::accumulate_op<From, To>{from, into});
  }
};

}  // namespace quintet::kernels
