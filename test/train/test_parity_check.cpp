// check_parity, the library's parity check: a plan that computes what the serial model computes
// passes, with a report of every step and parameter; a run whose loss or parameters drift is
// failed, naming the parameter and the rank.
#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/parity.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace par = quintet::parallel;

namespace {

const quintet::markov_source source({.vocab = 10, .order = 1, .successors = 3, .seed = 4});
const quintet::nn::gpt_config model{
    .vocab = 10, .max_seq = 8, .layers = 1, .d_model = 16, .heads = 4, .mlp_hidden = 32};
const quintet::train::training_options training{
    .steps = 3, .batch = 4, .seq = 8, .lr = 1e-3, .min_lr = 1e-3, .warmup_steps = 0, .seed = 9};
using ring_tp = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::ring>>;

}  // namespace

TEST_CASE("check_parity passes a plan that computes the serial model", "[train][parity]") {
  const auto report =
      quintet::train::check_parity<float, ring_tp>(source, model, training, {.tp = 2, .sp = 2});
  INFO(report.summary());
  REQUIRE(report.passed);
  CHECK(report.plan == "plan<tp<megatron_1d>, sp<ring>>");
  CHECK(report.serial_losses.size() == 3);
  CHECK(report.loss_relative.size() == 3);
  // 4 ranks, each comparing every parameter it holds (1 block: 12 parameters, plus embedding
  // tables and the final norm: 16).
  CHECK(report.parameters.size() == 4 * 16);
  for (const auto& p : report.parameters) CHECK(p.compared > 0);
  CHECK_THAT(report.summary(), Catch::Contains("verdict: PASS"));
}

TEST_CASE("a plan of degree 1 agrees with the serial model bit for bit", "[train][parity]") {
  const auto report = quintet::train::check_parity<float, ring_tp>(source, model, training, {});
  REQUIRE(report.passed);
  for (const double d : report.loss_relative) CHECK(d == 0.0);
  CHECK(report.worst_parameter_relative() == 0.0);
}

TEST_CASE("check_parity fails a drifting run and names what drifted", "[train][parity]") {
  const quintet::execution<quintet::host> exec(1);
  using tp_plan = quintet::plan<par::tp<par::megatron_1d>>;
  const auto serial =
      quintet::train::parity_rank<float, quintet::serial_plan, quintet::markov_source,
                                  par::no_mesh>(source, model, training, exec, nullptr);
  // tp = 4 pads the vocabulary of 10 to 12: rank 3 holds ids 9, 10, 11.
  std::vector<quintet::train::parity_run> ranks(4);
  quintet::thread_world{4}.run([&](quintet::thread_comm& world) {
    quintet::device_mesh<quintet::thread_comm> mesh(world, {.tp = 4});
    ranks[world.rank()] =
        quintet::train::parity_rank<float, tp_plan>(source, model, training, exec, &mesh);
  });
  REQUIRE(quintet::train::compare_with_serial(serial, ranks).passed);

  auto drifted = ranks;
  for (auto& shard : drifted[1].shards)
    if (shard.name == "blocks.0.mlp.fc.weight") shard.values[5] += 1e-3;
  const auto report = quintet::train::compare_with_serial(serial, drifted);
  CHECK(!report.passed);
  CHECK_THAT(report.summary(), Catch::Contains("OUTSIDE rank 1 blocks.0.mlp.fc.weight"));
  CHECK_THAT(report.summary(), Catch::Contains("verdict: FAIL"));

  auto lossy = ranks;
  lossy[0].losses[2] *= 1.0 + 1e-4;
  CHECK(!quintet::train::compare_with_serial(serial, lossy).passed);

  // Numbers that are not numbers fail, in a loss or in a parameter.
  auto nan_loss = ranks;
  nan_loss[2].losses[1] = std::nan("");
  CHECK(!quintet::train::compare_with_serial(serial, nan_loss).passed);
  auto nan_value = ranks;
  nan_value[1].shards.front().values[0] = std::nan("");
  CHECK(!quintet::train::compare_with_serial(serial, nan_value).passed);

  // A rank's blocks missing from the comparison leave elements no rank holds: a failure too.
  const std::vector<quintet::train::parity_run> three(ranks.begin(), ranks.begin() + 3);
  const auto partial = quintet::train::compare_with_serial(serial, three);
  CHECK(!partial.passed);
  CHECK_THAT(partial.summary(), Catch::Contains("NOT COVERED blocks.0.mlp.fc.weight"));

  // A padding row of the vocabulary is not compared (the serial model has no such row); a real
  // one is.
  auto padded = ranks;
  for (auto& shard : padded[3].shards)
    if (shard.name == "embedding.token_weight") shard.values[2 * 16 + 3] += 1.0;  // id 11
  CHECK(quintet::train::compare_with_serial(serial, padded).passed);
  for (auto& shard : padded[3].shards)
    if (shard.name == "embedding.token_weight") shard.values[3] += 1.0;  // id 9
  CHECK(!quintet::train::compare_with_serial(serial, padded).passed);
}
