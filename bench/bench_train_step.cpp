// A full serial training step of train_gpt's default model (2 layers, 4 heads, batch 16 x seq 64,
// vocabulary 16) at d_model 64 (the default) and 256: tokens/s, and the share of the step spent in
// matrix products, measured in the same run by replaying the step's products (same shapes, same
// execution context) on their own. Issue 16's two shapes (batch 4 x seq 64): the step against the
// BLAS bound, its model FLOPs (6N + 12 L h s per token) at the sgemm rate measured in the same run,
// and the share of the step in matrix products.
#include <benchmark/benchmark.h>

#include <quintet/data/markov_source.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/tensor/host_block_cache.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/train/matmul_probe.hpp>
#include <quintet/train/model_flops.hpp>
#include <quintet/train/trainer.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

namespace {

using quintet::host;
using quintet::shape;
using host_tensor = quintet::tensor<float, host>;

const quintet::nn::gpt_config model{
    .vocab = 16, .max_seq = 64, .layers = 2, .d_model = 64, .heads = 4};
constexpr std::int64_t batch = 16, seq = 64, rows = batch * seq;

// The three products of one linear layer (in -> out) over `token_rows` rows: forward y = x W^T, and
// in backward dW += dy^T x and dx = dy W.
struct linear_products {
  host_tensor x, w, y, dw, dx;
  linear_products(std::int64_t in, std::int64_t out, std::int64_t token_rows)
      : x(shape{token_rows, in}),
        w(shape{out, in}),
        y(shape{token_rows, out}),
        dw(shape{out, in}),
        dx(shape{token_rows, in}) {
    quintet::fill_normal(x, {.seed = 1, .stream = 1}, 0.0, 1.0);
    quintet::fill_normal(w, {.seed = 1, .stream = 2}, 0.0, 0.02);
    quintet::fill_normal(y, {.seed = 1, .stream = 3}, 0.0, 1.0);  // stands for dy in backward
    quintet::fill(dw, 0.0f);
  }
  void run(const quintet::execution<host>& exec) {
    quintet::kernels::matmul(exec, x, w, y, {.transpose_b = true});
    quintet::kernels::matmul(exec, y, x, dw, {.transpose_a = true, .beta = 1.0});
    quintet::kernels::matmul(exec, y, w, dx);
  }
};

// One untimed warm-up step, then one step per benchmark iteration: the seconds the steps took.
template <class Trainer>
double timed_steps(benchmark::State& state, Trainer& trainer) {
  trainer.train_step();
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.train_step().loss);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return seconds;
}

// The seconds `steps` steps of `model` over `token_rows` rows spend in matrix products, measured by
// replaying them (same shapes, same execution context) on their own: per block qkv (d -> 3d),
// attention output (d -> d), fc (d -> 4d) and MLP output (4d -> d); then the tied LM head
// (d -> vocab).
double replayed_matmul_seconds(const quintet::nn::gpt_config& model, std::int64_t token_rows,
                               std::int64_t steps, const quintet::execution<host>& exec) {
  const std::int64_t d = model.d_model;
  std::vector<linear_products> products;
  for (std::int64_t l = 0; l < model.layers; ++l) {
    products.emplace_back(d, 3 * d, token_rows);
    products.emplace_back(d, d, token_rows);
    products.emplace_back(d, 4 * d, token_rows);
    products.emplace_back(4 * d, d, token_rows);
  }
  products.emplace_back(d, model.vocab, token_rows);
  for (auto& p : products) p.run(exec);  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < steps; ++i)
    for (auto& p : products) p.run(exec);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void serial_train_step(benchmark::State& state) {
  const quintet::nn::gpt_config model{
      .vocab = 16, .max_seq = 64, .layers = 2, .d_model = state.range(0), .heads = 4};
  const auto exec = quintet::execution<host>::all_cores();
  const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});
  quintet::train::trainer<float, quintet::markov_source> trainer(
      source, model, {.steps = 1 << 30, .batch = batch, .seq = seq, .warmup_steps = 0}, exec);
  const double step_seconds = timed_steps(state, trainer);

  const double matmul_seconds = replayed_matmul_seconds(model, rows, state.iterations(), exec);
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(rows * state.iterations()) / step_seconds);
  state.counters["ms_per_step"] = 1e3 * step_seconds / static_cast<double>(state.iterations());
  state.counters["matmul_share"] = matmul_seconds / step_seconds;
}

// Issue 16's shapes, batch 4 x seq 64: the small model (4 layers, d 256, 4 heads, vocabulary 256)
// and GPT-2 124M (12 layers, d 768, 12 heads, vocabulary 50257). blas_bound_fraction is
// (model FLOPs of a step / the sgemm rate) / the step's time: 1 would be a step that is nothing
// but matrix products at the rate of large square ones. The rate is probe_matmul_rate's on
// 1024 x 1024 products with the same threads, measured after the steps.
void issue_shape_train_step(benchmark::State& state, bool large) {
  const quintet::nn::gpt_config model =
      large ? quintet::nn::gpt_config{.vocab = 50257,
                                      .max_seq = 1024,
                                      .layers = 12,
                                      .d_model = 768,
                                      .heads = 12}
            : quintet::nn::gpt_config{
                  .vocab = 256, .max_seq = 64, .layers = 4, .d_model = 256, .heads = 4};
  constexpr std::int64_t shape_batch = 4, shape_seq = 64;
  const auto exec = quintet::execution<host>::all_cores();
  const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});
  quintet::train::trainer<float, quintet::markov_source> trainer(
      source, model, {.steps = 1 << 30, .batch = shape_batch, .seq = shape_seq, .warmup_steps = 0},
      exec);
  const double step_seconds = timed_steps(state, trainer);
  const double steps = static_cast<double>(state.iterations());
  const double tokens = static_cast<double>(shape_batch * shape_seq);
  const double flops_per_step =
      tokens * quintet::train::model_flops_per_token(
                   quintet::train::model_parameter_count(trainer.parameters()), model.layers,
                   model.d_model, shape_seq);
  const double sgemm = quintet::train::probe_matmul_rate(exec, 1024, 1.0).flops_per_second;
  state.counters["ms_per_step"] = 1e3 * step_seconds / steps;
  state.counters["tokens_per_second"] = tokens * steps / step_seconds;
  state.counters["model_gflop_per_step"] = flops_per_step / 1e9;
  state.counters["sgemm_gflops"] = sgemm / 1e9;
  state.counters["blas_bound_fraction"] = flops_per_step / sgemm / (step_seconds / steps);
  state.counters["matmul_share"] =
      replayed_matmul_seconds(model, shape_batch * shape_seq, state.iterations(), exec) /
      step_seconds;
}

// Time to the first step at the GPT-2 124M shape (12 layers, d 768, 12 heads, vocabulary 50257,
// 1024 positions): the trainer's construction, which allocates and initialises every parameter
// (Philox normals) and its gradient. AdamW's moments, which the first step allocates, are timed
// apart (moments_ms): construction plus moments is what a construction cost before 2026-12-03,
// when the constructor allocated them. One construction per iteration; the rate counts
// initialised parameters.
void start_gpt2_124m(benchmark::State& state) {
  const quintet::nn::gpt_config model{
      .vocab = 50257, .max_seq = 1024, .layers = 12, .d_model = 768, .heads = 12};
  const auto exec = quintet::execution<host>::all_cores();
  const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});
  std::int64_t parameters = 0;
  double seconds = 0, moment_seconds = 0;
  for (auto _ : state) {
    {
      const auto start = std::chrono::steady_clock::now();
      quintet::train::trainer<float, quintet::markov_source> trainer(
          source, model, {.steps = 1, .batch = 4, .seq = 64, .warmup_steps = 0}, exec);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      state.SetIterationTime(elapsed);
      seconds += elapsed;
      parameters = 0;
      for (const auto& p : trainer.parameters()) parameters += p.value.numel();
      const auto moments_start = std::chrono::steady_clock::now();
      for (const auto& p : trainer.parameters()) trainer.optimizer().state(p.name);
      moment_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - moments_start).count();
    }
    // The next construction touches fresh pages, as a new process does, rather than the blocks
    // this trainer left in the thread's cache (which made iterations 2 and 3 look fast).
    if (auto* cache = quintet::detail::host_block_cache_for_allocation()) cache->trim();
  }
  state.counters["parameters"] = static_cast<double>(parameters);
  state.counters["parameters_per_second"] =
      static_cast<double>(parameters) * static_cast<double>(state.iterations()) / seconds;
  state.counters["moments_ms"] = 1e3 * moment_seconds / static_cast<double>(state.iterations());
}

}  // namespace

BENCHMARK(start_gpt2_124m)->Unit(benchmark::kMillisecond)->Iterations(3)->UseManualTime();
BENCHMARK(serial_train_step)
    ->ArgName("d_model")
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK_CAPTURE(issue_shape_train_step, small, false)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();
BENCHMARK_CAPTURE(issue_shape_train_step, gpt2_124m, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK_MAIN();
