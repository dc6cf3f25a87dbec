// Step time of the GPT serially and under tensor and sequence parallelism on 2 thread ranks (one
// core each), with the communication share of each parallel step: the collectives a step makes
// (counted by counting_comm per axis and operation) replayed alone, at their mean size, on the
// same ranks in the same run.
#include <benchmark/benchmark.h>

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using quintet::host;
namespace par = quintet::parallel;
using tp_plan = quintet::plan<par::tp<par::megatron_1d>>;
using megatron_sp_plan =
    quintet::plan<par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
using ulysses_plan = quintet::plan<par::sp<par::ulysses>>;
using ring_plan = quintet::plan<par::sp<par::ring>>;
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

// `calls` collectives of one kind, at their mean size, ready to run again on `group` with buffers
// allocated outside the timed replay. Ring passes (send) are replayed as a send to the next rank
// with a receive from the last; receives travel with them.
struct replayed_collective {
  quintet::thread_comm* group;
  quintet::comm_operation op;
  std::int64_t calls;
  quintet::tensor<float, host> in, out;

  replayed_collective(quintet::thread_comm& g, quintet::comm_operation o, std::int64_t n_calls,
                      std::int64_t bytes_per_call)
      : group(&g),
        op(o),
        calls(n_calls),
        // fp32 elements, rounded up to a multiple of the group so every block is whole
        in(quintet::shape{(bytes_per_call / 4 + g.size() - 1) / g.size() * g.size()}),
        out(in.shape()) {
    quintet::fill(in, 1.0f);
  }

  static bool replayable(quintet::comm_operation op) {
    using quintet::comm_operation;
    return op == comm_operation::all_reduce || op == comm_operation::all_gather ||
           op == comm_operation::reduce_scatter || op == comm_operation::all_to_all ||
           op == comm_operation::send;
  }

  void run() {
    using quintet::comm_operation;
    const std::int64_t n = group->size(), block = in.numel() / n;
    for (std::int64_t i = 0; i < calls; ++i) switch (op) {
        case comm_operation::all_reduce:
          group->all_reduce(in);
          break;
        case comm_operation::all_gather:
          group->all_gather(quintet::slice(in, 0, 0, block), out);
          break;
        case comm_operation::reduce_scatter:
          group->reduce_scatter(in, quintet::slice(out, 0, 0, block));
          break;
        case comm_operation::all_to_all:
          group->all_to_all(in, out);
          break;
        default: {  // send: one ring pass
          const int next = static_cast<int>((group->rank() + 1) % n);
          const int last = static_cast<int>((group->rank() + n - 1) % n);
          const quintet::p2p_op pass[] = {quintet::p2p_op::send(in, next),
                                          quintet::p2p_op::recv(out, last)};
          group->exchange(pass);
        }
      }
  }
};

quintet::mesh_axis axis_named(const std::string& name) {
  for (const quintet::mesh_axis axis : quintet::all_mesh_axes)
    if (quintet::name_of(axis) == name) return axis;
  QUINTET_FAIL("bench_tensor_parallel: no mesh axis is named '{}'", name);
}

// One parallel plan on 2 thread ranks: step time, and the step's collectives (all but receives,
// which travel with their sends) replayed alone.
template <class Plan>
void parallel_step(benchmark::State& state, quintet::mesh_degrees degrees) {
  const int ranks = degrees.tp * degrees.sp;
  const std::int64_t iterations = state.max_iterations;
  double step_seconds = 0, comm_seconds = 0;
  std::int64_t calls_per_step = 0, bytes_per_step = 0;
  quintet::thread_world{ranks}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    counted_comm counted(world.split(0, world.rank()));
    mesh_type mesh(counted, degrees);
    quintet::train::trainer<float, quintet::markov_source, Plan, mesh_type> trainer(
        source, model_of(state), options, exec, &mesh);
    trainer.train_step();  // warm-up
    counted.ledger().clear();
    counted.inner().barrier();
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iterations; ++i) trainer.train_step();
    const double seconds = seconds_since(start);
    std::vector<replayed_collective> replay;
    std::int64_t calls = 0, bytes = 0;
    for (const auto& [key, tally] : counted.ledger().tallies()) {
      const auto& [axis, op] = key;
      if (!replayed_collective::replayable(op)) continue;
      replay.emplace_back(mesh.axis(axis_named(axis)).inner(), op, tally.calls,
                          tally.bytes / tally.calls);
      calls += tally.calls;
      bytes += tally.bytes;
    }
    counted.inner().barrier();
    const auto replay_start = std::chrono::steady_clock::now();
    for (auto& collective : replay) collective.run();
    counted.inner().barrier();
    const double replayed = seconds_since(replay_start);
    if (world.rank() == 0) {
      step_seconds = seconds;
      comm_seconds = replayed;
      calls_per_step = calls / iterations;
      bytes_per_step = bytes / iterations;
    }
  });
  for (auto _ : state) state.SetIterationTime(step_seconds / static_cast<double>(iterations));
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(options.batch * options.seq),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["comm_share"] = comm_seconds / step_seconds;
  state.counters["collectives_per_step"] = static_cast<double>(calls_per_step);
  state.counters["comm_bytes_per_step"] = static_cast<double>(bytes_per_step);
}

void tensor_parallel_step(benchmark::State& state) { parallel_step<tp_plan>(state, {.tp = 2}); }
void megatron_sp_step(benchmark::State& state) {
  parallel_step<megatron_sp_plan>(state, {.tp = 2});
}
void ulysses_step(benchmark::State& state) { parallel_step<ulysses_plan>(state, {.sp = 2}); }
void ring_step(benchmark::State& state) { parallel_step<ring_plan>(state, {.sp = 2}); }

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
BENCHMARK(megatron_sp_step)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(ulysses_step)
    ->ArgName("d_model")
    ->Arg(256)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(ring_step)->ArgName("d_model")->Arg(256)->Iterations(10)->UseManualTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK_MAIN();
