// The mixture-of-experts GPT in the trainer, proven by parity with the serial MoE GPT: 5 AdamW
// steps of train::trainer under plan<dp<zero<0>>, ep<top_k<K>>> at ep 2 and 4 (alone and
// subdividing dp), every step's cross-entropy and every parameter a rank holds (each expert by its
// ep rank and edp replicas only) against the serial run, whose MoE blocks route each micro-batch in
// dp groups of rows (train::serial_model_for: the same tokens per routing call, so the same
// capacity, drops and auxiliary losses). Dropless and with drops, k = 1 and 2, micro-batches,
// ZeRO-1/2/3 (the experts' buckets sharded over edp), recompute none and full (full reruns the
// block's all-to-alls: the same bits as none); the MoE model under data parallelism (ZeRO-0 and 3)
// and pipelines (the stages run their MoE blocks serially); experts split over tp (alone, and with
// ep and ZeRO-3); the step's expert load, identical on
// every rank and equal to the serial run's; what the trainer refuses.
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/thread_comm.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/trainer.hpp>

#include <map>
#include <string>
#include <vector>

using quintet::host;

namespace {

using namespace quintet::test;
namespace train = quintet::train;

template <int K>
using ep_plan = quintet::plan<par::dp<par::zero<0>>, par::ep<par::top_k<K>>>;
using runtime_ep_plan = ep_plan<par::runtime_k>;
template <int Stage>
using ep_zero_plan = quintet::plan<par::dp<par::zero<Stage>>, par::ep<par::top_k<2>>>;
template <int Stage>
using dp_plan = quintet::plan<par::dp<par::zero<Stage>>>;
using dp_pp_plan = quintet::plan<par::dp<par::zero<0>>, par::pp<par::named_schedule>>;
template <int Stage>
using tp_ep_plan =
    quintet::plan<par::dp<par::zero<Stage>>, par::tp<par::megatron_1d>, par::ep<par::top_k<2>>>;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;

// The parity setup's model (2 blocks, d 16) with experts in every block, strong auxiliary losses
// (so a wrong weighting of them shows in the parameters).
quintet::nn::gpt_config moe_model(std::int64_t experts, std::int64_t k, double capacity_factor,
                                  std::int64_t moe_every = 1) {
  quintet::nn::gpt_config model = config;
  model.experts = experts;
  model.top_k = k;
  model.moe_every = moe_every;
  model.capacity_factor = capacity_factor;
  model.aux_loss_coef = 0.1;
  model.z_loss_coef = 0.01;
  return model;
}

// 5 AdamW steps at lr 1e-3 on a global batch of 8 in m micro-batches.
train::training_options moe_training(int m = 1) {
  train::training_options options = training;
  options.batch = 8;
  options.micro_batches = m;
  return options;
}

// The plan against the serial model through the library's check; every serial parameter is
// covered and each expert is held by (ranks / ep) ranks.
template <class Plan, class T = float>
train::parity_report require_parity(const quintet::nn::gpt_config& model,
                                    const train::training_options& options,
                                    quintet::mesh_degrees degrees,
                                    const train::parity_tolerance& tolerance = {}) {
  const auto report = train::check_parity<T, Plan>(source, model, options, degrees, tolerance);
  INFO(report.summary());
  REQUIRE(report.passed);
  REQUIRE(report.uncovered.empty());
  std::map<std::string, int> holders;
  for (const auto& p : report.parameters) ++holders[p.name];
  const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
  std::int64_t experts_seen = 0;
  for (const auto& [name, count] : holders) {
    INFO(name);
    if (name.find(".experts.") != std::string::npos) {
      ++experts_seen;
      if (degrees.pp == 1) REQUIRE(count == world / degrees.ep);
    }
  }
  REQUIRE(experts_seen > 0);
  return report;
}

}  // namespace

TEST_CASE("a MoE GPT under ep trains like the serial MoE GPT", "[parity][expert][moe]") {
  SECTION("ep = dp = 2, top-2, dropless") {
    require_parity<ep_plan<2>>(moe_model(4, 2, 0.0), moe_training(), {.dp = 2, .ep = 2});
  }
  SECTION("ep = dp = 2, top-2, tokens dropped (capacity factor 1)") {
    require_parity<ep_plan<2>>(moe_model(4, 2, 1.0), moe_training(), {.dp = 2, .ep = 2});
  }
  SECTION("ep = dp = 4, top-1, 8 experts, dropless, MoE in every other block") {
    require_parity<ep_plan<1>>(moe_model(8, 1, 0.0, 2), moe_training(), {.dp = 4, .ep = 4});
  }
  SECTION("dp = 4 over ep = 2, top-2, tokens dropped, 2 micro-batches") {
    require_parity<ep_plan<2>>(moe_model(4, 2, 1.25), moe_training(2), {.dp = 4, .ep = 2});
  }
  SECTION("dp = 4 over ep = 4, the plan's k taken at run time (top_k<runtime_k>)") {
    require_parity<runtime_ep_plan>(moe_model(4, 2, 0.0), moe_training(), {.dp = 4, .ep = 4});
  }
  SECTION("recompute full: the all-to-alls rerun in backward, ep = dp = 2, with drops") {
    quintet::nn::gpt_config model = moe_model(4, 2, 1.0);
    model.recompute = quintet::nn::recompute_mode::full;
    require_parity<ep_plan<2>>(model, moe_training(2), {.dp = 2, .ep = 2});
  }
}

TEST_CASE("a MoE GPT under ep with ZeRO-1/2/3 trains like the serial MoE GPT",
          "[parity][expert][moe]") {
  // Each expert's bucket is partial over edp: ZeRO shards it over the expert's replicas.
  SECTION("dp = 4 over ep = 2, ZeRO-1") {
    require_parity<ep_zero_plan<1>>(moe_model(4, 2, 1.0), moe_training(2), {.dp = 4, .ep = 2});
  }
  SECTION("dp = 4 over ep = 2, ZeRO-2") {
    require_parity<ep_zero_plan<2>>(moe_model(4, 2, 1.0), moe_training(2), {.dp = 4, .ep = 2});
  }
  SECTION("dp = 4 over ep = 2, ZeRO-3, and ep = dp = 2 (experts unsharded: edp = 1)") {
    require_parity<ep_zero_plan<3>>(moe_model(4, 2, 1.0), moe_training(2), {.dp = 4, .ep = 2});
    require_parity<ep_zero_plan<3>>(moe_model(4, 2, 0.0), moe_training(), {.dp = 2, .ep = 2});
  }
}

// Under tp each rank holds a slice of every expert it holds: hidden / tp of the fc weight's rows
// and bias and of the proj weight's columns, the proj bias whole (compared: the elements of the
// rank's block of each tensor).
void require_experts_split_over_tp(const train::parity_report& report, int tp) {
  const std::int64_t d = config.d_model, share = config.hidden() / tp;
  std::int64_t sliced = 0;
  for (const auto& p : report.parameters) {
    if (p.name.find(".experts.") == std::string::npos) continue;
    INFO("rank " << p.rank << " " << p.name << ": " << p.compared << " elements");
    if (p.name.ends_with(".fc.weight") || p.name.ends_with(".proj.weight")) {
      REQUIRE(p.compared == share * d);
      ++sliced;
    } else if (p.name.ends_with(".fc.bias")) {
      REQUIRE(p.compared == share);
    } else {
      REQUIRE(p.compared == d);  // proj.bias
    }
  }
  REQUIRE(sliced > 0);
}

TEST_CASE("a MoE GPT with its experts split over tp trains like the serial MoE GPT",
          "[parity][expert][moe]") {
  // Each tp rank holds hidden / tp of every expert it holds (fc rows, proj columns) and sums the
  // partial outputs over tp; the router is replicated and routes alike on every tp rank.
  SECTION("tp 2, tokens dropped") {
    require_experts_split_over_tp(
        require_parity<tp_plan>(moe_model(4, 2, 1.0), moe_training(), {.tp = 2}), 2);
  }
  SECTION("dp 2 over ep 2, x tp 2, tokens dropped, 2 micro-batches") {
    require_experts_split_over_tp(
        require_parity<tp_ep_plan<0>>(moe_model(4, 2, 1.0), moe_training(2),
                                      {.dp = 2, .tp = 2, .ep = 2}),
        2);
  }
  SECTION("dp 4 over ep 2, x tp 2, ZeRO-3, dropless") {
    require_experts_split_over_tp(
        require_parity<tp_ep_plan<3>>(moe_model(4, 2, 0.0), moe_training(),
                                      {.dp = 4, .tp = 2, .ep = 2}),
        2);
  }
}

TEST_CASE("under ep, recompute full and selective give recompute none's bits",
          "[parity][expert][moe]") {
  std::map<quintet::nn::recompute_mode, std::vector<train::parity_run>> runs;
  for (const auto mode : {quintet::nn::recompute_mode::none, quintet::nn::recompute_mode::selective,
                          quintet::nn::recompute_mode::full}) {
    quintet::nn::gpt_config model = moe_model(4, 2, 1.0);
    model.recompute = mode;
    auto& ranks = runs[mode];
    ranks.resize(2);
    quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
      const quintet::execution<host> exec(1);
      mesh_type mesh(world, {.dp = 2, .ep = 2});
      ranks[world.rank()] =
          train::parity_rank<float, ep_plan<2>>(source, model, moe_training(2), exec, &mesh);
    });
  }
  for (const auto mode :
       {quintet::nn::recompute_mode::selective, quintet::nn::recompute_mode::full})
    for (int r = 0; r < 2; ++r) {
      INFO("mode " << quintet::nn::name_of(mode) << ", rank " << r);
      require_identical(runs[quintet::nn::recompute_mode::none][r], runs[mode][r]);
    }
}

TEST_CASE("a MoE GPT under dp (ZeRO-0 and 3) and pipelines trains like the serial one",
          "[parity][moe]") {
  SECTION("dp 2, ZeRO-0: every rank holds every expert") {
    require_parity<dp_plan<0>>(moe_model(4, 2, 1.0), moe_training(2), {.dp = 2});
  }
  SECTION("dp 2, ZeRO-3: the MoE blocks' parameters gathered per piece") {
    require_parity<dp_plan<3>>(moe_model(4, 1, 0.0), moe_training(), {.dp = 2});
  }
  SECTION("dp 2 x pp 2, 1f1b and zb-v (split backward), MoE blocks in the stages") {
    // In float, AdamW's tolerance (parity_tolerance::for_adamw): an expert's fc bias element whose
    // gradient is a near-cancelling sum moves 0.004 lr apart from the serial run's (4.1e-7, 4.1e-6
    // and 4.1e-5 at lr 1e-4, 1e-3 and 1e-2 on an AVX2 machine; the default 2e-6 held on the
    // AVX-512 machines before), while the loss stays within 1e-8. In double the same runs agree to
    // 1e-15: the plan computes the serial model's function; only fp32 rounding, amplified by
    // m / sqrt(v), differs.
    const train::parity_tolerance exact{
        .loss_relative = 1e-12, .parameter_relative = 1e-9, .parameter_absolute = 1e-12};
    for (const char* schedule : {"1f1b", "zb-v"}) {
      INFO(schedule);
      quintet::nn::gpt_config model = moe_model(4, 2, 1.0);
      model.layers = 4;
      train::training_options options = moe_training(4);
      options.pipeline.schedule = schedule;
      require_parity<dp_pp_plan>(model, options, {.dp = 2, .pp = 2},
                                 train::parity_tolerance::for_adamw(options.lr, options.steps));
      require_parity<dp_pp_plan, double>(model, options, {.dp = 2, .pp = 2}, exact);
    }
  }
}

TEST_CASE("the step's expert load is summed over ranks and equals the serial run's",
          "[parity][expert][moe]") {
  const quintet::nn::gpt_config model = moe_model(4, 2, 1.0);
  const train::training_options options = moe_training(2);
  const quintet::execution<host> exec(1);
  train::trainer<float, quintet::markov_source> serial(
      source, train::serial_model_for(model, {.dp = 2}), options, exec);
  const train::step_metrics expected = serial.train_step();
  REQUIRE(expected.experts.blocks == 2);
  REQUIRE(expected.experts.assignments == 2 * 8 * 8 * 2);  // blocks x tokens x k
  REQUIRE(expected.experts.dropped > 0);
  std::int64_t kept = 0;
  for (const auto n : expected.experts.tokens_per_expert) kept += n;
  REQUIRE(kept == expected.experts.assignments - expected.experts.dropped);
  REQUIRE(expected.experts.min() <= expected.experts.balanced());
  REQUIRE(expected.experts.max() >= expected.experts.balanced());
  REQUIRE(expected.experts.load_balancing_loss > 0);
  REQUIRE(expected.experts.z_loss > 0);

  std::vector<train::step_metrics> got(2);
  quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> rank_exec(1);
    mesh_type mesh(world, {.dp = 2, .ep = 2});
    train::trainer<float, quintet::markov_source, ep_plan<2>, mesh_type> trainer(
        source, model, options, rank_exec, &mesh);
    got[world.rank()] = trainer.train_step();
  });
  for (const auto& metrics : got) {
    const train::expert_load& load = metrics.experts;
    CHECK(load.blocks == expected.experts.blocks);
    CHECK(load.tokens_per_expert == expected.experts.tokens_per_expert);
    CHECK(load.assignments == expected.experts.assignments);
    CHECK(load.dropped == expected.experts.dropped);
    CHECK(load.load_balancing_loss == Approx(expected.experts.load_balancing_loss).epsilon(1e-6));
    CHECK(load.z_loss == Approx(expected.experts.z_loss).epsilon(1e-6));
    CHECK(metrics.loss == Approx(expected.loss).epsilon(1e-6));
  }
  // A dense model reports no expert load.
  train::trainer<float, quintet::markov_source> dense(source, config, options, exec);
  CHECK(dense.train_step().experts.empty());
}

TEST_CASE("the trainer refuses MoE runs that do not fit, on every rank", "[parity][expert][moe]") {
  const auto build = [](const quintet::nn::gpt_config& model, quintet::mesh_degrees degrees) {
    quintet::thread_world{degrees.dp}.run([&](quintet::thread_comm& world) {
      const quintet::execution<host> exec(1);
      mesh_type mesh(world, degrees);
      train::trainer<float, quintet::markov_source, ep_plan<2>, mesh_type> trainer(
          source, model, moe_training(), exec, &mesh);
    });
  };
  CHECK_THROWS_WITH(build(config, {.dp = 2, .ep = 2}),
                    Catch::Contains("ep<top_k<2>>: the model has no mixture-of-experts layer"));
  CHECK_THROWS_WITH(build(moe_model(3, 2, 0.0), {.dp = 2, .ep = 2}),
                    Catch::Contains("3 experts do not divide over ep = 2"));
  CHECK_THROWS_WITH(build(moe_model(4, 1, 0.0), {.dp = 2, .ep = 2}),
                    Catch::Contains("routes each token to its top 1 experts"));
  quintet::nn::gpt_config grouped = moe_model(4, 2, 0.0);
  grouped.routing_groups = 2;
  CHECK_THROWS_WITH(build(grouped, {.dp = 2, .ep = 2}),
                    Catch::Contains("2 routing groups under expert parallelism"));
}
