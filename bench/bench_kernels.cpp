// Kernel benchmarks, each with its reference measured in the same run:
//   matmul      quintet's host matmul (CBLAS path) vs cblas_sgemm called directly, same threads
//               and operands: GFLOP/s of both and their ratio; the portable blocked kernel vs
//               single-threaded OpenBLAS: GFLOP/s and its fraction.
//   the products of the GPT-2 124M step at 256 tokens vs the 1024^3 product that prices the
//               step's bound (bench_train_step): each shape's rate as a fraction of the probe's.
//   layer norm, softmax   GB/s (bytes read + written) vs memcpy of the same array; the layer norm
//               backward's two passes (input, then weight) vs the fused backward.
//   attention   forward + backward through block products vs the row-at-a-time loops (the
//               straightforward form, which bf16 still uses) on the same float operands.
//   optimizer   over a GPT's parameters: AdamW and the squared norms of every gradient as one
//               list call vs one call per parameter (the same operations: the bits compared
//               outside the timing), at the small and the 124M shape of bench_train_step.
//   row kernels on an instruction set (kernels/host/isa.hpp): GELU, softmax, layer norm and
//               cross-entropy on one thread compiled for AVX2 or AVX-512 vs their baseline build
//               (SSE2), same operands: the speedup, and the bits compared outside the timing.
// Results are checked against OpenBLAS outside the timed loops.
#include <benchmark/benchmark.h>

#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/kernels/optimizer.hpp>
#include <quintet/kernels/softmax.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;

namespace {

using clock_type = std::chrono::steady_clock;

struct gemm_operands {
  std::int64_t m, n, k;
  bool transpose_b;
  tensor<float, host> a, b, c, reference;
};

// A (m, k), B (k, n) or (n, k) when transpose_b (a linear layer's weight), C (m, n).
gemm_operands make_operands(std::int64_t m, std::int64_t n, std::int64_t kk, bool transpose_b) {
  gemm_operands g{m,
                  n,
                  kk,
                  transpose_b,
                  tensor<float, host>(shape{m, kk}),
                  tensor<float, host>(transpose_b ? shape{n, kk} : shape{kk, n}),
                  tensor<float, host>(shape{m, n}),
                  tensor<float, host>(shape{m, n})};
  quintet::fill_uniform(g.a, {.seed = 1, .stream = 1}, -1.0, 1.0);
  quintet::fill_uniform(g.b, {.seed = 1, .stream = 2}, -1.0, 1.0);
  quintet::fill(g.c, 0.0f);
  quintet::fill(g.reference, 0.0f);
  return g;
}

void openblas_sgemm(gemm_operands& g, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, g.transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1.0f, g.a.data(),
              static_cast<int>(g.k), g.b.data(), static_cast<int>(g.transpose_b ? g.k : g.n), 0.0f,
              c, static_cast<int>(g.n));
}

// Outside the timed region: quintet's product equals OpenBLAS's to float rounding.
void check_against_openblas(benchmark::State& state, gemm_operands& g) {
  openblas_sgemm(g, g.reference.data());
  double worst = 0;
  for (std::int64_t i = 0; i < g.c.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(g.c.data()[i] - g.reference.data()[i])));
  // Each entry sums k products of magnitude <= 1: float rounding stays below 1e-6 k.
  if (!(worst <= 1e-6 * static_cast<double>(g.k)))
    state.SkipWithError(("result differs from OpenBLAS by " + std::to_string(worst)).c_str());
}

double gflop(const gemm_operands& g) { return 2.0 * g.m * g.n * g.k / 1e9; }

// Times `ours` and `reference` alternately, one call each per iteration, so that both see the
// same machine state (a shared machine's load changes over seconds). The iteration time Google
// Benchmark reports is ours; the ratio compares the fastest call of each, the figure least
// disturbed by other processes.
template <class Ours, class Reference>
void interleaved(benchmark::State& state, Ours&& ours, Reference&& reference, double& best_ours,
                 double& best_reference) {
  ours();
  reference();  // warm-up, untimed
  best_ours = best_reference = 1e30;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    ours();
    const auto t1 = clock_type::now();
    reference();
    const auto t2 = clock_type::now();
    const double ours_seconds = std::chrono::duration<double>(t1 - t0).count();
    best_ours = std::min(best_ours, ours_seconds);
    best_reference = std::min(best_reference, std::chrono::duration<double>(t2 - t1).count());
    state.SetIterationTime(ours_seconds);
  }
}

// Arguments: m, n, k, transpose_b, threads (0: every core). quintet's matmul vs cblas_sgemm on
// the same thread count (quintet's context sets it; the direct call inherits it).
void matmul_vs_openblas(benchmark::State& state) {
  auto g = make_operands(state.range(0), state.range(1), state.range(2), state.range(3) != 0);
  const auto exec = state.range(4) == 0 ? execution<host>::all_cores()
                                        : execution<host>(static_cast<int>(state.range(4)));
  const k::matmul_options options{.transpose_b = g.transpose_b};
  double ours = 0, reference = 0;
  interleaved(
      state, [&] { k::matmul(exec, g.a, g.b, g.c, options); },  // sets OpenBLAS's thread count
      [&] { openblas_sgemm(g, g.reference.data()); }, ours, reference);
  check_against_openblas(state, g);
  state.counters["GFLOP/s"] = gflop(g) / ours;
  state.counters["openblas_GFLOP/s"] = gflop(g) / reference;
  state.counters["ratio"] = reference / ours;
  state.counters["threads"] = exec.threads();
}

// Arguments: m, n, k, transpose_b. The portable kernel (single-threaded) vs OpenBLAS on one thread.
void matmul_portable_vs_openblas(benchmark::State& state) {
  auto g = make_operands(state.range(0), state.range(1), state.range(2), state.range(3) != 0);
  const execution<host> exec(1);
  const k::matmul_options options{.transpose_b = g.transpose_b};
  k::matmul(exec, g.a, g.b, g.c, options);  // OpenBLAS on one thread from here on
  double ours = 0, reference = 0;
  interleaved(
      state, [&] { k::matmul_portable(exec, g.a, g.b, g.c, options); },
      [&] { openblas_sgemm(g, g.reference.data()); }, ours, reference);
  check_against_openblas(state, g);
  state.counters["GFLOP/s"] = gflop(g) / ours;
  state.counters["openblas_1t_GFLOP/s"] = gflop(g) / reference;
  state.counters["fraction"] = reference / ours;
}

void matmul_arguments(benchmark::internal::Benchmark* b) {
  for (const std::int64_t threads : {0, 1}) {
    for (const std::int64_t n : {256, 512, 1024, 2048}) b->Args({n, n, n, 0, threads});
    // A linear layer: x (batch 8 x seq 256, 768) times W (3072, 768) transposed.
    b->Args({2048, 3072, 768, 1, threads});
  }
  b->Unit(benchmark::kMillisecond)->UseManualTime();
}

void portable_arguments(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {256, 512, 1024, 2048}) b->Args({n, n, n, 0});
  b->Args({2048, 3072, 768, 1});
  b->Unit(benchmark::kMillisecond)->UseManualTime();
}

// Arguments: which product of the GPT-2 124M step at issue 16's batch (4 x 64 = 256 tokens;
// d 768, 4d 3072, vocab 50257; see step_products below), on every core, vs the 1024^3 product
// bench_train_step's bound is priced at, timed in the same loop: the rate of each shape as a
// fraction of that bound's rate.
struct step_product {
  const char* name;
  std::int64_t m, n, k;
  bool transpose_a, transpose_b;
  float beta;
};
constexpr step_product step_products[] = {
    // A linear layer y = x W^T: forward, dx = dy W, dW += dy^T x (beta 1: the gradient
    // accumulates).
    {"qkv_forward", 256, 2304, 768, false, true, 0},
    {"qkv_dx", 256, 768, 2304, false, false, 0},
    {"qkv_dw", 2304, 768, 256, true, false, 1},
    {"attention_proj_forward", 256, 768, 768, false, true, 0},
    {"attention_proj_dx", 256, 768, 768, false, false, 0},
    {"attention_proj_dw", 768, 768, 256, true, false, 1},
    {"fc_forward", 256, 3072, 768, false, true, 0},
    {"fc_dx", 256, 768, 3072, false, false, 0},
    {"fc_dw", 3072, 768, 256, true, false, 1},
    {"fc_proj_forward", 256, 768, 3072, false, true, 0},
    {"fc_proj_dx", 256, 3072, 768, false, false, 0},
    {"fc_proj_dw", 768, 3072, 256, true, false, 1},
    {"head_forward", 256, 50257, 768, false, true, 0},
    {"head_dx", 256, 768, 50257, false, false, 0},
    {"head_dw", 50257, 768, 256, true, false, 1},
};

void gpt2_124m_products(benchmark::State& state) {
  const step_product& p = step_products[state.range(0)];
  state.SetLabel(p.name);
  const auto exec = execution<host>::all_cores();
  tensor<float, host> a(p.transpose_a ? shape{p.k, p.m} : shape{p.m, p.k}),
      b(p.transpose_b ? shape{p.n, p.k} : shape{p.k, p.n}), c(shape{p.m, p.n});
  quintet::fill_uniform(a, {.seed = 3, .stream = 1}, -1.0, 1.0);
  quintet::fill_uniform(b, {.seed = 3, .stream = 2}, -1.0, 1.0);
  quintet::fill(c, 0.0f);
  auto probe = make_operands(1024, 1024, 1024, false);
  const k::matmul_options options{
      .transpose_a = p.transpose_a, .transpose_b = p.transpose_b, .beta = p.beta};
  double ours = 0, reference = 0;
  interleaved(
      state, [&] { k::matmul(exec, a, b, c, options); },
      [&] { openblas_sgemm(probe, probe.reference.data()); }, ours, reference);
  const double rate = 2.0 * p.m * p.n * p.k / ours / 1e9;
  state.counters["GFLOP/s"] = rate;
  state.counters["probe_GFLOP/s"] = gflop(probe) / reference;
  state.counters["fraction_of_probe"] = rate / (gflop(probe) / reference);
}

// Bytes read plus written by a row kernel that moves `arrays` (rows, n) float arrays, against
// memcpy of one such array (which reads and writes it: two arrays), timed in the same benchmark.
template <class Kernel>
void row_kernel_vs_memcpy(benchmark::State& state, Kernel&& kernel, const tensor<float, host>& x,
                          double arrays = 2.0) {
  const double bytes = arrays * static_cast<double>(x.bytes());
  const double memcpy_bytes = 2.0 * static_cast<double>(x.bytes());
  tensor<float, host> copy(x.shape());  // memcpy's own target: y holds the kernel's result
  quintet::fill(copy, 0.0f);
  double ours = 0, reference = 0;
  interleaved(
      state, kernel,
      [&] {
        std::memcpy(copy.data(), x.data(), x.bytes());
        benchmark::ClobberMemory();
      },
      ours, reference);
  state.counters["GB/s"] = bytes / ours / 1e9;
  state.counters["memcpy_GB/s"] = memcpy_bytes / reference / 1e9;
  state.counters["fraction"] = (bytes / ours) / (memcpy_bytes / reference);
}

void layer_norm_forward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<host> exec;
  tensor<float, host> x(shape{rows, n}), y(shape{rows, n}), gamma(shape{n}), beta(shape{n}),
      mean(shape{rows}), rstd(shape{rows});
  quintet::fill_uniform(x, {.seed = 2, .stream = 1}, -1.0, 1.0);
  quintet::fill(gamma, 1.0f);
  quintet::fill(beta, 0.0f);
  quintet::fill(y, 0.0f);
  row_kernel_vs_memcpy(
      state, [&] { k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd); }, x);
  // Outside timing: every row of y has mean ~0 (gamma 1, beta 0).
  double row_mean = 0;
  for (std::int64_t j = 0; j < n; ++j) row_mean += y.data()[j];
  if (!(std::abs(row_mean / static_cast<double>(n)) < 1e-4))
    state.SkipWithError("layer norm output row does not have mean 0");
}

void layer_norm_backward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<host> exec;
  tensor<float, host> x(shape{rows, n}), dy(shape{rows, n}), dx(shape{rows, n}), y(shape{rows, n}),
      gamma(shape{n}), beta(shape{n}), dgamma(shape{n}), dbeta(shape{n}), mean(shape{rows}),
      rstd(shape{rows});
  quintet::fill_uniform(x, {.seed = 2, .stream = 1}, -1.0, 1.0);
  quintet::fill_uniform(dy, {.seed = 2, .stream = 2}, -1.0, 1.0);
  quintet::fill(gamma, 1.0f);
  quintet::fill(beta, 0.0f);
  quintet::fill(dgamma, 0.0f);
  quintet::fill(dbeta, 0.0f);
  quintet::fill(dx, 0.0f);
  k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
  // Reads x and dy, writes dx: three arrays.
  row_kernel_vs_memcpy(
      state, [&] { k::layer_norm_backward(exec, x, gamma, mean, rstd, dy, dx, dgamma, dbeta); }, x,
      3.0);
}

// The input pass then the weight pass (as a zero-bubble schedule runs them) vs the fused backward:
// the pair reads x and dy twice, the fused loop once. GB/s counts the fused backward's bytes for
// both. Outside timing the two give the same bits (both ran the same number of times, so the
// accumulated parameter gradients match too).
void layer_norm_backward_split(benchmark::State& state) {
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<host> exec;
  tensor<float, host> x(shape{rows, n}), dy(shape{rows, n}), y(shape{rows, n}), gamma(shape{n}),
      beta(shape{n}), mean(shape{rows}), rstd(shape{rows});
  tensor<float, host> dx_fused(shape{rows, n}), dgamma_fused(shape{n}), dbeta_fused(shape{n}),
      dx_split(shape{rows, n}), dgamma_split(shape{n}), dbeta_split(shape{n});
  quintet::fill_uniform(x, {.seed = 2, .stream = 1}, -1.0, 1.0);
  quintet::fill_uniform(dy, {.seed = 2, .stream = 2}, -1.0, 1.0);
  quintet::fill_uniform(gamma, {.seed = 2, .stream = 3}, 0.5, 1.5);
  quintet::fill(beta, 0.0f);
  for (auto* t : {&dx_fused, &dgamma_fused, &dbeta_fused, &dx_split, &dgamma_split, &dbeta_split})
    quintet::fill(*t, 0.0f);
  k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
  double fused = 0, split = 0;
  interleaved(
      state,
      [&] {
        k::layer_norm_backward(exec, x, gamma, mean, rstd, dy, dx_fused, dgamma_fused, dbeta_fused);
      },
      [&] {
        k::layer_norm_backward_input(exec, x, gamma, mean, rstd, dy, dx_split);
        k::layer_norm_backward_weight(exec, x, mean, rstd, dy, dgamma_split, dbeta_split);
      },
      fused, split);
  auto same = [](const tensor<float, host>& a, const tensor<float, host>& b) {
    return std::memcmp(a.data(), b.data(), a.bytes()) == 0;
  };
  if (!same(dx_fused, dx_split) || !same(dgamma_fused, dgamma_split) ||
      !same(dbeta_fused, dbeta_split))
    state.SkipWithError("the split backward differs from the fused one");
  const double bytes = 3.0 * static_cast<double>(x.bytes());  // reads x and dy, writes dx
  state.counters["GB/s"] = bytes / fused / 1e9;
  state.counters["split_GB/s"] = bytes / split / 1e9;
  state.counters["split/fused"] = split / fused;
}

void softmax_forward(benchmark::State& state) {
  const std::int64_t rows = state.range(0), n = state.range(1);
  const execution<host> exec;
  tensor<float, host> x(shape{rows, n}), y(shape{rows, n});
  quintet::fill_uniform(x, {.seed = 3, .stream = 1}, -4.0, 4.0);
  quintet::fill(y, 0.0f);
  row_kernel_vs_memcpy(
      state, [&] { k::softmax_forward(exec, x, y); }, x);
  double row_sum = 0;
  for (std::int64_t j = 0; j < n; ++j) row_sum += y.data()[j];
  if (!(std::abs(row_sum - 1.0) < 1e-4)) state.SkipWithError("softmax row does not sum to 1");
}

// Arguments: batch, seq, heads, head_dim; q, k, v are slices of one fused projection.
void attention(benchmark::State& state) {
  const std::int64_t batch = state.range(0), seq = state.range(1), heads = state.range(2),
                     width = heads * state.range(3);
  const execution<host> exec;
  tensor<float, host> qkv(shape{batch, seq, 3 * width}), dqkv(qkv.shape()), dqkv_rows(qkv.shape()),
      out(shape{batch, seq, width}), out_rows(out.shape()), dout(out.shape()),
      lse(shape{batch, heads, seq});
  quintet::fill_uniform(qkv, {.seed = 4, .stream = 1}, -1.0, 1.0);
  quintet::fill_uniform(dout, {.seed = 4, .stream = 2}, -1.0, 1.0);
  auto part = [&](tensor<float, host>& t, std::int64_t i) {
    return quintet::slice(t, 2, i * width, (i + 1) * width);
  };
  auto rows3 = [](auto view) {
    return k::host_impl::rows3<typename decltype(view)::element_type>{
        view.data(), view.strides()[0], view.strides()[1]};
  };
  using const_view = quintet::tensor_view<const float, host>;
  const auto q = rows3(const_view(part(qkv, 0))), kk = rows3(const_view(part(qkv, 1))),
             v = rows3(const_view(part(qkv, 2)));
  const k::host_impl::attention_sizes sizes{batch, seq, heads, width / heads};
  const float scale = 1.0f / std::sqrt(static_cast<float>(width / heads));
  double ours = 0, reference = 0;
  interleaved(
      state,
      [&] {
        k::attention_forward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, heads);
        k::attention_backward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, dout,
                              part(dqkv, 0), part(dqkv, 1), part(dqkv, 2), heads);
      },
      [&] {
        k::host_impl::attention_forward_rows<float>(q, kk, v, rows3(out_rows.view()), lse.data(),
                                                    sizes, scale);
        k::host_impl::attention_backward_rows<float>(
            q, kk, v, rows3(const_view(out_rows.view())), lse.data(),
            rows3(const_view(dout.view())), rows3(part(dqkv_rows, 0)), rows3(part(dqkv_rows, 1)),
            rows3(part(dqkv_rows, 2)), sizes, scale);
      },
      ours, reference);
  double worst = 0;
  for (std::int64_t i = 0; i < dqkv.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(dqkv.data()[i] - dqkv_rows.data()[i])));
  if (!(worst < 1e-3)) state.SkipWithError("attention gradients differ from the row loops");
  // Causal attention: QK^T and PV forward, five products of the same size backward, each
  // 2 seq^2/2 head_dim per (batch, head).
  const double flop = 7.0 * batch * heads * static_cast<double>(seq) * seq * (width / heads);
  state.counters["GFLOP/s"] = flop / ours / 1e9;
  state.counters["rows_GFLOP/s"] = flop / reference / 1e9;
  state.counters["speedup"] = reference / ours;
}

// Arguments: kernel (0 GELU forward, 1 GELU backward, 2 softmax forward, 3 layer norm forward,
// 4 layer norm backward, 5 cross-entropy forward and backward), instruction set (1 avx2,
// 2 avx512). One thread, 256 rows of 1024 (1 MiB an operand: in L2), so that the arithmetic and
// not memory sets the pace. Each variant's outputs must equal the baseline's bit for bit.
void row_kernel_isa(benchmark::State& state) {
  static constexpr const char* names[] = {"gelu_forward",        "gelu_backward",
                                          "softmax_forward",     "layer_norm_forward",
                                          "layer_norm_backward", "cross_entropy"};
  const auto which = state.range(0);
  const auto isa = static_cast<quintet::host_isa>(state.range(1));
  state.SetLabel(std::string(names[which]) + "/" + std::string(quintet::host_isa_name(isa)));
  if (!quintet::host_isa_supported(isa)) {
    state.SkipWithError("this CPU cannot run the instruction set");
    return;
  }
  const execution<host> wide(1, isa), baseline(1, quintet::host_isa::baseline);
  const std::int64_t rows = 256, n = 1024;
  const shape s{rows, n};
  tensor<float, host> x(s), dy(s), gamma(shape{n}), beta(shape{n}), dgamma(shape{n}),
      dbeta(shape{n}), mean(shape{rows}), rstd(shape{rows}), lse(shape{rows});
  tensor<std::int32_t, host> targets(shape{rows});
  quintet::fill_uniform(x, {.seed = 5, .stream = 1}, -6.0, 6.0);
  quintet::fill_uniform(dy, {.seed = 5, .stream = 2}, -1.0, 1.0);
  quintet::fill_uniform(gamma, {.seed = 5, .stream = 3}, 0.5, 1.5);
  quintet::fill(beta, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) targets.data()[r] = static_cast<std::int32_t>(r * 7 % n);
  tensor<float, host> out_wide(s), out_baseline(s);
  quintet::fill(out_wide, 0.0f);
  quintet::fill(out_baseline, 0.0f);
  const auto run = [&](const execution<host>& exec, tensor<float, host>& out) {
    switch (which) {
      case 0:
        return k::gelu_forward(exec, x, out);
      case 1:
        return k::gelu_backward(exec, x, dy, out);
      case 2:
        return k::softmax_forward(exec, x, out);
      case 3:
        return k::layer_norm_forward(exec, x, gamma, beta, out, mean, rstd);
      case 4:
        return k::layer_norm_backward(exec, x, gamma, mean, rstd, dy, out, dgamma, dbeta);
      default:
        k::cross_entropy_forward(exec, x, targets, lse);
        return k::cross_entropy_backward(exec, x, targets, lse, out, 1.0 / rows);
    }
  };
  k::layer_norm_forward(baseline, x, gamma, beta, out_baseline, mean, rstd);  // mean, rstd
  double ours = 0, reference = 0;
  interleaved(
      state, [&] { run(wide, out_wide); }, [&] { run(baseline, out_baseline); }, ours, reference);
  if (std::memcmp(out_wide.data(), out_baseline.data(), out_wide.bytes()) != 0)
    state.SkipWithError("the instruction set's output differs from the baseline's");
  state.counters["ns_per_element"] = 1e9 * ours / static_cast<double>(rows * n);
  state.counters["baseline_ns_per_element"] = 1e9 * reference / static_cast<double>(rows * n);
  state.counters["speedup"] = reference / ours;
}

// The parameter shapes of a GPT (untied head): embeddings, per layer two layer norms, the fused
// qkv, attention and MLP projections with biases, the final layer norm and the head.
std::vector<shape> gpt_parameter_shapes(std::int64_t layers, std::int64_t d, std::int64_t vocab,
                                        std::int64_t positions) {
  std::vector<shape> shapes = {shape{vocab, d}, shape{positions, d}};
  for (std::int64_t l = 0; l < layers; ++l) {
    for (const shape& s : {shape{d}, shape{d}, shape{3 * d, d}, shape{3 * d}, shape{d, d},
                           shape{d}, shape{d}, shape{d}, shape{4 * d, d}, shape{4 * d},
                           shape{d, 4 * d}, shape{d}})
      shapes.push_back(s);
  }
  for (const shape& s : {shape{d}, shape{d}, shape{vocab, d}}) shapes.push_back(s);
  return shapes;
}

// Arguments: shape (0: 4 layers, d 256, vocab 256, 64 positions; 1: GPT-2 124M, 12 layers, d 768,
// vocab 50257, 1024 positions), kernel (0: AdamW, 1: squared norms). Every core. The list call
// vs a loop of one-tensor calls over the same parameters; for AdamW each keeps its own parameters
// and moments, both at step 1, so both copies stay equal bit for bit (checked after the timing).
void optimizer_over_parameters(benchmark::State& state) {
  const bool gpt2 = state.range(0) == 1;
  const bool adamw = state.range(1) == 0;
  state.SetLabel(std::string(gpt2 ? "gpt2_124m" : "small") + (adamw ? "/adamw" : "/squared_norms"));
  const auto shapes =
      gpt2 ? gpt_parameter_shapes(12, 768, 50257, 1024) : gpt_parameter_shapes(4, 256, 256, 64);
  const auto exec = execution<host>::all_cores();
  std::vector<tensor<float, host>> grad, param[2], m[2], v[2];
  std::int64_t elements = 0;
  std::uint64_t stream = 0;
  for (const shape& s : shapes) {
    elements += s.numel();
    grad.emplace_back(s);
    quintet::fill_uniform(grad.back(), {.seed = 8, .stream = ++stream}, -1.0, 1.0);
    for (int copy = 0; copy < (adamw ? 2 : 0); ++copy) {
      param[copy].emplace_back(s);
      quintet::fill_uniform(param[copy].back(), {.seed = 8, .stream = stream}, -0.1, 0.1);
      m[copy].emplace_back(s);
      v[copy].emplace_back(s);
      quintet::fill(m[copy].back(), 0.0f);
      quintet::fill(v[copy].back(), 0.0f);
    }
  }
  const k::adamw_hyperparameters hp{.lr = 1e-3, .weight_decay = 0.1};
  std::vector<k::adamw_operands<float, host>> list;
  std::vector<quintet::tensor_view<const float, host>> grads;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    if (adamw) list.push_back({param[0][i], grad[i], m[0][i], v[0][i], true});
    grads.push_back(grad[i]);
  }
  std::vector<double> list_sums, one_sums(shapes.size());
  double ours = 0, reference = 0;
  if (adamw) {
    interleaved(
        state, [&] { k::adamw_update(exec, list, hp, 1); },
        [&] {
          for (std::size_t i = 0; i < shapes.size(); ++i)
            k::adamw_update(exec, param[1][i], grad[i], m[1][i], v[1][i], hp, 1);
        },
        ours, reference);
    for (std::size_t i = 0; i < shapes.size(); ++i)
      if (std::memcmp(param[0][i].data(), param[1][i].data(), param[0][i].bytes()) != 0 ||
          std::memcmp(m[0][i].data(), m[1][i].data(), m[0][i].bytes()) != 0 ||
          std::memcmp(v[0][i].data(), v[1][i].data(), v[0][i].bytes()) != 0)
        state.SkipWithError("the list update differs from the one-tensor updates");
  } else {
    interleaved(
        state, [&] { list_sums = k::squared_norms(exec, grads); },
        [&] {
          for (std::size_t i = 0; i < shapes.size(); ++i)
            one_sums[i] = k::squared_norm(exec, grad[i]);
        },
        ours, reference);
    if (std::memcmp(list_sums.data(), one_sums.data(), one_sums.size() * sizeof(double)) != 0)
      state.SkipWithError("the list's squared norms differ from the one-tensor ones");
  }
  state.counters["tensors"] = static_cast<double>(shapes.size());
  state.counters["elements"] = static_cast<double>(elements);
  state.counters["per_tensor_ms"] = 1e3 * reference;
  state.counters["list_ms"] = 1e3 * ours;
  state.counters["speedup"] = reference / ours;
}

void row_arguments(benchmark::internal::Benchmark* b) {
  b->Args({8192, 768})->Args({2048, 4096})->Args({1024, 50304});
  b->Unit(benchmark::kMillisecond)->UseManualTime();
}

}  // namespace

BENCHMARK(matmul_vs_openblas)->Apply(matmul_arguments);
BENCHMARK(matmul_portable_vs_openblas)->Apply(portable_arguments);
BENCHMARK(layer_norm_forward)->Apply(row_arguments);
BENCHMARK(layer_norm_backward)->Apply(row_arguments);
BENCHMARK(layer_norm_backward_split)->Apply(row_arguments);
BENCHMARK(softmax_forward)->Apply(row_arguments);
BENCHMARK(attention)
    ->Args({8, 128, 4, 32})
    ->Args({4, 512, 8, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

BENCHMARK(gpt2_124m_products)
    ->DenseRange(0, static_cast<int>(std::size(step_products)) - 1)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

BENCHMARK(optimizer_over_parameters)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

BENCHMARK(row_kernel_isa)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

BENCHMARK_MAIN();
