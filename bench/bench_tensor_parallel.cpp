// Step time of the GPT serially and under tensor parallelism (tp = 2 thread ranks, one core
// each), with the communication share of the tensor-parallel step: the all-reduces a step makes
// (counted by counting_comm) replayed alone on the same ranks in the same run.
#include <benchmark/benchmark.h>

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <chrono>
#include <cstdint>

namespace {

using quintet::host;
namespace par = quintet::parallel;
using tp_plan = quintet::plan<par::tensor<par::megatron_1d>>;
using counted_comm = quintet::counting_comm<quintet::thread_comm>;
using mesh_type = quintet::device_mesh<counted_comm>;

const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});
const quintet::train::training_options options{
    .steps = 1 << 30, .batch = 16, .seq = 64, .warmup_steps = 0};

quintet::nn::gpt_config model_of(const benchmark::State& state) {
  return {.vocab = 16, .max_seq = 64, .layers = 2, .d_model = state.range(0), .heads = 8};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The reference: the same model trained by one rank on `threads` cores.
void serial_step(benchmark::State& state) {
  const quintet::execution<host> exec(static_cast<int>(state.range(1)));
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

void tensor_parallel_step(benchmark::State& state) {
  constexpr int tp = 2;
  const std::int64_t iterations = state.max_iterations;
  double step_seconds = 0, comm_seconds = 0;
  std::int64_t calls_per_step = 0, bytes_per_step = 0;
  quintet::thread_world{tp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    counted_comm counted(world.split(0, world.rank()));
    mesh_type mesh(counted, {.tp = tp});
    quintet::train::trainer<float, quintet::markov_source, tp_plan, mesh_type> trainer(
        source, model_of(state), options, exec, &mesh);
    trainer.train_step();  // warm-up
    counted.ledger().clear();
    mesh.tp().barrier();
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iterations; ++i) trainer.train_step();
    const double seconds = seconds_since(start);
    // Replay the step's all-reduces alone: the same count and mean size, on the same ranks.
    const auto tally = counted.ledger().tally("tp", quintet::comm_operation::all_reduce);
    const std::int64_t calls = tally.calls / iterations;
    quintet::tensor<float, host> buffer(quintet::shape{tally.bytes / tally.calls / 4});
    quintet::fill(buffer, 1.0f);
    mesh.tp().barrier();
    const auto replay_start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iterations * calls; ++i) mesh.tp().inner().all_reduce(buffer);
    const double replay = seconds_since(replay_start);
    if (world.rank() == 0) {
      step_seconds = seconds;
      comm_seconds = replay;
      calls_per_step = calls;
      bytes_per_step = tally.bytes / iterations;
    }
  });
  for (auto _ : state) state.SetIterationTime(step_seconds / static_cast<double>(iterations));
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(options.batch * options.seq),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["comm_share"] = comm_seconds / step_seconds;
  state.counters["all_reduces_per_step"] = static_cast<double>(calls_per_step);
  state.counters["all_reduce_bytes_per_step"] = static_cast<double>(bytes_per_step);
}

}  // namespace

// Arguments: d_model, then (serial only) the cores the one rank may use.
BENCHMARK(serial_step)
    ->ArgNames({"d_model", "threads"})
    ->Args({256, 1})
    ->Args({256, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK(tensor_parallel_step)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
