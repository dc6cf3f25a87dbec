// Pipeline parallelism composed with tensor and sequence parallelism inside the stages, proven by
// parity with the serial GPT: 5 AdamW steps of train::trainer, every step's loss and every shard a
// rank holds compared with the serial run, in float (AdamW's tolerance) and in double (1e-12),
// every serial parameter covered. pp 2 x tp 2 under 1f1b, zb-v (the V map: both ends of the model
// on one rank) and interleaved; dp 2 x pp 2 x tp 2; an untied head; MoE blocks with their experts
// split over tp; pp 2 x ring sp 2 and pp 2 x Megatron-SP tp 2 (the stages send seq / tp rows),
// both without dp (the trainer then sums the partial gradients itself). The gradient norm, every
// step, equals the serial one on every rank.
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/thread_comm.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/sequence/megatron_sp.hpp>
#include <quintet/parallel/sequence/ring.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/trainer.hpp>

#include <string>
#include <vector>

using quintet::host;

namespace {

using namespace quintet::test;
namespace train = quintet::train;

using data_parallel = par::dp<par::zero<0>>;
using tensor_parallel = par::tp<par::megatron_1d>;
using pipelined = par::pp<par::named_schedule>;
using tp_pp_plan = quintet::plan<data_parallel, tensor_parallel, pipelined>;
// Without dp: the trainer sums the gradients sp (and Megatron-SP's tp) leave partial itself.
using ring_pp_plan = quintet::plan<tensor_parallel, par::sp<par::ring>, pipelined>;
using megatron_sp_pp_plan = quintet::plan<tensor_parallel, par::sp<par::megatron_sp>, pipelined>;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;

// Four layers of 4 heads (divide over tp 2 and sp 2), 2p = 4 stages for the V map at p = 2.
const quintet::nn::gpt_config composed_model{
    .vocab = 10, .max_seq = 8, .layers = 4, .d_model = 16, .heads = 4, .mlp_hidden = 32};

// The parity setup's run (5 AdamW steps at lr 1e-3), a global batch of 8 in 4 micro-batches.
train::training_options composed_training(const std::string& schedule) {
  train::training_options options = training;
  options.batch = 8;
  options.micro_batches = 4;
  options.pipeline = {.schedule = schedule, .virtual_stages = 2, .layers = {}};
  return options;
}

// The double runs' tolerance.
const train::parity_tolerance exact{
    .loss_relative = 1e-12, .parameter_relative = 1e-9, .parameter_absolute = 1e-12};

// In float within AdamW's tolerance (parity_tolerance::for_adamw), and in double within 1e-12:
// on this model tp alone, without pp, ends one fc weight element 2.8e-6 (2.8e-7 at lr 1e-4) from
// the serial run's on an AVX2 machine, the loss within 1e-8, while in double the runs agree to
// 3e-15 — fp32 rounding of the tp partial sums amplified by m / sqrt(v), not a wrong function.
template <class Plan>
void require_composed_parity(const std::string& schedule, quintet::mesh_degrees degrees,
                             const quintet::nn::gpt_config& model = composed_model) {
  INFO("schedule " << schedule);
  const auto options = composed_training(schedule);
  const auto in_float = train::check_parity<float, Plan>(
      masked_source{}, model, options, degrees,
      train::parity_tolerance::for_adamw(options.lr, options.steps));
  INFO(in_float.summary());
  REQUIRE(in_float.uncovered.empty());
  REQUIRE(in_float.passed);
  const auto in_double =
      train::check_parity<double, Plan>(masked_source{}, model, options, degrees, exact);
  INFO(in_double.summary());
  REQUIRE(in_double.uncovered.empty());
  REQUIRE(in_double.passed);
}

}  // namespace

TEST_CASE("pp x tp trains like the serial GPT", "[parity][pipeline]") {
  for (const std::string schedule : {"1f1b", "zb-v", "interleaved"})
    require_composed_parity<tp_pp_plan>(schedule, {.pp = 2, .tp = 2});
  SECTION("dp 2 x pp 2 x tp 2") {
    require_composed_parity<tp_pp_plan>("1f1b", {.dp = 2, .pp = 2, .tp = 2});
  }
  SECTION("an untied head") {
    quintet::nn::gpt_config untied = composed_model;
    untied.tie_weights = false;
    require_composed_parity<tp_pp_plan>("1f1b", {.pp = 2, .tp = 2}, untied);
  }
  SECTION("MoE blocks (4 experts, top-2, dropless) in the stages, each expert split over tp") {
    // Dropless in float: with a capacity, fp32 rounding flipped which token an expert dropped at
    // step 4 (the loss then 5e-5 off), a discontinuity of routing, not of the plan; with drops the
    // double run is held to 1e-12 (measured 1e-15).
    quintet::nn::gpt_config moe = composed_model;
    moe.experts = 4;
    moe.top_k = 2;
    moe.moe_every = 2;
    moe.capacity_factor = 0.0;
    moe.aux_loss_coef = 0.1;
    moe.z_loss_coef = 0.01;
    require_composed_parity<tp_pp_plan>("zb-v", {.pp = 2, .tp = 2}, moe);
    moe.capacity_factor = 1.0;
    const auto with_drops = train::check_parity<double, tp_pp_plan>(
        masked_source{}, moe, composed_training("zb-v"), {.pp = 2, .tp = 2}, exact);
    INFO(with_drops.summary());
    REQUIRE(with_drops.uncovered.empty());
    REQUIRE(with_drops.passed);
  }
}

TEST_CASE("pp x sp trains like the serial GPT: ring and Megatron-SP", "[parity][pipeline]") {
  SECTION("pp 2 x ring sp 2") {
    for (const std::string schedule : {"1f1b", "zb-v"})
      require_composed_parity<ring_pp_plan>(schedule, {.pp = 2, .sp = 2});
  }
  SECTION("pp 2 x Megatron-SP on tp 2: the stages exchange seq / tp rows") {
    require_composed_parity<megatron_sp_pp_plan>("1f1b", {.pp = 2, .tp = 2});
  }
}

TEST_CASE("under pp x tp the gradient norm equals the serial one on every rank",
          "[parity][pipeline]") {
  const quintet::execution<host> exec(1);
  const masked_source data;
  for (const std::string schedule : {"1f1b", "zb-v"}) {
    INFO("schedule " << schedule);
    const auto options = composed_training(schedule);
    train::trainer<float, masked_source> serial(data, composed_model, options, exec);
    std::vector<train::step_metrics> expected;
    for (int s = 0; s < 3; ++s) expected.push_back(serial.train_step());
    std::vector<std::vector<train::step_metrics>> got(4);
    quintet::thread_world{4}.run([&](quintet::thread_comm& comm) {
      mesh_type mesh(comm, {.pp = 2, .tp = 2});
      train::trainer<float, masked_source, tp_pp_plan, mesh_type> run(data, composed_model, options,
                                                                      exec, &mesh);
      for (int s = 0; s < 3; ++s)
        got[static_cast<std::size_t>(comm.rank())].push_back(run.train_step());
    });
    for (const auto& rank : got)
      for (int s = 0; s < 3; ++s) {
        REQUIRE(rank[s].gradient_norm == Approx(expected[s].gradient_norm).epsilon(1e-5));
        REQUIRE(rank[s].loss == Approx(expected[s].loss).epsilon(1e-5));
        REQUIRE(rank[s].gradient_norm == got.front()[s].gradient_norm);
        REQUIRE(rank[s].loss == got.front()[s].loss);
      }
  }
}
