// Pipeline schedules as they run (issue 11): each built-in schedule trains a GPT on 2 thread ranks
// (pp 2, one thread each) through train::trainer, and each measured step is held against the
// simulator's prediction for the same schedule given the costs measured in that step: the mean
// duration of each compute kind (F, B, I, W, F&B) per virtual stage. The benchmark's time is the
// measured step (first forward to last compute, from the runtime's pp barrier); the counters are
// the simulated step (simulated_ms), their ratio (measured_over_simulated), and the largest idle
// share of a rank, measured and simulated (bubble_measured, bubble_simulated).
//
// Model: vocab 16 (an order-2 Markov source), 4 layers of d 128 (4 heads), batch 16 x 64 in 8
// micro-batches; interleaved and the V schedules cut it into 4 virtual stages of one layer, the
// others into 2 of two. 3 warm-up steps, then 5 measured; each step's loss must be finite and
// every compute action of the schedule timed (checked outside the timing).
//
// The p6 rows: BPipe moves contexts only from p = 6 on, so it and its base (1F1B) run on 6 thread
// ranks, one layer each (6 layers, batch 24 x 64 in 12 micro-batches). They need 6 free cores: on
// the 2-core development VM the ranks take turns and the ratio to the simulator measures that.
// tools/device_check.sh runs them on the device machine's host cores.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using quintet::host;
namespace par = quintet::parallel;
namespace pipe = quintet::parallel::pipeline;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;
using pipeline_plan = quintet::plan<par::pp<par::named_schedule>>;

const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});
constexpr int warm_up_steps = 3, measured_steps = 5;

// The mean measured duration of each compute kind on each virtual stage: the simulator's costs.
pipe::cost_model measured_costs(const pipe::simulation& measured, int stages) {
  std::map<std::pair<pipe::action_kind, int>, std::pair<double, int>> sums;  // (total, count)
  for (const auto& rank : measured.timeline)
    for (const pipe::timed_action& t : rank) {
      auto& [total, count] = sums[{t.what.kind, t.what.stage}];
      total += t.end - t.start;
      ++count;
    }
  const auto mean = [&](pipe::action_kind kind, int stage) {
    const auto found = sums.find({kind, stage});
    return found == sums.end() ? 0.0 : found->second.first / found->second.second;
  };
  pipe::cost_model costs;
  costs.stages.assign(static_cast<std::size_t>(stages), {});
  for (int s = 0; s < stages; ++s) {
    pipe::stage_costs& c = costs.stages[static_cast<std::size_t>(s)];
    c.forward = mean(pipe::action_kind::forward, s);
    c.backward = mean(pipe::action_kind::backward, s);
    c.backward_input = mean(pipe::action_kind::backward_input, s);
    c.backward_weight = mean(pipe::action_kind::backward_weight, s);
    c.forward_and_backward = mean(pipe::action_kind::overlap_f_b, s);
  }
  return costs;
}

// 1 - busy / makespan, the largest over the ranks.
double largest_idle_share(const pipe::simulation& measured) {
  double most = 0;
  for (const auto& rank : measured.timeline) {
    double busy = 0;
    for (const pipe::timed_action& t : rank)
      if (pipe::is_compute(t.what.kind)) busy += t.end - t.start;
    most = std::max(most, 1.0 - busy / measured.makespan);
  }
  return most;
}

// pp 2: 4 layers, 8 micro-batches of 2 rows; pp 6: 6 layers, 12 micro-batches of 2 rows.
void pipeline_step(benchmark::State& state, const std::string& schedule, int pp) {
  const int layers = pp == 2 ? 4 : pp, micro_batches = 2 * std::max(pp, 4);
  const quintet::nn::gpt_config model{
      .vocab = 16, .max_seq = 64, .layers = layers, .d_model = 128, .heads = 4};
  quintet::train::training_options options{.steps = 1 << 30,
                                           .batch = 2 * micro_batches,
                                           .seq = 64,
                                           .micro_batches = micro_batches,
                                           .warmup_steps = 0};
  options.pipeline = {.schedule = schedule,
                      .virtual_stages = 2,
                      .layers = {},
                      .partition = quintet::train::layer_partition::even};
  std::vector<pipe::simulation> measured;
  std::optional<pipe::schedule> ran;  // the schedule the ranks ran
  quintet::thread_world{pp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    mesh_type mesh(world, {.pp = pp});
    quintet::train::trainer<float, quintet::markov_source, pipeline_plan, mesh_type> trainer(
        source, model, options, exec, &mesh);
    for (int s = 0; s < warm_up_steps; ++s) trainer.train_step();
    for (int s = 0; s < measured_steps; ++s) {
      const auto metrics = trainer.train_step();
      if (!std::isfinite(metrics.loss))
        throw std::runtime_error(fmt::format("bench_pipeline_runtime: {} lost its loss", schedule));
      const auto& runtime = trainer.pipeline().runtime();
      pipe::simulation timeline = runtime.measured_timeline();  // collective over pp
      if (world.rank() == 0) {
        measured.push_back(std::move(timeline));
        ran = runtime.plan();
      }
    }
  });
  double measured_ms = 0, simulated_ms = 0, bubble_measured = 0, bubble_simulated = 0;
  for (const pipe::simulation& step : measured) {
    // Every action of the schedule was timed, on the rank that runs it.
    for (int r = 0; r < ran->ranks(); ++r) {
      if (step.timeline[static_cast<std::size_t>(r)].size() != ran->on(r).size())
        throw std::runtime_error("bench_pipeline_runtime: an action was not timed");
    }
    const pipe::simulation predicted = pipe::simulate(*ran, measured_costs(step, ran->stages()));
    measured_ms += step.makespan;
    simulated_ms += predicted.makespan;
    bubble_measured += largest_idle_share(step);
    bubble_simulated += predicted.max_bubble();
  }
  const double n = static_cast<double>(measured.size());
  for (auto _ : state) state.SetIterationTime(measured_ms / n / 1e3);
  state.counters["simulated_ms"] = simulated_ms / n;
  state.counters["measured_over_simulated"] = measured_ms / simulated_ms;
  state.counters["bubble_measured"] = bubble_measured / n;
  state.counters["bubble_simulated"] = bubble_simulated / n;
}

}  // namespace

int main(int argc, char** argv) {
  // (row name, schedule, pp): every built-in schedule at pp 2, then BPipe and its base at pp 6.
  const struct {
    const char* name;
    const char* schedule;
    int pp;
  } rows[] = {
      {"gpipe", "gpipe", 2},           {"1f1b", "1f1b", 2},    {"interleaved", "interleaved", 2},
      {"zb_h1", "zb-h1", 2},           {"zb_h2", "zb-h2", 2},  {"zb_v", "zb-v", 2},
      {"dualpipe_v", "dualpipe-v", 2}, {"1f1b_p6", "1f1b", 6}, {"bpipe_p6", "bpipe", 6}};
  for (const auto& row : rows) {
    benchmark::RegisterBenchmark(
        (std::string("pipeline_step/") + row.name).c_str(),
        [schedule = std::string(row.schedule), pp = row.pp](benchmark::State& state) {
          pipeline_step(state, schedule, pp);
        })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
