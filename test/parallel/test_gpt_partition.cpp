// The pipeline partitioner and memory: gpt_piece_costs' context bytes against the contexts real
// stages keep; every rank's measured peak context bytes against the simulator's prediction;
// balanced_layers against exhaustive search (independent of its dynamic program and its own
// enumeration) on random costs, for one and for several stages per rank; the head priced at
// GPT-2's shape; peak_contexts_by_stage against the verifier's count; bad input.
#include <catch2/catch.hpp>

#include "pipeline_parity.hpp"

#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt_costs.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

using quintet::host;
using namespace quintet::test::pipeline;
namespace nn = quintet::nn;
namespace pl = quintet::parallel::pipeline;

namespace {

// Each stage's context bytes on one micro-batch of `rows` sequences: after its forward, and
// after its input pass (what it keeps for the weight pass: the split backward's I then W).
struct stage_bytes {
  std::size_t after_forward = 0, after_input_pass = 0;
};

template <class T>
std::vector<stage_bytes> measured_stage_bytes(const nn::gpt_config& config,
                                              const std::vector<int>& layers, std::int64_t rows) {
  nn::parameter_registry<T, host> registry(seed);
  std::vector<std::unique_ptr<nn::gpt_stage<T, host>>> stages;
  for (const nn::stage_cut& cut : nn::stage_cuts(config, layers))
    stages.push_back(std::make_unique<nn::gpt_stage<T, host>>(registry, exec, config, cut));
  const auto batch = source.batch(0, {0, rows}, seq);
  std::vector<stage_bytes> out(stages.size());
  std::vector<nn::context<host>> contexts(stages.size());
  quintet::tensor<T, host> x;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const auto activations =
        s == 0 ? quintet::tensor_view<const T, host>() : quintet::tensor_view<const T, host>(x);
    auto y = stages[s]->forward(contexts[s], {.tokens = batch.inputs.view(),
                                              .targets = batch.targets.view(),
                                              .activations = activations,
                                              .ignore_index = quintet::kernels::no_target});
    out[s].after_forward = contexts[s].bytes();
    x = std::move(y.activations);
  }
  quintet::tensor<T, host> dy;
  for (std::size_t s = stages.size(); s-- > 0;) {
    const auto gradient = s + 1 == stages.size() ? quintet::tensor_view<const T, host>()
                                                 : quintet::tensor_view<const T, host>(dy);
    auto dx = stages[s]->backward_input(
        contexts[s],
        {.activations = gradient, .loss_scale = 1.0 / (rows * seq), .aux_loss_scale = 1.0});
    out[s].after_input_pass = contexts[s].bytes();
    dy = std::move(dx);
  }
  return out;
}

template <class T>
void require_priced_bytes(bool tied) {
  const std::vector<int> layers{3, 3, 2};
  // Two shapes, so that no two of the formulas' terms (bsh, bsH, abs) keep one ratio.
  struct block_shape {
    std::int64_t d_model, heads, mlp_hidden;
  };
  for (const auto& [mode, dims] : {std::pair{nn::recompute_mode::none, block_shape{8, 2, 16}},
                                   std::pair{nn::recompute_mode::selective, block_shape{8, 2, 16}},
                                   std::pair{nn::recompute_mode::full, block_shape{8, 2, 16}},
                                   std::pair{nn::recompute_mode::none, block_shape{12, 4, 40}},
                                   std::pair{nn::recompute_mode::selective, block_shape{12, 4, 40}},
                                   std::pair{nn::recompute_mode::full, block_shape{12, 4, 40}}}) {
    nn::gpt_config config = config_of(tied);
    config.recompute = mode;
    config.d_model = dims.d_model;
    config.heads = dims.heads;
    config.mlp_hidden = dims.mlp_hidden;
    INFO("tied " << tied << ", recompute " << nn::name_of(mode) << ", element bytes " << sizeof(T)
                 << ", d " << dims.d_model << ", heads " << dims.heads << ", H "
                 << dims.mlp_hidden);
    const std::int64_t rows = 3;
    const auto measured = measured_stage_bytes<T>(config, layers, rows);
    const auto priced = nn::stage_loads(nn::gpt_piece_costs<T>(config, rows, seq), layers);
    REQUIRE(measured.size() == priced.size());
    for (std::size_t s = 0; s < measured.size(); ++s) {
      INFO("stage " << s);
      CHECK(static_cast<double>(measured[s].after_forward) == priced[s].peak_bytes);
      CHECK(static_cast<double>(measured[s].after_forward) == priced[s].context_bytes);
      CHECK(static_cast<double>(measured[s].after_input_pass) == priced[s].weight_bytes);
    }
  }
}

// A partition's figures as balanced_layers' documentation defines them, computed here from
// stage_loads: the busiest rank's FLOPs and the largest rank memory.
struct figures {
  double pace = 0, memory = 0;
};

figures figures_of(const nn::gpt_costs& costs, const std::vector<int>& layers,
                   const nn::partition_goal& goal) {
  const auto loads = nn::stage_loads(costs, layers, goal);
  std::vector<double> flops(loads.size(), 0), bytes(loads.size(), 0);
  for (std::size_t s = 0; s < loads.size(); ++s) {
    const auto r = static_cast<std::size_t>(goal.stage_to_rank[s]);
    flops[r] += loads[s].flops;
    bytes[r] += loads[s].peak_bytes;
  }
  return {*std::max_element(flops.begin(), flops.end()),
          *std::max_element(bytes.begin(), bytes.end())};
}

// Every partition of `layers` blocks over `stages` (at least one each), in lexicographic order.
void every_partition(int layers, int stages, std::vector<int>& prefix,
                     std::vector<std::vector<int>>& out) {
  if (stages == 1) {
    prefix.push_back(layers);
    out.push_back(prefix);
    prefix.pop_back();
    return;
  }
  for (int first = 1; first <= layers - (stages - 1); ++first) {
    prefix.push_back(first);
    every_partition(layers - first, stages - 1, prefix, out);
    prefix.pop_back();
  }
}

std::vector<std::vector<int>> every_partition(int layers, int stages) {
  std::vector<int> prefix;
  std::vector<std::vector<int>> out;
  every_partition(layers, stages, prefix, out);
  return out;
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(a, b); }

}  // namespace

TEST_CASE("a stage keeps the context bytes gpt_piece_costs prices", "[pipeline][partition]") {
  require_priced_bytes<float>(true);
  require_priced_bytes<float>(false);
  require_priced_bytes<double>(true);
}

TEST_CASE("each rank's peak context bytes are the simulator's prediction",
          "[parity][pipeline][memory]") {
  // Every schedule at p in {2, 4} and BPipe at 8, m in {p, 12} where it divides the 12 rows
  // (equal micro-batches, so each stage's context has one size): the bytes every rank held at
  // once, counted while running, against simulate() given each stage's context bytes from
  // gpt_piece_costs and, for the split backwards, the bytes it prices from a stage's input pass to
  // its weight pass (the test above holds both to real stages). BPipe moves nothing at p <= 4, so
  // it also runs at p = 8, where it parks contexts on the partner ranks.
  for (const auto& info : pl::builtin_schedules) {
    for (const int p : {2, 4, 8}) {
      if (p == 8 && info.name != std::string_view("bpipe")) continue;
      for (const int m : {p, 12}) {
        const pl::schedule_shape shape{.ranks = p, .micro_batches = m};
        if (!pl::accepts(info, shape) || batch_rows % m != 0) continue;
        const pl::schedule s = pl::generate(info.name, shape);
        const std::vector<int> layers = nn::even_layers(8, s.stages());
        const nn::gpt_config config = config_of(true);
        const std::int64_t rows = batch_rows / m;
        const auto priced = nn::stage_loads(nn::gpt_piece_costs<double>(config, rows, seq), layers);
        pl::cost_model costs;
        costs.stages.clear();
        for (std::size_t stage = 0; stage < priced.size(); ++stage) {
          pl::stage_costs c;
          c.context_bytes = priced[stage].context_bytes;
          c.weight_bytes = priced[stage].weight_bytes;
          costs.stages.push_back(c);
        }
        const pl::simulation predicted = pl::simulate(s, costs);
        std::vector<std::size_t> held(static_cast<std::size_t>(p));
        std::vector<int> moved(static_cast<std::size_t>(p));
        quintet::thread_world{.size = p, .timeout = std::chrono::seconds(30)}.run(
            [&](quintet::thread_comm& world) {
              quintet::device_mesh<quintet::thread_comm> mesh(world, {.pp = p});
              const auto stats = pipeline_rank<double>(mesh.pp(), s, true).stats;
              held[static_cast<std::size_t>(world.rank())] = stats.peak_context_bytes;
              moved[static_cast<std::size_t>(world.rank())] = stats.contexts_moved;
            });
        if (p == 8) {  // the parked contexts this row is for
          INFO("bpipe, p 8, m " << m);
          CHECK(std::accumulate(moved.begin(), moved.end(), 0) > 0);
        }
        for (int r = 0; r < p; ++r) {
          INFO("schedule " << info.name << ", p " << p << ", m " << m << ", rank " << r);
          CHECK(static_cast<double>(held[static_cast<std::size_t>(r)]) ==
                predicted.peak_bytes[static_cast<std::size_t>(r)]);
        }
      }
    }
  }
}

TEST_CASE("every_partition lists each composition once", "[pipeline][partition]") {
  // C(layers - 1, stages - 1) compositions, all distinct, each covering the layers.
  const auto all = every_partition(7, 3);
  CHECK(all.size() == 15);
  for (const auto& p : all) {
    CHECK(p.size() == 3);
    CHECK(p[0] + p[1] + p[2] == 7);
    CHECK(*std::min_element(p.begin(), p.end()) >= 1);
  }
  auto sorted = all;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
}

TEST_CASE("balanced_layers finds the best pace, then the least memory, of every partition",
          "[pipeline][partition]") {
  std::mt19937 random(11);
  std::uniform_real_distribution<double> draw(0.5, 2.0);
  for (int trial = 0; trial < 600; ++trial) {
    const int ranks = 1 + trial % 4;
    const int map = (trial / 4) % 3;  // one stage per rank, looped over 2 chunks, V over 2
    const int stages = map == 0 ? ranks : 2 * ranks;
    const int layers = stages + static_cast<int>(random() % 5);
    const bool equal_blocks = trial % 2 == 0;
    nn::gpt_costs costs;
    const double flops = draw(random), bytes = draw(random), weight_bytes = draw(random);
    for (int i = 0; i < layers; ++i)
      costs.blocks.push_back({equal_blocks ? flops : draw(random),
                              equal_blocks ? bytes : draw(random),
                              equal_blocks ? weight_bytes : draw(random)});
    costs.embedding = {0.1 * draw(random), 0.2 * draw(random), 0.3 * draw(random)};
    costs.head = {3 * draw(random), 2 * draw(random), 3 * draw(random)};
    costs.stage_bytes = 0.01;
    nn::partition_goal goal;
    // Under a split backward each held context counts at the larger of its two sizes.
    goal.split_backward = (trial / 12) % 2 == 1;
    for (int s = 0; s < stages; ++s) {
      goal.held.push_back(1 + static_cast<int>(random() % 4));
      goal.stage_to_rank.push_back(map == 0   ? s
                                   : map == 1 ? s % ranks
                                              : (s < ranks ? s : 2 * ranks - 1 - s));
    }
    INFO("trial " << trial << ": " << layers << " layers over " << stages << " stages, map " << map
                  << ", split backward " << goal.split_backward);
    figures best{1e300, 1e300};
    for (const auto& p : every_partition(layers, stages)) {
      const figures f = figures_of(costs, p, goal);
      if ((!close(f.pace, best.pace) && f.pace < best.pace) ||
          (close(f.pace, best.pace) && f.memory < best.memory))
        best = f;
    }
    const std::vector<int> chosen = nn::balanced_layers(costs, stages, goal);
    const figures got = figures_of(costs, chosen, goal);
    INFO("chosen " << nn::to_string(chosen));
    CHECK(close(got.pace, best.pace));
    CHECK(close(got.memory, best.memory));
  }
}

TEST_CASE("balanced_layers gives the head's stage fewer blocks at GPT-2's shape",
          "[pipeline][partition]") {
  const nn::gpt_config gpt2{
      .vocab = 50257, .max_seq = 1024, .layers = 12, .d_model = 768, .heads = 12};
  const nn::gpt_costs costs = nn::gpt_piece_costs<float>(gpt2, 1, 1024);
  // The head's product, 2 d V per token, is ~4.4 blocks' (24 d^2 + 4 s d) FLOPs here.
  CHECK(costs.head.flops / costs.blocks[0].flops == Approx(4.45).epsilon(0.01));
  const pl::schedule s = pl::generate("1f1b", {.ranks = 4, .micro_batches = 8});
  nn::partition_goal goal;
  goal.held = pl::peak_contexts_by_stage(s);
  goal.stage_to_rank = s.stage_to_rank;
  const std::vector<int> balanced = nn::balanced_layers(costs, 4, goal);
  const std::vector<int> even = nn::even_layers(12, 4);
  INFO("balanced " << nn::to_string(balanced));
  CHECK(balanced.back() == 1);  // the head's stage: one block and the head
  const double pace = figures_of(costs, balanced, goal).pace;
  CHECK(pace == Approx(costs.blocks[0].flops + costs.head.flops));
  CHECK(pace < 0.75 * figures_of(costs, even, goal).pace);
}

TEST_CASE("peak_contexts_by_stage counts what the verifier counts", "[pipeline][partition]") {
  CHECK(pl::peak_contexts_by_stage(pl::generate("1f1b", {.ranks = 4, .micro_batches = 8})) ==
        std::vector<int>{4, 3, 2, 1});
  CHECK(pl::peak_contexts_by_stage(pl::generate("gpipe", {.ranks = 2, .micro_batches = 5})) ==
        std::vector<int>{5, 5});
  for (const auto& info : pl::builtin_schedules) {
    if (info.name == "bpipe") continue;  // its evictions lower the rank's count
    for (const int p : {2, 4}) {
      const pl::schedule_shape shape{.ranks = p, .micro_batches = 2 * p};
      if (!pl::accepts(info, shape)) continue;
      const pl::schedule s = pl::generate(info.name, shape);
      INFO("schedule " << info.name << ", p = " << p);
      const std::vector<int> by_stage = pl::peak_contexts_by_stage(s);
      const std::vector<int> by_rank = pl::verify(s).peak_contexts;
      for (int r = 0; r < p; ++r) {
        int sum = 0;
        for (const int stage : s.stages_on(r)) sum += by_stage[static_cast<std::size_t>(stage)];
        // One stage per rank: the same count; several: their peaks need not coincide.
        if (s.stages() == p) {
          CHECK(sum == by_rank[static_cast<std::size_t>(r)]);
        } else {
          CHECK(sum >= by_rank[static_cast<std::size_t>(r)]);
        }
      }
    }
  }
}

TEST_CASE("balanced_layers refuses what cannot be partitioned", "[pipeline][partition]") {
  nn::gpt_costs costs;
  costs.blocks.assign(3, {1, 1});
  REQUIRE_THROWS_WITH(nn::balanced_layers(costs, 4),
                      Catch::Contains("3 layers cannot fill 4 stages"));
  nn::partition_goal goal;
  goal.held = {1, 2, 3};
  REQUIRE_THROWS_WITH(nn::balanced_layers(costs, 2, goal),
                      Catch::Contains("3 held-context counts and 0 stage ranks given for 2"));
  REQUIRE_THROWS_WITH(nn::stage_loads(costs, {2, 2}), Catch::Contains("does not fit 3 layers"));
}
