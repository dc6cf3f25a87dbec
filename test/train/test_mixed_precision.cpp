// bf16 mixed precision (trainer<bf16>): the model computes in bf16 and every update goes through
// fp32 master weights, fp32 gradients summed over micro-batches and ranks, and fp32 AdamW moments.
// Checked: the model holds the rounding of its master weights, updates too small for bf16 are kept
// in the master, the bf16 loss curve stays within a band of the fp32 curve, data parallelism
// (ZeRO-0 to 3), tensor and sequence parallelism give the bf16 serial run (pipelines and
// experts: test_mixed_precision_composition.cpp), and what is not
// supported is refused.
#include <catch2/catch.hpp>

#include "../checkpoint/temp_directory.hpp"
#include "bf16_parity.hpp"

#include <quintet/comm/thread_comm.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/optim/master_weights.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/checkpointing.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/trainer.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

using quintet::bf16;
using quintet::host;
using quintet::train::trainer;
using quintet::train::training_options;
namespace par = quintet::parallel;

namespace {

const quintet::execution<host> exec(1);

const quintet::nn::gpt_config small_model{
    .vocab = 16, .max_seq = 16, .layers = 2, .d_model = 32, .heads = 2};

using bf16_trainer = trainer<bf16, quintet::markov_source>;
static_assert(std::is_same_v<bf16_trainer::master_type, float>);
static_assert(std::is_same_v<trainer<float, quintet::markov_source>::master_type, float>);

// The losses of `steps` steps.
template <class Trainer>
std::vector<double> losses_of(Trainer& run, std::int64_t steps) {
  std::vector<double> out;
  for (std::int64_t s = 0; s < steps; ++s) out.push_back(run.train_step().loss);
  return out;
}

}  // namespace

TEST_CASE("bf16 training keeps fp32 master weights whose rounding the model computes with",
          "[train][mixed_precision]") {
  const quintet::markov_source source({.vocab = 16, .order = 1, .successors = 3, .seed = 3});
  // A low rate: many updates are below half a bf16 ulp of the parameter they change (2^-8 near
  // the layer norms' scales of 1).
  const training_options options{.steps = 4,
                                 .batch = 4,
                                 .seq = 16,
                                 .micro_batches = 2,
                                 .lr = 1e-4,
                                 .min_lr = 1e-5,
                                 .warmup_steps = 0};
  bf16_trainer run(source, small_model, options, exec);
  std::vector<std::vector<float>> initial;
  {
    // Before the first step the master is the bf16 initialisation, widened exactly.
    auto model = run.model_parameters().begin();
    for (const auto& p : run.parameters()) {
      initial.emplace_back(p.value.data(), p.value.data() + p.value.numel());
      for (std::int64_t i = 0; i < p.value.numel(); ++i)
        REQUIRE(p.value.data()[i] == static_cast<float>(model->value.data()[i]));
      ++model;
    }
  }
  losses_of(run, options.steps);

  std::int64_t elements = 0, moved = 0, finer_than_bf16 = 0;
  auto model = run.model_parameters().begin();
  std::size_t index = 0;
  for (const auto& master : run.parameters()) {
    REQUIRE(model->name == master.name);
    REQUIRE(model->value.shape() == master.value.shape());
    for (std::int64_t i = 0; i < master.value.numel(); ++i) {
      const float m = master.value.data()[i];
      // The model's value is the master's rounded to nearest even, bit for bit.
      REQUIRE(model->value.data()[i].bits == bf16(m).bits);
      ++elements;
      moved += m != initial[index][static_cast<std::size_t>(i)] ? 1 : 0;
      finer_than_bf16 += m != static_cast<float>(bf16(m)) ? 1 : 0;
    }
    // AdamW's moments are fp32, one per master element.
    const auto& state = run.optimizer().state(master.name);
    static_assert(
        std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(state.m.data())>>, float>);
    REQUIRE(state.m.numel() == master.value.numel());
    ++model;
    ++index;
  }
  INFO(elements << " elements, " << moved << " moved, " << finer_than_bf16 << " finer than bf16");
  // The master started as the bf16 initialisation, widened: every element it holds beyond bf16
  // precision came from updates that bf16 weights would have rounded away (all of them here).
  CHECK(moved == elements);
  CHECK(finer_than_bf16 == elements);
}

TEST_CASE("the bf16 loss curve stays within 0.01 nats of the fp32 curve over 200 steps",
          "[train][mixed_precision][learning]") {
  const quintet::markov_source source({.vocab = 16, .order = 1, .successors = 3, .seed = 7});
  const training_options options{.steps = 200,
                                 .batch = 8,
                                 .seq = 16,
                                 .micro_batches = 2,
                                 .lr = 1e-2,
                                 .min_lr = 1e-3,
                                 .warmup_steps = 10,
                                 .seed = 7};
  trainer<float, quintet::markov_source> f32_run(source, small_model, options, exec);
  bf16_trainer bf16_run(source, small_model, options, exec);
  const auto f32 = losses_of(f32_run, options.steps);
  const auto low = losses_of(bf16_run, options.steps);
  // Means over windows of 20 steps: batch noise is common to both (the same batches), the
  // difference is the arithmetic's.
  double worst = 0.0;
  for (std::int64_t w = 0; w < options.steps / 20; ++w) {
    double a = 0, b = 0;
    for (std::int64_t s = w * 20; s < (w + 1) * 20; ++s) {
      a += f32[static_cast<std::size_t>(s)] / 20;
      b += low[static_cast<std::size_t>(s)] / 20;
    }
    worst = std::max(worst, std::abs(a - b));
  }
  const double floor = *source.entropy_floor(options.seq);
  double last = 0;
  for (std::int64_t s = 180; s < 200; ++s) last += low[static_cast<std::size_t>(s)] / 20;
  INFO("worst window difference " << worst << " nats; bf16 mean of the last 20 steps " << last
                                  << ", floor " << floor << ", first loss " << low.front());
  CHECK(worst < 0.01);  // seen: 7.1e-4
  CHECK(last < floor + 0.1);
  CHECK(low.front() > floor + 1.0);
}

namespace {

using quintet::test::bf16_parity;
using quintet::test::bf16_within_adamw_bound;

using dp_tp_plan = quintet::plan<par::dp<par::zero<par::runtime_stage>>, par::tp<par::megatron_1d>>;

}  // namespace

TEST_CASE("bf16 under data parallelism gives the bf16 serial run",
          "[train][mixed_precision][parity]") {
  // Each micro-batch's bf16 gradient is the serial run's (the same rows, the same weights) and
  // their fp32 sum over two ranks is the serial run's over two micro-batches: ZeRO-0 is the same
  // bits. ZeRO-1 and 2 take the norm over shards (another order of the fp32 sum): a few ulp.
  const quintet::train::parity_tolerance exact{
      .loss_relative = 0.0, .parameter_relative = 0.0, .parameter_absolute = 0.0};
  for (const int zero : {0, 1, 2}) {
    const auto report = bf16_parity<dp_tp_plan>(
        {.dp = 2}, zero, zero == 0 ? exact : quintet::train::parity_tolerance{}, small_model);
    INFO("ZeRO-" << zero << "\n" << report.summary());
    CHECK(report.passed);
  }
}

TEST_CASE("a bf16 mixture-of-experts model under data parallelism gives the bf16 serial run",
          "[train][mixed_precision][parity][moe]") {
  // Every rank holds every expert (no ep); the grouped products and the routing run in bf16.
  const quintet::nn::gpt_config moe = quintet::test::bf16_moe_model(small_model);
  const quintet::train::parity_tolerance exact{
      .loss_relative = 0.0, .parameter_relative = 0.0, .parameter_absolute = 0.0};
  const auto report = bf16_parity<dp_tp_plan>({.dp = 2}, 0, exact, moe);
  INFO(report.summary());
  CHECK(report.passed);
}

TEST_CASE("bf16 under dp 2 x tp 2 gives the bf16 serial losses",
          "[train][mixed_precision][parity]") {
  // Tensor parallelism sums partial products in another order; in bf16 an fp32 sum a few ulp off
  // rounds to the neighbouring bf16 value now and then (2^-8 relative), and AdamW's first steps
  // are sign descent, so an element whose gradient is rounding noise moves by +-lr either way:
  // parameters differ by up to lr x steps in elements like the key bias, whose exact gradient is
  // zero. The loss is the sharp test: within 2e-4 relative per step (seen: 3e-6 to 2.3e-5), where
  // a missing or doubled sum moves it by far more.
  for (const int zero : {0, 1}) {
    const auto report =
        bf16_parity<dp_tp_plan>({.dp = 2, .tp = 2}, zero, bf16_within_adamw_bound, small_model);
    INFO("ZeRO-" << zero << "\n" << report.summary());
    REQUIRE(report.loss_relative.size() == 5);
    for (const double relative : report.loss_relative) CHECK(relative < 2e-4);
    CHECK(report.passed);
  }
}

TEST_CASE("bf16 under Ulysses sequence parallelism gives the bf16 serial losses",
          "[train][mixed_precision][parity]") {
  // Each rank holds half the sequence; the all-to-all gives it half the heads over the whole
  // sequence for the attention. The sp ranks' partial gradients are summed on the fp32 master
  // (synchronize_gradients), once per step.
  using ulysses_plan = quintet::plan<par::sp<par::ulysses>>;
  const auto report =
      bf16_parity<ulysses_plan>({.sp = 2}, -1, bf16_within_adamw_bound, small_model);
  INFO(report.summary());
  REQUIRE(report.loss_relative.size() == 5);
  for (const double relative : report.loss_relative) CHECK(relative < 2e-4);
  CHECK(report.passed);
}

TEST_CASE("bf16 under ZeRO-3 gives the bf16 serial run", "[train][mixed_precision][parity]") {
  // The model's pieces take the gathered master values rounded (what write_back gives without
  // ZeRO-3) and each micro-batch's bf16 gradient is widened into a gathered fp32 buffer that is
  // reduce-scattered into the shard: the serial run's sums in another order (the sharded norm,
  // the shard's sum over micro-batches), within the fp32 tolerances. Buckets of 500 elements cut
  // the pieces into several (the model's and the master's buckets are padded alike but hold
  // 2- and 4-byte elements).
  for (const std::int64_t micro_batches : {1, 2})
    for (const std::int64_t bucket_elements : {0, 500}) {
      auto options = quintet::test::bf16_parity_training();
      options.micro_batches = micro_batches;
      options.bucket_elements = bucket_elements;
      const auto report = bf16_parity<dp_tp_plan>({.dp = 2}, 3, quintet::train::parity_tolerance{},
                                                  small_model, options);
      INFO(micro_batches << " micro-batches, buckets of " << bucket_elements << "\n"
                         << report.summary());
      CHECK(report.passed);
    }
  SECTION("dp 2 x tp 2") {
    const auto report =
        bf16_parity<dp_tp_plan>({.dp = 2, .tp = 2}, 3, bf16_within_adamw_bound, small_model);
    INFO(report.summary());
    CHECK(report.passed);
  }
}

TEST_CASE("bf16 under ZeRO-3 holds fp32 shards only between steps, the model's buffers per use",
          "[train][mixed_precision][memory]") {
  const quintet::markov_source source({.vocab = 16, .order = 1, .successors = 3, .seed = 1});
  constexpr int dp = 2;
  // What each rank saw (Catch's assertions stay on the test's thread).
  struct observed {
    bool model_empty_between_steps = false, model_empty_after_reading = false;
    bool model_is_master_rounded = false, next_step_finite = false;
    std::int64_t held_bytes = 0, flat_elements = 0, peak_gathered = 0;
  };
  std::vector<observed> ranks(dp);
  const auto model_empty = [](auto& registry) {
    for (const auto& bucket : registry.buckets())
      if (bucket.values.data() != nullptr || bucket.grads.data() != nullptr) return false;
    return true;
  };
  quintet::thread_world{dp}.run([&](quintet::thread_comm& world) {
    quintet::device_mesh<quintet::thread_comm> mesh(world, {.dp = dp});
    training_options options{
        .steps = 3, .batch = 4, .seq = 16, .micro_batches = 2, .warmup_steps = 0};
    options.zero_stage = 3;
    trainer<bf16, quintet::markov_source, dp_tp_plan, quintet::device_mesh<quintet::thread_comm>>
        run(source, small_model, options, exec, &mesh);
    losses_of(run, 2);
    observed& mine = ranks[static_cast<std::size_t>(world.rank())];
    mine.model_empty_between_steps = model_empty(run.model_parameters());
    for (const auto& bucket : run.parameters().buckets())
      mine.flat_elements += run.parameters().flat_elements(bucket);
    const auto memory = run.data_parallel().memory();
    mine.held_bytes = memory.total();
    mine.peak_gathered = memory.peak_gathered;
    {
      const auto whole = run.whole_parameters();
      mine.model_is_master_rounded = true;
      auto model = run.model_parameters().begin();
      for (const auto& master : run.parameters()) {
        if (model->value.numel() != master.value.numel()) mine.model_is_master_rounded = false;
        for (std::int64_t i = 0; i < master.value.numel() && mine.model_is_master_rounded; ++i)
          mine.model_is_master_rounded =
              model->value.data()[i].bits == bf16(master.value.data()[i]).bits;
        ++model;
      }
    }
    mine.model_empty_after_reading = model_empty(run.model_parameters());
    mine.next_step_finite = std::isfinite(run.train_step().loss);
  });
  for (const observed& rank : ranks) {
    // Between steps: no buffer of the bf16 model; the master's shards are 16 / dp bytes per
    // element of its flat buffers (values, gradients, two moments, all fp32).
    CHECK(rank.model_empty_between_steps);
    CHECK(rank.held_bytes == 16 * rank.flat_elements / dp);
    CHECK(rank.peak_gathered > 0);
    // Gathered for reading, the model holds the master's values rounded, bit for bit; dropped
    // again after, and the next step trains from there.
    CHECK(rank.model_is_master_rounded);
    CHECK(rank.model_empty_after_reading);
    CHECK(rank.next_step_finite);
  }
}

TEST_CASE("master_weights sums each micro-batch's bf16 gradient in fp32 and rounds values back",
          "[train][mixed_precision]") {
  quintet::nn::parameter_registry<bf16, host> model(5);
  auto& w = model.add("w", quintet::shape{4, 3}, quintet::nn::initializer::normal(0.5));
  auto& b = model.add("b", quintet::shape{3}, quintet::nn::initializer::constant(0.25));
  quintet::optim::master_weights<bf16, host> master(model, exec);
  auto& mw = master.registry().find("w");
  const auto set_grad = [&](double scale) {
    for (std::int64_t i = 0; i < w.grad.numel(); ++i)
      w.grad.data()[i] = bf16(static_cast<float>(scale * (static_cast<double>(i) - 5.3)));
  };
  quintet::nn::parameter<bf16, host>* const only_w[] = {&w};
  quintet::nn::parameter<bf16, host>* const both[] = {&w, &b};

  SECTION("outside a step an announcement touches nothing") {
    set_grad(1.0);
    CHECK(master.accumulate(only_w).empty());
    CHECK(static_cast<float>(w.grad.data()[0]) != 0.0f);
    CHECK(mw.grad.data()[0] == 0.0f);
  }
  SECTION("two micro-batches: the widened gradients summed in fp32, the model's zeroed") {
    master.begin_step();
    set_grad(1.0);
    std::vector<float> first(w.grad.data(), w.grad.data() + w.grad.numel());
    REQUIRE(master.accumulate(both).size() == 2);
    set_grad(1e-3);  // small against the first: the fp32 sum keeps bits a bf16 sum would drop
    std::vector<float> second(w.grad.data(), w.grad.data() + w.grad.numel());
    master.accumulate(both);
    for (std::int64_t i = 0; i < w.grad.numel(); ++i) {
      const auto j = static_cast<std::size_t>(i);
      CHECK(mw.grad.data()[i] == first[j] + second[j]);
      CHECK(w.grad.data()[i].bits == bf16(0.0f).bits);
    }
    master.finish_backward(2);
  }
  SECTION("a gradient accumulated too often, never or twice in one set is an error naming it") {
    master.begin_step();
    master.accumulate(both);
    master.accumulate(only_w);
    REQUIRE_THROWS_WITH(master.finish_backward(1),
                        Catch::Contains("parameter 'w' had 2 micro-batch gradients accumulated "
                                        "in a step of 1"));
    master.begin_step();
    master.accumulate(only_w);
    REQUIRE_THROWS_WITH(master.finish_backward(1), Catch::Contains("parameter 'b' had 0"));
    quintet::nn::parameter_registry<bf16, host> other(5);
    auto& stranger = other.add("w", quintet::shape{4, 3}, quintet::nn::initializer::normal(0.5));
    quintet::nn::parameter<bf16, host>* const foreign[] = {&stranger};
    master.begin_step();
    REQUIRE_THROWS_WITH(master.accumulate(foreign),
                        Catch::Contains("parameter 'w' is not one of the model's"));
    // A set naming w twice is refused before anything is counted: w's one announcement after it
    // makes a complete step.
    quintet::nn::parameter<bf16, host>* const w_twice[] = {&w, &b, &w};
    master.begin_step();
    REQUIRE_THROWS_WITH(master.accumulate(w_twice),
                        Catch::Contains("parameter 'w' is announced twice in one set"));
    master.accumulate(both);
    master.finish_backward(1);
  }
  SECTION("write_back rounds the master values to nearest even") {
    for (std::int64_t i = 0; i < mw.value.numel(); ++i)
      mw.value.data()[i] = 1.0f + static_cast<float>(i) * 0x1.0p-10f;  // between bf16 values
    master.write_back();
    for (std::int64_t i = 0; i < mw.value.numel(); ++i)
      CHECK(w.value.data()[i].bits == bf16(mw.value.data()[i]).bits);
  }
}

namespace {

const quintet::markov_source checkpoint_source(
    {.vocab = 16, .order = 1, .successors = 3, .seed = 4});
const training_options checkpoint_options{
    .steps = 6, .batch = 4, .seq = 16, .micro_batches = 2, .lr = 3e-3, .warmup_steps = 1};

}  // namespace

TEST_CASE("a bf16 run saved and resumed continues bit for bit, and resumes an fp32 checkpoint",
          "[train][mixed_precision][checkpoint]") {
  namespace ckpt = quintet::checkpoint;
  quintet::test::temp_directory stopped;
  bf16_trainer straight(checkpoint_source, small_model, checkpoint_options, exec);
  const auto all = losses_of(straight, checkpoint_options.steps);
  {
    bf16_trainer first(checkpoint_source, small_model, checkpoint_options, exec);
    losses_of(first, 3);
    quintet::train::save_checkpoint(first, ckpt::checkpoint_directory(stopped.path()));
  }
  bf16_trainer resumed(checkpoint_source, small_model, checkpoint_options, exec);
  quintet::train::load_checkpoint(resumed,
                                  ckpt::checkpoint_directory(stopped.path()).open_latest());
  // The model is the restored master, rounded.
  auto model = resumed.model_parameters().begin();
  for (const auto& p : resumed.parameters()) {
    for (std::int64_t i = 0; i < p.value.numel(); ++i)
      REQUIRE(model->value.data()[i].bits == bf16(p.value.data()[i]).bits);
    ++model;
  }
  const auto rest = losses_of(resumed, checkpoint_options.steps - 3);
  REQUIRE(rest == std::vector<double>(all.begin() + 3, all.end()));

  // An fp32 run's checkpoint: its values become the master weights, bit for bit.
  quintet::test::temp_directory fp32_dir;
  trainer<float, quintet::markov_source> fp32_run(checkpoint_source, small_model,
                                                  checkpoint_options, exec);
  losses_of(fp32_run, 3);
  quintet::train::save_checkpoint(fp32_run, ckpt::checkpoint_directory(fp32_dir.path()));
  bf16_trainer from_fp32(checkpoint_source, small_model, checkpoint_options, exec);
  quintet::train::load_checkpoint(from_fp32,
                                  ckpt::checkpoint_directory(fp32_dir.path()).open_latest());
  auto fp32_value = fp32_run.parameters().begin();
  for (const auto& p : from_fp32.parameters()) {
    REQUIRE(std::memcmp(p.value.data(), fp32_value->value.data(),
                        static_cast<std::size_t>(p.value.numel()) * sizeof(float)) == 0);
    ++fp32_value;
  }
  CHECK(from_fp32.next_step() == 3);
  CHECK(std::isfinite(from_fp32.train_step().loss));
}
