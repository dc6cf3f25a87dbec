// The training loop: it learns (the loss reaches the entropy floor of a small Markov source), it is
// deterministic, splitting the batch into micro-batches does not change the step, and a loss that
// stops being a number stops training with an error naming the step. Under tensor and sequence
// parallel plans (thread ranks) the trainer gives the serial trainer's losses step by step.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

using quintet::host;
using quintet::train::trainer;
using quintet::train::training_options;

namespace {

const quintet::execution<host> exec;

const quintet::nn::gpt_config tiny_model{
    .vocab = 8, .max_seq = 16, .layers = 1, .d_model = 16, .heads = 2};

}  // namespace

TEST_CASE("a short run comes within 0.1 nats of the entropy floor", "[train][learning]") {
  // Order 1, 8 tokens, 2 successors each: the floor is at most log 2 = 0.69 nats and the
  // initial loss is log 8 = 2.08, so the model has ~1.4 nats to learn in a few seconds.
  const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 2, .seed = 5});
  const training_options options{.steps = 150,
                                 .batch = 8,
                                 .seq = 16,
                                 .lr = 1e-2,
                                 .min_lr = 1e-3,
                                 .warmup_steps = 10,
                                 .seed = 5};
  trainer<float, quintet::markov_source> run(source, tiny_model, options, exec);
  std::vector<double> losses;
  for (int s = 0; s < options.steps; ++s) losses.push_back(run.train_step().loss);
  const double floor = *source.entropy_floor(options.seq);
  double last = 0;
  for (int s = 130; s < 150; ++s) last += losses[s] / 20;
  INFO("floor " << floor << ", first loss " << losses.front() << ", mean of the last 20 " << last);
  CHECK(losses.front() > floor + 1.0);
  CHECK(last < floor + 0.1);
  CHECK(last > floor - 0.1);  // no model beats the floor by more than batch noise
}

TEST_CASE("the same seed gives bit-identical losses", "[train][determinism]") {
  const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 2, .seed = 9});
  const training_options options{.steps = 6, .batch = 4, .seq = 8, .warmup_steps = 2, .seed = 9};
  trainer<float, quintet::markov_source> first(source, tiny_model, options, exec);
  trainer<float, quintet::markov_source> second(source, tiny_model, options, exec);
  for (int s = 0; s < options.steps; ++s) {
    const double a = first.train_step().loss, b = second.train_step().loss;
    REQUIRE(a == b);
  }
  training_options other_seed = options;
  other_seed.seed = 10;
  trainer<float, quintet::markov_source> third(source, tiny_model, other_seed, exec);
  CHECK(
      third.train_step().loss !=
      trainer<float, quintet::markov_source>(source, tiny_model, options, exec).train_step().loss);
}

TEST_CASE("micro-batches accumulate to the same step as the whole batch",
          "[train][micro_batches]") {
  const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 3, .seed = 2});
  training_options whole{.steps = 4, .batch = 8, .seq = 8, .warmup_steps = 1, .seed = 2};
  training_options split = whole;
  split.micro_batches = 4;
  trainer<double, quintet::markov_source> a(source, tiny_model, whole, exec);
  trainer<double, quintet::markov_source> b(source, tiny_model, split, exec);
  for (int s = 0; s < whole.steps; ++s) {
    const auto ma = a.train_step(), mb = b.train_step();
    REQUIRE(ma.loss == Approx(mb.loss).epsilon(1e-12));
    REQUIRE(ma.gradient_norm == Approx(mb.gradient_norm).epsilon(1e-10));
  }
  auto pa = a.parameters().begin();
  for (auto& pb : b.parameters()) {
    for (std::int64_t i = 0; i < pb.value.numel(); ++i)
      REQUIRE(pb.value.data()[i] == Approx(pa->value.data()[i]).epsilon(1e-9).margin(1e-12));
    ++pa;
  }
}

TEST_CASE("a non-finite loss stops training with an error naming the step", "[train][nan]") {
  const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 2, .seed = 1});
  trainer<float, quintet::markov_source> run(
      source, tiny_model, {.steps = 5, .batch = 2, .seq = 4, .warmup_steps = 1}, exec);
  run.train_step();
  run.train_step();
  run.parameters().find("final_norm.weight").value.data()[0] =
      std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(run.train_step(),
                      Catch::Contains("training stopped at step 2: the loss is nan"));
}

TEST_CASE("bad training configurations are rejected naming the values", "[train]") {
  const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 2, .seed = 1});
  using run = trainer<float, quintet::markov_source>;
  REQUIRE_THROWS_WITH(
      run(source, tiny_model, {.batch = 6, .micro_batches = 4}, exec),
      Catch::Contains("a batch of 6 sequences does not split into 4 micro-batches"));
  REQUIRE_THROWS_WITH(
      run(source, tiny_model, {.seq = 32}, exec),
      Catch::Contains("sequence length 32 exceeds the model's position table (16)"));
  REQUIRE_THROWS_WITH(run(source, tiny_model, {.seq = 8, .clip_norm = std::nan("")}, exec),
                      Catch::Contains("the clip norm nan is not a number"));
  quintet::nn::gpt_config small_vocab = tiny_model;
  small_vocab.vocab = 4;
  REQUIRE_THROWS_WITH(run(source, small_vocab, {.seq = 8}, exec),
                      Catch::Contains("model's vocabulary (4) is smaller than the data's (8)"));
}

namespace {

// A source whose rows end in 0, 1 or 2 padding targets (row r: r % 3 of them), so micro-batches of
// one step hold different numbers of targets that count.
struct padded_source {
  quintet::markov_source inner{{.vocab = 8, .order = 1, .successors = 2, .seed = 1}};
  std::int64_t vocab_size() const { return inner.vocab_size(); }
  std::optional<double> entropy_floor(std::int64_t seq) const { return inner.entropy_floor(seq); }
  quintet::token_batch batch(std::int64_t step, quintet::row_range rows, std::int64_t seq) const {
    quintet::token_batch b = inner.batch(step, rows, seq);
    for (std::int64_t r = 0; r < rows.size(); ++r)
      for (std::int64_t t = seq - (rows.begin + r) % 3; t < seq; ++t)
        b.targets(r, t) = quintet::kernels::no_target;
    return b;
  }
};

}  // namespace

TEST_CASE("padding targets: the step's mean runs over the targets that count", "[train]") {
  const padded_source source;
  const training_options one{.steps = 3, .batch = 6, .seq = 4, .warmup_steps = 0};
  training_options three = one;
  three.micro_batches = 3;  // rows 0-1, 2-3, 4-5: 7, 6 and 5 targets that count
  trainer<float, padded_source> whole(source, tiny_model, one, exec);
  trainer<float, padded_source> split(source, tiny_model, three, exec);

  // Step 0's loss is the mean over the counted targets of the whole batch.
  quintet::nn::parameter_registry<float, host> registry(one.seed);
  quintet::nn::gpt<float, host> model(registry, exec, tiny_model);
  const auto batch = source.batch(0, {0, 6}, 4);
  quintet::nn::context<host> ctx;
  const auto expected = model.forward(ctx, batch.inputs.view(), batch.targets.view());
  REQUIRE(expected.count == 24 - (0 + 1 + 2 + 0 + 1 + 2));
  // ... and its gradient is that of the mean over them (scaling by all 24 positions would shrink
  // it by 18/24, which AdamW would hide from the losses).
  model.backward(ctx, 1.0 / static_cast<double>(expected.count));
  const double expected_norm = quintet::optim::global_gradient_norm(exec, registry);
  const auto first = whole.train_step(), first_split = split.train_step();
  REQUIRE(first.loss == Approx(expected.mean()).epsilon(1e-12));
  REQUIRE(first.gradient_norm == Approx(expected_norm).epsilon(1e-12));
  CHECK(first_split.loss == Approx(expected.mean()).epsilon(1e-6));
  CHECK(first_split.gradient_norm == Approx(expected_norm).epsilon(1e-5));
  // Scaling each micro-batch by its own count would weight them unequally and part the runs.
  for (int step = 1; step < 3; ++step) {
    INFO("step " << step);
    CHECK(split.train_step().loss == Approx(whole.train_step().loss).epsilon(1e-5));
  }
}

namespace {

namespace par = quintet::parallel;
using ring_plan = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::ring>>;
using ulysses_plan = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::ulysses>>;
using megatron_sp_plan =
    quintet::plan<par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;

// Two micro-batches, so the gradients sequence parallelism leaves partial are summed after both
// backwards (once per step); clipping on, so the norm of the summed gradient decides the step.
const quintet::markov_source parity_source({.vocab = 8, .order = 1, .successors = 3, .seed = 4});
const training_options parity_options{.steps = 4,
                                      .batch = 4,
                                      .seq = 16,
                                      .micro_batches = 2,
                                      .lr = 1e-2,
                                      .warmup_steps = 1,
                                      .clip_norm = 0.5,
                                      .seed = 4};

std::vector<quintet::train::step_metrics> serial_metrics() {
  trainer<float, quintet::markov_source> run(parity_source, tiny_model, parity_options, exec);
  std::vector<quintet::train::step_metrics> out;
  for (int s = 0; s < parity_options.steps; ++s) out.push_back(run.train_step());
  return out;
}

// Every rank's metrics of a run of `Plan` over a mesh of `degrees` of thread ranks.
template <class Plan>
std::vector<std::vector<quintet::train::step_metrics>> parallel_metrics(
    quintet::mesh_degrees degrees) {
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  const int world_size = degrees.tp * degrees.sp;
  std::vector<std::vector<quintet::train::step_metrics>> per_rank(world_size);
  quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> rank_exec(1);
    mesh_type mesh(world, degrees);
    trainer<float, quintet::markov_source, Plan, mesh_type> run(parity_source, tiny_model,
                                                                parity_options, rank_exec, &mesh);
    for (int s = 0; s < parity_options.steps; ++s)
      per_rank[world.rank()].push_back(run.train_step());
  });
  return per_rank;
}

// The plans change only the order of fp32 sums (partial gradients summed over ranks, attention
// merged over key blocks), so every rank's loss and gradient norm stay within ~1e-5 relative of
// the serial run over a few steps; a missing or doubled gradient sum is off by far more.
template <class Plan>
void require_trainer_matches_serial(quintet::mesh_degrees degrees) {
  const auto serial = serial_metrics();
  const auto ranks = parallel_metrics<Plan>(degrees);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (int s = 0; s < parity_options.steps; ++s) {
      INFO("rank " << r << ", step " << s);
      REQUIRE(ranks[r][s].loss == Approx(serial[s].loss).epsilon(1e-5));
      REQUIRE(ranks[r][s].gradient_norm == Approx(serial[s].gradient_norm).epsilon(1e-4));
      REQUIRE(ranks[r][s].tokens == serial[s].tokens);
    }
  }
}

}  // namespace

TEST_CASE("the trainer under sequence parallel plans gives the serial losses",
          "[train][parallel][sequence]") {
  SECTION("ring attention, sp = 2") { require_trainer_matches_serial<ring_plan>({.sp = 2}); }
  SECTION("Ulysses, sp = 2") { require_trainer_matches_serial<ulysses_plan>({.sp = 2}); }
  SECTION("Megatron-SP, tp = 2") { require_trainer_matches_serial<megatron_sp_plan>({.tp = 2}); }
  SECTION("ring attention with tensor parallelism, tp = 2, sp = 2") {
    require_trainer_matches_serial<ring_plan>({.tp = 2, .sp = 2});
  }
}

TEST_CASE("the trainer refuses a mesh its plan does not use, naming the degree", "[train]") {
  using tensor_plan = quintet::plan<par::tp<par::megatron_1d>>;
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 2, .seed = 1});
  std::vector<std::string> errors(2);
  quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    mesh_type mesh(world, {.sp = 2});
    try {
      trainer<float, quintet::markov_source, tensor_plan, mesh_type> run(source, tiny_model,
                                                                         {.seq = 8}, exec, &mesh);
    } catch (const quintet::error& e) {
      errors[world.rank()] = e.what();
    }
  });
  for (const auto& e : errors)
    CHECK_THAT(e, Catch::Contains("the mesh has sp = 2 but the plan has no policy on the sp axis"));
}
