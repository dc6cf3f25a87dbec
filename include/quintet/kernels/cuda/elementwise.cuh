// The elementwise kernels on cuda tensors: maps over the elements with the host's arithmetic
// element for element (kernels/cuda/map.cuh: 16-byte accesses where the operands allow), zero
// fills by cudaMemsetAsync, and the bias gradient as column sums over the rows in a fixed
// order (kernels/cuda/column_sums.cuh: deterministic, no atomics). The list forms of convert and
// accumulate_and_zero launch once per group of tensors (kernels/cuda/multi_tensor.cuh).
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/column_sums.cuh>
#include <quintet/kernels/cuda/map.cuh>
#include <quintet/kernels/cuda/multi_tensor.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/host/elementwise.hpp>
#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>

#include <cstdint>
#include <span>
#include <type_traits>

namespace quintet::kernels {

namespace cuda_impl {

// x (rows, n) += bias (n), `Lanes` consecutive elements of x and of bias per access (n a multiple
// of Lanes, both aligned). The chunk's column follows the grid stride incrementally (stride mod
// the row's chunks added, the row's chunks subtracted on wrapping), so the loop needs no 64-bit
// division per chunk.
template <int Lanes, class T>
__global__ void bias_add_kernel(T* x, const T* bias, std::int64_t chunks, std::int64_t row_chunks) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t column_step = stride % row_chunks;
  std::int64_t c = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t column = c % row_chunks;
  for (; c < chunks; c += stride) {
    auto values = load_pack<Lanes>(x + c * Lanes);
    const auto addends = load_pack<Lanes>(bias + column * Lanes);
#pragma unroll
    for (int l = 0; l < Lanes; ++l)
      values.value[l] = narrow<T>(widen(values.value[l]) + widen(addends.value[l]));
    store_pack<Lanes>(x + c * Lanes, values);
    column += column_step;
    if (column >= row_chunks) column -= row_chunks;
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

// y = GELU(x).
template <class T>
struct gelu_forward_op {
  __device__ T operator()(T x) const {
    using acc = accumulator_t<T>;
    const acc v = widen(x);
    return narrow<T>(v / (acc(1) + gelu_exponential(v)));
  }
};

// dx = dy times the slope s + 2 x s (1 - s) u'(x), u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2), as
// on the host.
template <class T>
struct gelu_backward_op {
  __device__ T operator()(T x, T dy) const {
    using acc = accumulator_t<T>;
    using k = host_impl::gelu_constants<acc>;
    const acc v = widen(x);
    const acc s = acc(1) / (acc(1) + gelu_exponential(v));
    const acc du = k::sqrt_2_over_pi * (acc(1) + acc(3) * k::cubic * v * v);
    return narrow<T>(widen(dy) * (s + acc(2) * v * s * (acc(1) - s) * du));
  }
};

template <class T>
struct add_op {
  __device__ T operator()(T a, T b) const { return narrow<T>(widen(a) + widen(b)); }
};

template <class T>
struct scale_op {
  accumulator_t<T> alpha;
  __device__ T operator()(T x) const { return narrow<T>(widen(x) * alpha); }
};

template <class T>
struct fill_op {
  T value;
  __device__ T operator()() const { return value; }
};

// host_impl::convert: exact when widening; to bf16 or half through float (a double rounds to float
// first, then to 16 bits, as on the host).
template <class From, class To>
struct convert_op {
  __device__ To operator()(From in) const {
    if constexpr (std::is_same_v<To, float> || std::is_same_v<To, double>)
      return static_cast<To>(widen(in));
    else
      return To(static_cast<float>(widen(in)));
  }
};

// host_impl::accumulate: the addend widened exactly, the sum rounded once in the sum's type.
template <class From, class To>
struct accumulate_op {
  __device__ To operator()(To into, From from) const { return into + static_cast<To>(widen(from)); }
};

// The list forms' ops (kernels/cuda/multi_tensor.cuh): convert_op and accumulate_op on packs of
// one tensor's range; accumulate_and_zero then stores zeros over the addend.
struct no_constants {};

template <class From, class To>
struct convert_list_op {
  const From* in;
  To* out;

  static constexpr int lanes = vector_lanes<From, To>;
  __host__ __device__ bool aligned() const {
    return chunk_aligned(in, lanes, sizeof(From)) && chunk_aligned(out, lanes, sizeof(To));
  }
  __device__ static convert_list_op at(const convert_tensor<From, To>& t, std::int64_t begin,
                                       no_constants) {
    return {t.in + begin, t.out + begin};
  }
  template <int Lanes>
  __device__ void apply(std::int64_t first) const {
    const auto values = load_pack<Lanes>(in + first);
    lane_pack<To, Lanes> converted;
#pragma unroll
    for (int l = 0; l < Lanes; ++l) converted.value[l] = convert_op<From, To>{}(values.value[l]);
    store_pack<Lanes>(out + first, converted);
  }
};

template <class From, class Into>
struct accumulate_and_zero_op {
  From* from;
  Into* into;

  static constexpr int lanes = vector_lanes<From, Into>;
  __host__ __device__ bool aligned() const {
    return chunk_aligned(from, lanes, sizeof(From)) && chunk_aligned(into, lanes, sizeof(Into));
  }
  __device__ static accumulate_and_zero_op at(const accumulate_tensor<From, Into>& t,
                                              std::int64_t begin, no_constants) {
    return {t.from + begin, t.into + begin};
  }
  template <int Lanes>
  __device__ void apply(std::int64_t first) const {
    const auto addends = load_pack<Lanes>(from + first);
    auto sums = load_pack<Lanes>(into + first);
    lane_pack<From, Lanes> zeros;
#pragma unroll
    for (int l = 0; l < Lanes; ++l) {
      sums.value[l] = accumulate_op<From, Into>{}(sums.value[l], addends.value[l]);
      zeros.value[l] = From(0.0f);
    }
    store_pack<Lanes>(into + first, sums);
    store_pack<Lanes>(from + first, zeros);
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
    constexpr int lanes = cuda_impl::vector_lanes<T>;
    if (n % lanes == 0 && cuda_impl::chunk_aligned(x, lanes, sizeof(T)) &&
        cuda_impl::chunk_aligned(bias, lanes, sizeof(T)))
      launch_bias_add<lanes>(exec, x, bias, count / lanes, n / lanes);
    else
      launch_bias_add<1>(exec, x, bias, count, n);
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
    cuda_impl::map(exec, count, cuda_impl::gelu_forward_op<T>{}, y, x);
  }

  template <class T>
  static void gelu_backward(const execution<cuda>& exec, const T* x, const T* dy, T* dx,
                            std::int64_t count) {
    cuda_impl::map(exec, count, cuda_impl::gelu_backward_op<T>{}, dx, x, dy);
  }

  template <class T>
  static void add(const execution<cuda>& exec, const T* a, const T* b, T* out, std::int64_t count) {
    cuda_impl::map(exec, count, cuda_impl::add_op<T>{}, out, a, b);
  }

  template <class T>
  static void scale(const execution<cuda>& exec, T* x, accumulator_t<T> alpha, std::int64_t count) {
    cuda_impl::map(exec, count, cuda_impl::scale_op<T>{alpha}, x, static_cast<const T*>(x));
  }

  // Zero bits (not -0.0) by one cudaMemsetAsync; other values by the map.
  template <class T>
  static void fill(const execution<cuda>& exec, T* x, T value, std::int64_t count) {
    if (count == 0) return;
    if (quintet::detail::all_bits_zero(value)) {
      QUINTET_CUDA_CHECK(
          cudaMemsetAsync(x, 0, static_cast<std::size_t>(count) * sizeof(T), exec.native()));
      return;
    }
    cuda_impl::map(exec, count, cuda_impl::fill_op<T>{value}, x);
  }

  template <class From, class To>
  static void convert(const execution<cuda>& exec, const From* in, To* out, std::int64_t count) {
    cuda_impl::map(exec, count, cuda_impl::convert_op<From, To>{}, out, in);
  }

  template <class From, class To>
  static void accumulate(const execution<cuda>& exec, const From* from, To* into,
                         std::int64_t count) {
    cuda_impl::map(exec, count, cuda_impl::accumulate_op<From, To>{}, into,
                   static_cast<const To*>(into), from);
  }

  // The lists: one launch per group of tensors, a block per unit (kernels/cuda/multi_tensor.cuh).
  template <class From, class To>
  static void convert(const execution<cuda>& exec, std::span<const convert_tensor<From, To>> list) {
    cuda_impl::for_each_list_unit<cuda_impl::convert_list_op<From, To>,
                                  multi_tensor::elementwise_unit>(
        exec, list, cuda_impl::no_constants{}, "convert on cuda");
  }

  template <class From, class Into>
  static void accumulate_and_zero(const execution<cuda>& exec,
                                  std::span<const accumulate_tensor<From, Into>> list) {
    cuda_impl::for_each_list_unit<cuda_impl::accumulate_and_zero_op<From, Into>,
                                  multi_tensor::elementwise_unit>(
        exec, list, cuda_impl::no_constants{}, "accumulate_and_zero on cuda");
  }

 private:
  template <int Lanes, class T>
  static void launch_bias_add(const execution<cuda>& exec, T* x, const T* bias, std::int64_t chunks,
                              std::int64_t row_chunks) {
    const unsigned blocks = quintet::detail::elementwise_blocks(chunks);
    constexpr int threads = quintet::detail::elementwise_threads;
    cuda_impl::bias_add_kernel<Lanes>
        <<<blocks, threads, 0, exec.native()>>>(x, bias, chunks, row_chunks);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace quintet::kernels
