// bf16 mixed precision composed with pipeline and expert parallelism, against the bf16 serial run
// (bf16_parity.hpp): pp 2 under 1F1B, interleaved and ZB-V (the V map puts both ends of the model
// on one rank), with tied and untied heads; dp 2 x pp 2 under ZeRO-0, 1 and 3; experts over
// ep 2 inside dp 2, with drops, under ZeRO-0 and ZeRO-1. The master weights hold every reduction
// (the tied table's pp sum and its values shared after a ZeRO update too).
#include <catch2/catch.hpp>

#include "bf16_parity.hpp"

#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>

#include <string>

namespace {

namespace par = quintet::parallel;
namespace train = quintet::train;
using quintet::test::bf16_parity;
using quintet::test::bf16_within_adamw_bound;

// One instantiation for every schedule and ZeRO stage (both given at run time).
using bf16_pp_plan = quintet::plan<par::dp<par::zero<par::runtime_stage>>,
                                   par::tp<par::megatron_1d>, par::pp<par::named_schedule>>;
// Without a dp policy the trainer sums the tied table's copies (and what tp leaves partial) on
// the master itself.
using bf16_tp_pp_plan = quintet::plan<par::tp<par::megatron_1d>, par::pp<par::named_schedule>>;
using bf16_ep_plan = quintet::plan<par::dp<par::zero<par::runtime_stage>>,
                                   par::tp<par::megatron_1d>, par::ep<par::top_k<par::runtime_k>>>;

// Four layers: 2p = 4 stages for the V map and for interleaved (2 per rank) at p = 2.
const quintet::nn::gpt_config four_layers{
    .vocab = 16, .max_seq = 16, .layers = 4, .d_model = 32, .heads = 2};

train::training_options pipelined(const std::string& schedule, std::int64_t micro_batches) {
  auto options = quintet::test::bf16_parity_training();
  options.micro_batches = micro_batches;
  options.pipeline = {.schedule = schedule,
                      .virtual_stages = 2,
                      .layers = {},
                      .partition = train::layer_partition::even};
  return options;
}

}  // namespace

TEST_CASE("bf16 under pipeline parallelism gives the bf16 serial run",
          "[train][mixed_precision][parity][pipeline]") {
  // Untied, every piece's gradient of a micro-batch is the serial run's bf16 gradient (the same
  // activations cross the stages, in bf16) and the master sums the micro-batches in the same
  // order: the same bits, under every schedule. Tied, the serial run adds the table's head and
  // embedding terms of a micro-batch in bf16 inside one backward; the pipeline's stages hold a
  // copy each (or, on the V map, one copy that the head's terms of several micro-batches reach
  // before the embedding's announcement), and the master sums them in fp32: another rounding,
  // the tolerance of dp x tp (bf16_within_adamw_bound; the loss seen within 4e-5 relative).
  const train::parity_tolerance exact{
      .loss_relative = 0.0, .parameter_relative = 0.0, .parameter_absolute = 0.0};
  for (const bool tied : {false, true}) {
    quintet::nn::gpt_config model = four_layers;
    model.tie_weights = tied;
    for (const std::string schedule : {"1f1b", "interleaved", "zb-v"}) {
      const auto report = bf16_parity<bf16_pp_plan>(
          {.pp = 2}, 0, tied ? bf16_within_adamw_bound : exact, model, pipelined(schedule, 4));
      INFO(schedule << (tied ? ", tied" : ", untied") << "\n" << report.summary());
      CHECK(report.uncovered.empty());
      CHECK(report.passed);
    }
  }
  SECTION("a plan without dp, tied, 1F1B") {
    const auto report = bf16_parity<bf16_tp_pp_plan>({.pp = 2}, -1, bf16_within_adamw_bound,
                                                     four_layers, pipelined("1f1b", 4));
    INFO(report.summary());
    CHECK(report.uncovered.empty());
    CHECK(report.passed);
  }
}

TEST_CASE("bf16 under dp 2 x pp 2 gives the bf16 serial run",
          "[train][mixed_precision][parity][pipeline]") {
  for (const int zero : {0, 1, 3})
    for (const std::string schedule : {"1f1b", "zb-v"}) {
      const auto report = bf16_parity<bf16_pp_plan>(
          {.dp = 2, .pp = 2}, zero, bf16_within_adamw_bound, four_layers, pipelined(schedule, 2));
      INFO(schedule << ", ZeRO-" << zero << "\n" << report.summary());
      CHECK(report.uncovered.empty());
      CHECK(report.passed);
    }
}

TEST_CASE("bf16 with experts over ep 2 gives the bf16 serial run",
          "[train][mixed_precision][parity][moe]") {
  quintet::nn::gpt_config two_layers = four_layers;
  two_layers.layers = 2;
  const quintet::nn::gpt_config moe = quintet::test::bf16_moe_model(two_layers);  // with drops
  for (const int zero : {0, 1}) {
    const auto report =
        bf16_parity<bf16_ep_plan>({.dp = 2, .ep = 2}, zero, bf16_within_adamw_bound, moe);
    INFO("ZeRO-" << zero << "\n" << report.summary());
    CHECK(report.uncovered.empty());
    CHECK(report.passed);
  }
}
