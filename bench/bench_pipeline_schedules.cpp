// Cost of schedules as data: generating a schedule (its compute order, the unit-cost timing that
// places its transfers, the weave), proving it (the verifier's rendezvous run), and simulating it,
// at p = 64 ranks, m = 1024 micro-batches, v = 4 chunks for interleaved (the scale), and
// over p and m to show how the cost grows (linear in the number of actions, p x m x v x ~5, with
// a log factor from the weave's priority queue). Counters: actions (in the lists) and
// actions_per_second. The check — the lists verify — is done once, outside the timed loop.
#include <benchmark/benchmark.h>

#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

namespace pipeline = quintet::parallel::pipeline;

// The schedules in catalogue order, as benchmark arguments.
const char* name_of(std::int64_t index) {
  return pipeline::builtin_schedules[static_cast<std::size_t>(index)].name.data();
}

void set_counters(benchmark::State& state, const pipeline::schedule& s) {
  state.SetLabel(std::string(name_of(state.range(0))) + " p=" + std::to_string(state.range(1)) +
                 " m=" + std::to_string(state.range(2)));
  state.counters["actions"] = static_cast<double>(s.action_count());
  state.counters["actions_per_second"] = benchmark::Counter(
      static_cast<double>(s.action_count()), benchmark::Counter::kIsIterationInvariantRate);
}

// generate + verify: what a trainer pays once before its first step.
void generate_and_verify(benchmark::State& state) {
  const char* name = name_of(state.range(0));
  const pipeline::schedule_shape shape{static_cast<int>(state.range(1)),
                                       static_cast<int>(state.range(2))};
  const pipeline::schedule checked = pipeline::generate(name, shape, 4);  // warm-up and check
  if (!pipeline::verify(checked)) throw std::runtime_error(pipeline::verify(checked).message);
  for (auto _ : state) {
    const pipeline::schedule s = pipeline::generate(name, shape, 4);
    benchmark::DoNotOptimize(pipeline::verify(s).ok);
  }
  set_counters(state, checked);
}

// The parts alone, at the scale: generate, verify, simulate.
void generate_only(benchmark::State& state) {
  const char* name = name_of(state.range(0));
  const pipeline::schedule_shape shape{static_cast<int>(state.range(1)),
                                       static_cast<int>(state.range(2))};
  for (auto _ : state) benchmark::DoNotOptimize(pipeline::generate(name, shape, 4).actions.data());
  set_counters(state, pipeline::generate(name, shape, 4));
}

void verify_only(benchmark::State& state) {
  const pipeline::schedule s =
      pipeline::generate(name_of(state.range(0)),
                         {static_cast<int>(state.range(1)), static_cast<int>(state.range(2))}, 4);
  for (auto _ : state) benchmark::DoNotOptimize(pipeline::verify(s).ok);
  set_counters(state, s);
}

void simulate_only(benchmark::State& state) {
  const pipeline::schedule s =
      pipeline::generate(name_of(state.range(0)),
                         {static_cast<int>(state.range(1)), static_cast<int>(state.range(2))}, 4);
  for (auto _ : state) benchmark::DoNotOptimize(pipeline::simulate(s).makespan);
  set_counters(state, s);
}

void growth_of_generate_and_verify(benchmark::State& state) { generate_and_verify(state); }

void at_scale(benchmark::internal::Benchmark* b) {
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(pipeline::builtin_schedules.size()); ++i) {
    b->Args({i, 64, 1024});
  }
  b->Unit(benchmark::kMillisecond);
}

// Growth: interleaved (v = 4) and zb-v over p at m = 4p, and over m at p = 16.
void growth(benchmark::internal::Benchmark* b) {
  for (const std::int64_t schedule : {2, 5}) {
    for (const std::int64_t p : {8, 16, 32, 64}) b->Args({schedule, p, 4 * p});
    for (const std::int64_t m : {64, 256, 1024, 4096}) b->Args({schedule, 16, m});
  }
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(generate_and_verify)->Apply(at_scale);
BENCHMARK(generate_only)->Apply(at_scale);
BENCHMARK(verify_only)->Apply(at_scale);
BENCHMARK(simulate_only)->Apply(at_scale);
BENCHMARK(growth_of_generate_and_verify)->Apply(growth);
BENCHMARK_MAIN();
