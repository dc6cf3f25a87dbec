// GPU kernel benchmarks (issue 14), each against a reference measured in the same run:
//   copy        cudaMemcpyAsync device to device: the bandwidth a memory-bound kernel is held to
//               (bytes read + written).
//   layer norm  forward and backward GB/s (the fewest bytes the op must move: forward reads x and
//               writes y, backward reads x and dy and writes dx) against the copy of the same
//               array.
//   softmax     forward (reads x, writes y) and backward (reads y and dy, writes dx) GB/s against
//               the copy of the same array.
//   attention   causal forward + backward TFLOP/s at the GPT-2 124M shape (batch 8, seq 1024, 12
//               heads of 64), counting 4 b h s^2 d for the forward's two products and 8 b h s^2 d
//               for the backward's four, halved by the causal mask (no reference: the figure).
//   matmul      quintet's matmul entry point (cuBLASLt inside) against cuBLASLt called directly
//               with descriptors made once and the heuristic's first algorithm: TFLOP/s and their
//               ratio, at the GPT-2 124M layer shapes (16 x 1024 tokens) and a large square
//               product.
// (The 124M training step is train_gpt's, which tools/device_check.sh runs.)
// Times are CUDA events around a run of launches; ours and the reference alternate within each
// iteration and the ratio compares the fastest run of each. Results are checked outside the timing.
#include <benchmark/benchmark.h>

#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/cuda/attention.cuh>
#include <quintet/kernels/cuda/layer_norm.cuh>
#include <quintet/kernels/cuda/matmul.cuh>
#include <quintet/kernels/cuda/softmax.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/kernels/softmax.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda/random.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using quintet::bf16;
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
namespace k = quintet::kernels;

namespace {

// Seconds per call of `run`, from CUDA events around `repeats` calls on `stream`.
class event_timer {
 public:
  explicit event_timer(cudaStream_t stream) : stream_(stream) {
    QUINTET_CUDA_CHECK(cudaEventCreate(&start_));
    QUINTET_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;

  template <class Run>
  double seconds_per_call(Run&& run, int repeats) {
    QUINTET_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < repeats; ++i) run();
    QUINTET_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    QUINTET_CUDA_CHECK(cudaEventSynchronize(stop_));
    float milliseconds = 0;
    QUINTET_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start_, stop_));
    return static_cast<double>(milliseconds) / 1e3 / repeats;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Alternates `ours` and `reference` (a run of `repeats` calls each) per iteration after one
// untimed warm-up run; reports ours as the iteration time and the best per-call time of each.
template <class Ours, class Reference>
void interleaved(benchmark::State& state, cudaStream_t stream, int repeats, Ours&& ours,
                 Reference&& reference, double& best_ours, double& best_reference) {
  event_timer timer(stream);
  timer.seconds_per_call(ours, 1);
  timer.seconds_per_call(reference, 1);
  best_ours = best_reference = 1e30;
  for (auto _ : state) {
    const double ours_seconds = timer.seconds_per_call(ours, repeats);
    best_reference = std::min(best_reference, timer.seconds_per_call(reference, repeats));
    best_ours = std::min(best_ours, ours_seconds);
    state.SetIterationTime(ours_seconds);
  }
}

template <class T>
tensor<T, device> random_device(shape extents, std::uint64_t stream, double low = -1.0,
                                double high = 1.0) {
  tensor<T, device> t(extents);
  quintet::fill_uniform(t, {.seed = 7, .stream = stream}, low, high);
  return t;
}

template <class T>
tensor<T, host> to_host(const tensor<T, device>& d) {
  tensor<T, host> h(d.shape());
  quintet::copy(h, d);
  return h;
}

// The device-to-device copy of `bytes`, the reference of the memory-bound kernels.
struct device_copy {
  tensor<float, device> from;
  mutable tensor<float, device> to;  // written by a const call: the copy is the reference's work
  explicit device_copy(std::int64_t bytes)
      : from(shape{bytes / std::int64_t{sizeof(float)}}), to(from.shape()) {
    quintet::fill(from, 1.0f);
  }
  void operator()() const {
    QUINTET_CUDA_CHECK(
        cudaMemcpyAsync(to.data(), from.data(), from.bytes(), cudaMemcpyDeviceToDevice, nullptr));
  }
};

// A memory-bound kernel that moves `bytes` (read + written) against the copy of `array_bytes`
// (which moves twice that), timed alternately.
template <class Kernel>
void against_copy(benchmark::State& state, Kernel&& kernel, double bytes,
                  std::int64_t array_bytes) {
  const device_copy copy(array_bytes);
  double ours = 0, reference = 0;
  interleaved(state, nullptr, 20, kernel, copy, ours, reference);
  const double copy_bytes = 2.0 * static_cast<double>(array_bytes);
  state.counters["GB/s"] = bytes / ours / 1e9;
  state.counters["copy_GB/s"] = copy_bytes / reference / 1e9;
  state.counters["fraction"] = (bytes / ours) / (copy_bytes / reference);
}

// The copy alone, for the summary's bandwidth line: 1 GiB read and written.
void copy_bandwidth(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  const device_copy copy(bytes);
  event_timer timer(nullptr);
  timer.seconds_per_call(copy, 1);
  double best = 1e30;
  for (auto _ : state) {
    const double seconds = timer.seconds_per_call(copy, 10);
    best = std::min(best, seconds);
    state.SetIterationTime(seconds);
  }
  state.counters["GB/s"] = 2.0 * static_cast<double>(bytes) / best / 1e9;
}

// Outside the timing: the first rows of y, normalised with gamma 1 and beta 0, have mean ~0 and
// variance ~1 (to the storage type's rounding).
template <class T>
void check_normalised(benchmark::State& state, const tensor<T, device>& y, std::int64_t n) {
  const auto values = to_host(y);
  for (std::int64_t row = 0; row < 4; ++row) {
    double sum = 0, squares = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double value = static_cast<double>(k::widen(values.data()[row * n + j]));
      sum += value;
      squares += value * value;
    }
    const double mean = sum / static_cast<double>(n), variance = squares / static_cast<double>(n);
    if (!(std::abs(mean) < 1e-2 && std::abs(variance - 1.0) < 2e-2)) {
      state.SkipWithError(("layer norm row " + std::to_string(row) + " has mean " +
                           std::to_string(mean) + " and variance " + std::to_string(variance))
                              .c_str());
      return;
    }
  }
}

// Arguments: rows, n.
template <class T>
void layer_norm_forward(benchmark::State& state) {
  using Acc = k::accumulator_t<T>;
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<device> exec;
  auto x = random_device<T>(shape{rows, n}, 1);
  tensor<T, device> y(shape{rows, n}), gamma(shape{n}), beta(shape{n});
  tensor<Acc, device> mean(shape{rows}), rstd(shape{rows});
  quintet::fill(gamma, T(1.0f));
  quintet::fill(beta, T(0.0f));
  const auto bytes = static_cast<double>(2 * x.bytes());
  against_copy(
      state, [&] { k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd); }, bytes,
      static_cast<std::int64_t>(x.bytes()));
  check_normalised(state, y, n);
}

// Arguments: rows, n. The fused backward (input then weight pass) against the fewest bytes the
// op must move: x and dy read, dx written (the weight pass reads x and dy a second time).
template <class T>
void layer_norm_backward(benchmark::State& state) {
  using Acc = k::accumulator_t<T>;
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<device> exec;
  auto x = random_device<T>(shape{rows, n}, 1), dy = random_device<T>(shape{rows, n}, 4);
  auto gamma = random_device<T>(shape{n}, 2, 0.5, 1.5), beta = random_device<T>(shape{n}, 3);
  tensor<T, device> y(shape{rows, n}), dx(shape{rows, n});
  auto dgamma = random_device<T>(shape{n}, 5), dbeta = random_device<T>(shape{n}, 6);
  tensor<Acc, device> mean(shape{rows}), rstd(shape{rows});
  k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
  const auto bytes = static_cast<double>(3 * x.bytes());
  against_copy(
      state, [&] { k::layer_norm_backward(exec, x, gamma, mean, rstd, dy, dx, dgamma, dbeta); },
      bytes, static_cast<std::int64_t>(x.bytes()));
}

// Arguments: rows, n. y = softmax(x) over rows: x read, y written; each row sums to 1 (checked).
template <class T>
void softmax_forward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<device> exec;
  auto x = random_device<T>(shape{rows, n}, 1, -4.0, 4.0);
  tensor<T, device> y(shape{rows, n});
  against_copy(
      state, [&] { k::softmax_forward(exec, x, y); }, static_cast<double>(2 * x.bytes()),
      static_cast<std::int64_t>(x.bytes()));
  const auto values = to_host(y);
  double sum = 0;
  for (std::int64_t j = 0; j < n; ++j) sum += static_cast<double>(k::widen(values.data()[j]));
  if (!(std::abs(sum - 1.0) < 1e-2 + 1e-5 * static_cast<double>(n)))
    state.SkipWithError(("softmax row 0 sums to " + std::to_string(sum)).c_str());
}

// Arguments: rows, n. dx = y (dy - rowsum(dy y)): y and dy read, dx written.
template <class T>
void softmax_backward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<device> exec;
  auto x = random_device<T>(shape{rows, n}, 1, -4.0, 4.0), dy = random_device<T>(shape{rows, n}, 2);
  tensor<T, device> y(shape{rows, n}), dx(shape{rows, n});
  k::softmax_forward(exec, x, y);
  against_copy(
      state, [&] { k::softmax_backward(exec, y, dy, dx); }, static_cast<double>(3 * x.bytes()),
      static_cast<std::int64_t>(x.bytes()));
}

// Fixed iterations (each a run of 20 calls and 20 copies): a device check has minutes, and the
// fastest run is what the ratio compares.
void row_arguments(benchmark::internal::Benchmark* b) {
  b->Args({65536, 768})->Args({16384, 4096});
  b->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(10);
}

void softmax_arguments(benchmark::internal::Benchmark* b) {
  b->Args({65536, 1024})->Args({16384, 4096})->Args({8192, 8192});
  b->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(10);
}

// Arguments: batch, seq, heads, head_dim. Causal attention forward then backward, q, k and v
// slices of one fused (batch, seq, 3 width) projection as the GPT's attention has them.
template <class T>
void attention_forward_backward(benchmark::State& state) {
  using Acc = k::accumulator_t<T>;
  const std::int64_t batch = state.range(0), seq = state.range(1), heads = state.range(2),
                     head_dim = state.range(3), width = heads * head_dim;
  const execution<device> exec;
  auto qkv = random_device<T>(shape{batch, seq, 3 * width}, 21);
  auto dout = random_device<T>(shape{batch, seq, width}, 22);
  tensor<T, device> out(shape{batch, seq, width}), dqkv(shape{batch, seq, 3 * width});
  tensor<Acc, device> lse(shape{batch, heads, seq});
  const auto part = [&](auto& t, std::int64_t i) {
    return quintet::slice(t.view(), 2, i * width, (i + 1) * width);
  };
  const auto step = [&] {
    k::attention_forward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, heads);
    k::attention_backward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, dout,
                          part(dqkv, 0), part(dqkv, 1), part(dqkv, 2), heads);
  };
  event_timer timer(exec.native());
  timer.seconds_per_call(step, 1);
  double best = 1e30;
  for (auto _ : state) {
    const double seconds = timer.seconds_per_call(step, 3);
    best = std::min(best, seconds);
    state.SetIterationTime(seconds);
  }
  const double flop = 0.5 * 12.0 * static_cast<double>(batch * heads * head_dim) *
                      static_cast<double>(seq) * static_cast<double>(seq);
  state.counters["TFLOP/s"] = flop / best / 1e12;
  // Outside the timing: every lse is finite (each query sees at least itself).
  const auto lse_values = to_host(lse);
  for (std::int64_t i = 0; i < lse_values.numel(); i += 101)
    if (!std::isfinite(static_cast<double>(lse_values.data()[i]))) {
      state.SkipWithError("attention lse is not finite");
      return;
    }
}

// cuBLASLt called directly for the row-major C (m, n) = A (m, k) op(B) that quintet's matmul
// computes: the column-major C^T = op(B)^T A^T, descriptors and the algorithm chosen once.
template <class T>
class direct_cublaslt {
 public:
  direct_cublaslt(const execution<device>& exec, std::int64_t m, std::int64_t n, std::int64_t kk,
                  bool transpose_b)
      : exec_(exec) {
    using types = k::cuda_impl::cublas_types<T>;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation_, types::compute, types::scale));
    const cublasOperation_t first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, second = CUBLAS_OP_N;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &first, sizeof(first)));
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation_, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &second, sizeof(second)));
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout_, types::data,
                                                    u(transpose_b ? kk : n),
                                                    u(transpose_b ? n : kk), transpose_b ? kk : n));
    QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout_, types::data, u(kk), u(m), kk));
    QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_layout_, types::data, u(n), u(m), n));
    cublasLtMatmulPreference_t preference = nullptr;
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const std::size_t workspace = exec.workspace_bytes();
    QUINTET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(exec.blas_handle(), operation_, b_layout_, a_layout_,
                                       c_layout_, c_layout_, preference, 1, &heuristic_, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    QUINTET_CUBLAS_CHECK(status);
    QUINTET_CHECK(found > 0, "cuBLASLt's heuristic has no algorithm for ({}, {}, {})", m, n, kk);
  }
  ~direct_cublaslt() {
    cublasLtMatrixLayoutDestroy(c_layout_);
    cublasLtMatrixLayoutDestroy(a_layout_);
    cublasLtMatrixLayoutDestroy(b_layout_);
    cublasLtMatmulDescDestroy(operation_);
  }
  direct_cublaslt(const direct_cublaslt&) = delete;
  direct_cublaslt& operator=(const direct_cublaslt&) = delete;

  void operator()(const T* a, const T* b, T* c) const {
    const typename k::cuda_impl::cublas_types<T>::scale_type one = 1, zero = 0;
    QUINTET_CUBLAS_CHECK(cublasLtMatmul(
        exec_.blas_handle(), operation_, &one, b, b_layout_, a, a_layout_, &zero, c, c_layout_, c,
        c_layout_, &heuristic_.algo, exec_.workspace(), exec_.workspace_bytes(), exec_.native()));
  }

 private:
  const execution<device>& exec_;
  cublasLtMatmulDesc_t operation_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

// Arguments: m, n, k, transpose_b (a linear layer: x (m, k) times W (n, k) transposed).
template <class T>
void matmul_vs_cublaslt(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), kk = state.range(2);
  const bool transpose_b = state.range(3) != 0;
  const execution<device> exec;
  auto a = random_device<T>(shape{m, kk}, 11);
  auto b = random_device<T>(transpose_b ? shape{n, kk} : shape{kk, n}, 12);
  tensor<T, device> c(shape{m, n}), c_direct(shape{m, n});
  const direct_cublaslt<T> direct(exec, m, n, kk, transpose_b);
  const k::matmul_options options{.transpose_b = transpose_b};
  double ours = 0, reference = 0;
  const double flop =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kk);
  const int repeats = std::clamp(static_cast<int>(2e12 / flop), 3, 50);  // ~10 ms a run
  interleaved(
      state, exec.native(), repeats, [&] { k::matmul(exec, a, b, c, options); },
      [&] { direct(a.data(), b.data(), c_direct.data()); }, ours, reference);
  // Outside the timing: both computed the same product (the same algorithm gives the same bits;
  // another one differs by fp32 summation order, rounded to T).
  const auto ours_values = to_host(c), direct_values = to_host(c_direct);
  double worst = 0;
  for (std::int64_t i = 0; i < ours_values.numel(); i += 97)
    worst = std::max(worst, std::abs(static_cast<double>(k::widen(ours_values.data()[i])) -
                                     static_cast<double>(k::widen(direct_values.data()[i]))));
  if (!(worst <= 0.05 * std::sqrt(static_cast<double>(kk))))
    state.SkipWithError(("quintet and direct cuBLASLt differ by " + std::to_string(worst)).c_str());
  state.counters["TFLOP/s"] = flop / ours / 1e12;
  state.counters["cublaslt_TFLOP/s"] = flop / reference / 1e12;
  state.counters["ratio"] = reference / ours;
}

// GPT-2 124M at 16 x 1024 tokens: the qkv, attention output, MLP up and down projections and the
// logits (vocabulary 50304), forward form; and a large square product.
void gpt2_matmul_arguments(benchmark::internal::Benchmark* b) {
  const std::int64_t tokens = 16 * 1024;
  b->Args({tokens, 2304, 768, 1})
      ->Args({tokens, 768, 768, 1})
      ->Args({tokens, 3072, 768, 1})
      ->Args({tokens, 768, 3072, 1})
      ->Args({tokens, 50304, 768, 1})
      ->Args({8192, 8192, 8192, 0});
  b->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(5);
}

void square_matmul_arguments(benchmark::internal::Benchmark* b) {
  b->Args({8192, 8192, 8192, 0})->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(5);
}

}  // namespace

BENCHMARK(copy_bandwidth)
    ->Arg(std::int64_t{1} << 30)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(5);
BENCHMARK(layer_norm_forward<float>)->Apply(row_arguments);
BENCHMARK(layer_norm_forward<bf16>)->Apply(row_arguments);
BENCHMARK(layer_norm_backward<float>)->Apply(row_arguments);
BENCHMARK(layer_norm_backward<bf16>)->Apply(row_arguments);
BENCHMARK(softmax_forward<float>)->Apply(softmax_arguments);
BENCHMARK(softmax_forward<bf16>)->Apply(softmax_arguments);
BENCHMARK(softmax_backward<float>)->Apply(softmax_arguments);
BENCHMARK(softmax_backward<bf16>)->Apply(softmax_arguments);
BENCHMARK(attention_forward_backward<bf16>)
    ->Args({8, 1024, 12, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(3);
BENCHMARK(attention_forward_backward<float>)
    ->Args({8, 1024, 12, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(3);
BENCHMARK(matmul_vs_cublaslt<bf16>)->Apply(gpt2_matmul_arguments);
BENCHMARK(matmul_vs_cublaslt<float>)->Apply(square_matmul_arguments);


BENCHMARK_MAIN();
