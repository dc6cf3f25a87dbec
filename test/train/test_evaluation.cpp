// trainer::evaluate: the held-out loss is the model's forward on the held-out batches (the loss a
// fresh model gives before training), it changes nothing of training (losses, norms and every
// parameter bit for bit with and without evaluations, serially and under plans on thread ranks),
// and under a plan every rank reports the same loss, the serial one up to fp32 summation order.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using quintet::host;
using quintet::train::trainer;
using quintet::train::training_options;
namespace par = quintet::parallel;

namespace {

const quintet::execution<host> exec;

const quintet::nn::gpt_config model{
    .vocab = 8, .max_seq = 16, .layers = 1, .d_model = 16, .heads = 2};
const quintet::markov_source source({.vocab = 8, .order = 2, .successors = 3, .seed = 6});
const quintet::markov_source held_out = source.held_out();
const training_options options{.steps = 6,
                               .batch = 4,
                               .seq = 16,
                               .micro_batches = 2,
                               .lr = 1e-2,
                               .warmup_steps = 1,
                               .clip_norm = 0.5,
                               .seed = 6};

struct run_result {
  std::vector<quintet::train::step_metrics> steps;
  std::vector<quintet::train::evaluation_metrics> evaluations;
  std::vector<float> parameters;  // every parameter of the rank, flattened in registry order
};

// Trains `options.steps` steps, evaluating on 2 held-out batches before every step with
// `evaluate_every` > 0 dividing it (and after the last).
template <class Trainer>
run_result train(Trainer& run, int evaluate_every) {
  run_result out;
  for (int s = 0; s < options.steps; ++s) {
    if (evaluate_every > 0 && s % evaluate_every == 0)
      out.evaluations.push_back(run.evaluate(held_out, 2));
    out.steps.push_back(run.train_step());
  }
  if (evaluate_every > 0) out.evaluations.push_back(run.evaluate(held_out, 2));
  for (const auto& p : run.parameters())
    out.parameters.insert(out.parameters.end(), p.value.data(), p.value.data() + p.value.numel());
  return out;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void require_same_training(const run_result& with, const run_result& without) {
  REQUIRE(with.steps.size() == without.steps.size());
  for (std::size_t s = 0; s < with.steps.size(); ++s) {
    INFO("step " << s);
    REQUIRE(same_bits(with.steps[s].loss, without.steps[s].loss));
    REQUIRE(same_bits(with.steps[s].gradient_norm, without.steps[s].gradient_norm));
  }
  REQUIRE(with.parameters.size() == without.parameters.size());
  CHECK(std::memcmp(with.parameters.data(), without.parameters.data(),
                    with.parameters.size() * sizeof(float)) == 0);
}

using tensor_plan = quintet::plan<par::tp<par::megatron_1d>>;
using ring_plan = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::ring>>;
using megatron_sp_plan = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;

template <class Plan>
std::vector<run_result> parallel_run(quintet::mesh_degrees degrees, int evaluate_every) {
  const int world_size = degrees.tp * degrees.sp;
  std::vector<run_result> per_rank(world_size);
  quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> rank_exec(1);
    mesh_type mesh(world, degrees);
    trainer<float, quintet::markov_source, Plan, mesh_type> run(source, model, options, rank_exec,
                                                                &mesh);
    per_rank[world.rank()] = train(run, evaluate_every);
  });
  return per_rank;
}

}  // namespace

TEST_CASE("the held-out loss is the model's forward on the held-out batches",
          "[train][evaluation]") {
  trainer<float, quintet::markov_source> run(source, model, options, exec);
  const auto first = run.evaluate(held_out, 3);
  CHECK(first.step == 0);
  CHECK(first.batches == 3);
  CHECK(first.tokens == 3 * options.batch * options.seq);
  // A fresh model of the same seed, on the same batches split the same way.
  quintet::nn::parameter_registry<float, host> registry(options.seed);
  quintet::nn::gpt<float, host> fresh(registry, exec, model);
  double sum = 0.0;
  std::int64_t count = 0;
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t m = 0; m < options.micro_batches; ++m) {
      const auto batch = held_out.batch(
          b, quintet::split_rows({0, options.batch}, options.micro_batches, m), options.seq);
      quintet::nn::context<host> ctx;
      const auto loss = fresh.forward(ctx, batch.inputs.view(), batch.targets.view());
      sum += loss.loss_sum;
      count += loss.count;
    }
  CHECK(same_bits(first.loss, sum / static_cast<double>(count)));
  // Evaluating twice gives the same loss; training moves it, and records the step.
  CHECK(same_bits(run.evaluate(held_out, 3).loss, first.loss));
  for (int s = 0; s < 5; ++s) run.train_step();
  const auto later = run.evaluate(held_out, 3);
  CHECK(later.step == 5);
  CHECK(later.loss < first.loss);
  // The held-out batches are not the training batches.
  CHECK(run.evaluate(source, 3).loss != later.loss);
  REQUIRE_THROWS_WITH(run.evaluate(held_out, 0), Catch::Contains("0 batches, need at least 1"));
}

TEST_CASE("evaluations do not change training: the same bits with and without them",
          "[train][evaluation][determinism]") {
  SECTION("serial") {
    trainer<float, quintet::markov_source> with(source, model, options, exec);
    trainer<float, quintet::markov_source> without(source, model, options, exec);
    const auto a = train(with, 2), b = train(without, 0);
    CHECK(a.evaluations.size() == 4);
    require_same_training(a, b);
  }
  SECTION("tp = 2") {
    const auto with = parallel_run<tensor_plan>({.tp = 2}, 1);
    const auto without = parallel_run<tensor_plan>({.tp = 2}, 0);
    for (std::size_t r = 0; r < with.size(); ++r) {
      INFO("rank " << r);
      require_same_training(with[r], without[r]);
    }
  }
  SECTION("ring attention with tp, tp = 2 x sp = 2") {
    const auto with = parallel_run<ring_plan>({.tp = 2, .sp = 2}, 3);
    const auto without = parallel_run<ring_plan>({.tp = 2, .sp = 2}, 0);
    for (std::size_t r = 0; r < with.size(); ++r) {
      INFO("rank " << r);
      require_same_training(with[r], without[r]);
    }
  }
}

TEST_CASE("under a plan every rank reports the serial held-out loss",
          "[train][evaluation][parallel]") {
  trainer<float, quintet::markov_source> serial_trainer(source, model, options, exec);
  const auto serial = train(serial_trainer, 3);
  const auto check = [&](const std::vector<run_result>& ranks) {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      REQUIRE(ranks[r].evaluations.size() == serial.evaluations.size());
      for (std::size_t e = 0; e < serial.evaluations.size(); ++e) {
        INFO("rank " << r << ", evaluation " << e);
        CHECK(same_bits(ranks[r].evaluations[e].loss, ranks[0].evaluations[e].loss));
        CHECK(ranks[r].evaluations[e].loss == Approx(serial.evaluations[e].loss).epsilon(1e-5));
        CHECK(ranks[r].evaluations[e].tokens == serial.evaluations[e].tokens);
        CHECK(ranks[r].evaluations[e].step == serial.evaluations[e].step);
      }
    }
  };
  SECTION("tp = 2") { check(parallel_run<tensor_plan>({.tp = 2}, 3)); }
  SECTION("Megatron-SP, tp = 2") { check(parallel_run<megatron_sp_plan>({.tp = 2}, 3)); }
  SECTION("ring, sp = 2") { check(parallel_run<ring_plan>({.sp = 2}, 3)); }
}
