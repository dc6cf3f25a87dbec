// The GPT step under data parallelism on 2 thread ranks (one core each) against the serial step
// of the same global batch on one core (the reference, in the same run), and against the same
// data-parallel step with its gradients reduced after backward: one bucket per set, launched when
// the embedding's gradients are done, so nothing of the reduction overlaps backward. The buckets
// of the overlapped runs are an eighth of the model, so the head's and the last blocks' reduce
// while the first blocks run backward. Also: the buckets a step launched while some gradient was
// still to be computed (launched_early), out of its buckets.
#include <benchmark/benchmark.h>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <chrono>
#include <cstdint>

namespace {

using quintet::host;
namespace par = quintet::parallel;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;

const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});

quintet::nn::gpt_config model_of(const benchmark::State& state) {
  return {.vocab = 16, .max_seq = 64, .layers = 4, .d_model = state.range(0), .heads = 8};
}

// Parameters of the model, for the bucket size: 12 d^2 per block (qkv, proj, fc, proj).
std::int64_t approximate_parameters(const quintet::nn::gpt_config& model) {
  return 12 * model.layers * model.d_model * model.d_model;
}

quintet::train::training_options options_of(std::int64_t bucket_elements) {
  return {.steps = 1 << 30,
          .batch = 16,
          .seq = 64,
          .warmup_steps = 0,
          .bucket_elements = bucket_elements};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void serial_step(benchmark::State& state) {
  const quintet::execution<host> exec(1);
  const auto options = options_of(0);
  quintet::train::trainer<float, quintet::markov_source> trainer(source, model_of(state), options,
                                                                 exec);
  trainer.train_step();  // warm-up
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.train_step().loss);
    state.SetIterationTime(seconds_since(start));
  }
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(options.batch * options.seq),
                         benchmark::Counter::kIsIterationInvariantRate);
}

// dp = 2 at ZeRO stage `Stage`; buckets of an eighth of the model, or (overlap = false) one.
template <int Stage>
void data_parallel_step(benchmark::State& state, bool overlap) {
  using plan = quintet::plan<par::dp<par::zero<Stage>>>;
  const auto model = model_of(state);
  const auto options = options_of(overlap ? approximate_parameters(model) / 8 : 0);
  const std::int64_t iterations = state.max_iterations;
  double step_seconds = 0;
  std::int64_t launched_early = 0;
  std::size_t buckets = 0;
  quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    mesh_type mesh(world, {.dp = 2});
    quintet::train::trainer<float, quintet::markov_source, plan, mesh_type> trainer(
        source, model, options, exec, &mesh);
    trainer.train_step();  // warm-up
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iterations; ++i) trainer.train_step();
    const double seconds = seconds_since(start);
    if (world.rank() == 0) {
      step_seconds = seconds;
      launched_early = trainer.data_parallel().timeline().launched_early;
      buckets = trainer.data_parallel().bucket_count();
    }
  });
  for (auto _ : state) state.SetIterationTime(step_seconds / static_cast<double>(iterations));
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(options.batch * options.seq),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["buckets"] = static_cast<double>(buckets);
  state.counters["launched_early"] = static_cast<double>(launched_early);
}

void ddp_overlapped(benchmark::State& state) { data_parallel_step<0>(state, true); }
void ddp_after_backward(benchmark::State& state) { data_parallel_step<0>(state, false); }
void zero1_overlapped(benchmark::State& state) { data_parallel_step<1>(state, true); }
void zero2_overlapped(benchmark::State& state) { data_parallel_step<2>(state, true); }

}  // namespace

BENCHMARK(serial_step)
    ->ArgName("d_model")
    ->Arg(256)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK(ddp_overlapped)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(ddp_after_backward)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(zero1_overlapped)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(zero2_overlapped)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
