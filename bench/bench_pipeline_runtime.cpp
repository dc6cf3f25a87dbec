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
//
// The dualpipe_v_moe rows: DualPipeV's overlapped pairs with experts in every block over ep 2
// (dp 2 x pp 2, 4 thread ranks), each run twice in one process — the pairs' halves one after the
// other, then overlapped (runtime::overlap_pairs) — on a link whose all-to-alls take at least
// `latency_us` (slow_link_comm: 0, a link as fast as the threads; 1000, a slow network). The
// benchmark's time is the overlapped step; the counters are the step one after the other
// (sequential_ms), their ratio (overlapped_over_sequential), the mean pair (F&B) both ways, and the
// hand-overs per step. Both runs must end on the same losses (checked).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
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

// A communicator whose all-to-alls take at least `latency` from their start to their end (a
// network's latency the threads do not have); everything else is the inner communicator's.
template <quintet::communicator Comm>
class slow_link_comm : public quintet::communicator_api<slow_link_comm<Comm>, host> {
 public:
  slow_link_comm(Comm inner, std::chrono::microseconds latency)
      : inner_(std::move(inner)), latency_(latency) {}
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  slow_link_comm split(int color, int key) { return {inner_.split(color, key), latency_}; }

 private:
  friend class quintet::communicator_api<slow_link_comm<Comm>, host>;
  using clock = std::chrono::steady_clock;
  using buffer = quintet::comm_buffer;
  using counts = std::span<const std::int64_t>;

  // An inner request that is complete no earlier than `due`.
  class delayed final : public quintet::detail::pending_operation {
   public:
    delayed(quintet::comm_request inner, clock::time_point due)
        : inner_(std::move(inner).release()), due_(due) {}
    void wait() override {
      if (inner_) inner_->wait();
      std::this_thread::sleep_until(due_);
    }
    bool ready() override { return (!inner_ || inner_->ready()) && clock::now() >= due_; }
    void abandon(const std::string& message) noexcept override {
      if (inner_) inner_->abandon(message);
    }

   private:
    std::shared_ptr<quintet::detail::pending_operation> inner_;
    clock::time_point due_;
  };

  template <class Call>
  void views(buffer in, buffer out, Call call) {
    quintet::detail::with_typed_views<host>(in, out, call);
  }

  void do_all_reduce(buffer in, buffer out, quintet::reduce_op op) {
    if (in.data == out.data) {
      quintet::detail::with_typed_view<host, true>(out, [&](auto b) { inner_.all_reduce(b, op); });
    } else {
      views(in, out, [&](auto i, auto o) { inner_.all_reduce(i, o, op); });
    }
  }
  quintet::comm_request do_all_reduce_async(buffer in, buffer out, quintet::reduce_op op) {
    if (in.data == out.data)
      return quintet::detail::with_typed_view<host, true>(
          out, [&](auto b) { return inner_.all_reduce_async(b, op); });
    return quintet::detail::with_typed_views<host>(
        in, out, [&](auto i, auto o) { return inner_.all_reduce_async(i, o, op); });
  }
  void do_reduce_scatter(buffer in, buffer out, quintet::reduce_op op) {
    views(in, out, [&](auto i, auto o) { inner_.reduce_scatter(i, o, op); });
  }
  quintet::comm_request do_reduce_scatter_async(buffer in, buffer out, quintet::reduce_op op) {
    return quintet::detail::with_typed_views<host>(
        in, out, [&](auto i, auto o) { return inner_.reduce_scatter_async(i, o, op); });
  }
  void do_all_gather(buffer in, buffer out) {
    views(in, out, [&](auto i, auto o) { inner_.all_gather(i, o); });
  }
  quintet::comm_request do_all_gather_async(buffer in, buffer out) {
    return quintet::detail::with_typed_views<host>(
        in, out, [&](auto i, auto o) { return inner_.all_gather_async(i, o); });
  }
  void do_broadcast(buffer inout, int root) {
    quintet::detail::with_typed_view<host, true>(inout, [&](auto b) { inner_.broadcast(b, root); });
  }
  void do_all_to_all(buffer in, buffer out) {
    const auto due = clock::now() + latency_;
    views(in, out, [&](auto i, auto o) { inner_.all_to_all(i, o); });
    std::this_thread::sleep_until(due);
  }
  void do_all_to_all_v(buffer in, counts in_counts, buffer out, counts out_counts) {
    const auto due = clock::now() + latency_;
    views(in, out, [&](auto i, auto o) { inner_.all_to_all_v(i, in_counts, o, out_counts); });
    std::this_thread::sleep_until(due);
  }
  quintet::comm_request do_all_to_all_v_async(buffer in, counts in_counts, buffer out,
                                              counts out_counts) {
    const auto due = clock::now() + latency_;
    return quintet::comm_request(std::make_shared<delayed>(
        quintet::detail::with_typed_views<host>(
            in, out,
            [&](auto i, auto o) { return inner_.all_to_all_v_async(i, in_counts, o, out_counts); }),
        due));
  }
  void do_exchange(std::span<const quintet::p2p_op> ops) { inner_.exchange(ops); }
  quintet::comm_request do_exchange_async(std::span<const quintet::p2p_op> ops) {
    return inner_.exchange_async(ops);
  }
  void do_barrier() { inner_.barrier(); }

  Comm inner_;
  std::chrono::microseconds latency_;
};

using slow_link = slow_link_comm<quintet::thread_comm>;
using slow_mesh = quintet::device_mesh<slow_link>;
using moe_pipeline_plan = quintet::plan<par::dp<par::zero<0>>, par::ep<par::top_k<par::runtime_k>>,
                                        par::pp<par::named_schedule>>;

// The mean duration of the overlapped pairs (F&B) of a measured step, in ms.
double mean_pair_ms(const pipe::simulation& measured) {
  double total = 0;
  int pairs = 0;
  for (const auto& rank : measured.timeline)
    for (const pipe::timed_action& t : rank)
      if (t.what.kind == pipe::action_kind::overlap_f_b) {
        total += t.end - t.start;
        ++pairs;
      }
  return pairs > 0 ? total / pairs : 0.0;
}

// 4 layers of d 128, 4 experts top-2 in every block (dropless), dp 2 x pp 2 with ep 2, 8
// micro-batches of 2 rows per dp rank; dualpipe-v (4 virtual stages of one layer).
void dualpipe_v_moe(benchmark::State& state, std::chrono::microseconds latency) {
  const quintet::nn::gpt_config model{.vocab = 16,
                                      .max_seq = 64,
                                      .layers = 4,
                                      .d_model = 128,
                                      .heads = 4,
                                      .experts = 4,
                                      .top_k = 2,
                                      .moe_every = 1,
                                      .capacity_factor = 0.0};
  quintet::train::training_options options{
      .steps = 1 << 30, .batch = 32, .seq = 64, .micro_batches = 8, .warmup_steps = 0};
  options.pipeline = {.schedule = "dualpipe-v",
                      .virtual_stages = 2,
                      .layers = {},
                      .partition = quintet::train::layer_partition::even};
  struct way {
    double step_ms = 0, pair_ms = 0;
    int hand_overs = 0;
    std::vector<double> losses;
  };
  way ways[2];  // [0]: one after the other, [1]: overlapped
  for (const bool overlap : {false, true}) {
    way& w = ways[overlap ? 1 : 0];
    options.pipeline.overlap_pairs = overlap;
    quintet::thread_world{4}.run([&](quintet::thread_comm& world) {
      const quintet::execution<host> exec(1);
      slow_link link(world.split(0, world.rank()), latency);
      slow_mesh mesh(link, {.dp = 2, .pp = 2, .ep = 2});
      quintet::train::trainer<float, quintet::markov_source, moe_pipeline_plan, slow_mesh> trainer(
          source, model, options, exec, &mesh);
      for (int s = 0; s < warm_up_steps; ++s) trainer.train_step();
      for (int s = 0; s < measured_steps; ++s) {
        const double loss = trainer.train_step().loss;
        const auto& runtime = trainer.pipeline().runtime();
        const int hand_overs = runtime.stats().hand_overs;
        const pipe::simulation timeline = runtime.measured_timeline();  // collective over pp
        if (link.rank() == 0) {
          w.step_ms += timeline.makespan / measured_steps;
          w.pair_ms += mean_pair_ms(timeline) / measured_steps;
          w.hand_overs += hand_overs;
          w.losses.push_back(loss);
        }
      }
    });
  }
  if (ways[0].losses != ways[1].losses) {
    state.SkipWithError("overlapped pairs changed the losses");
    return;
  }
  for (auto _ : state) state.SetIterationTime(ways[1].step_ms / 1e3);
  state.counters["sequential_ms"] = ways[0].step_ms;
  state.counters["overlapped_over_sequential"] = ways[1].step_ms / ways[0].step_ms;
  state.counters["pair_ms_sequential"] = ways[0].pair_ms;
  state.counters["pair_ms_overlapped"] = ways[1].pair_ms;
  state.counters["hand_overs_per_step"] = static_cast<double>(ways[1].hand_overs) / measured_steps;
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
  for (const int latency_us : {0, 1000}) {
    benchmark::RegisterBenchmark(
        ("pipeline_step/dualpipe_v_moe/latency_us:" + std::to_string(latency_us)).c_str(),
        [latency_us](benchmark::State& state) {
          dualpipe_v_moe(state, std::chrono::microseconds(latency_us));
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
