// Checkpoints of the trainer under plans: a run stopped, saved and resumed continues bit for bit;
// a checkpoint saved under one plan loads under another (each rank reads the overlapping shards)
// and, saved again at once, is the same checkpoint tensor for tensor, bit for bit; training then
// continues within the parity tolerance of the run that wrote it.
#include <catch2/catch.hpp>

#include "../checkpoint/temp_directory.hpp"
#include "../parallel/gpt_parity.hpp"

#include <quintet/comm/thread_comm.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/train/checkpointing.hpp>

#include <cmath>
#include <vector>

using quintet::host;

namespace {

using namespace quintet::test;
namespace train = quintet::train;
namespace ckpt = quintet::checkpoint;

template <int Stage>
using dp_plan = quintet::plan<par::dp<par::zero<Stage>>>;
using pp_plan = quintet::plan<par::dp<par::zero<0>>, par::pp<par::named_schedule>>;

// 6 steps of a global batch of 8 in 2 micro-batches (dp 4 keeps a row per micro-batch).
train::training_options options() {
  train::training_options out = training;
  out.steps = 6;
  out.batch = 8;
  out.micro_batches = 2;
  out.pipeline.schedule = "1f1b";
  return out;
}

// Rank 0's losses of a run of `Plan` over thread ranks of `degrees` (none: the serial model):
// `resume` (if not empty) loaded first, then steps up to `save_at` (saved into `save` if not
// empty), then the rest of the run's steps.
struct run_spec {
  std::filesystem::path resume{};
  std::filesystem::path save{};
  std::int64_t save_at = -1;
};

template <class Plan>
std::vector<double> run(quintet::mesh_degrees degrees, const run_spec& spec) {
  std::vector<double> losses;
  const auto body = [&](auto& trainer, bool first) {
    if (!spec.resume.empty())
      train::load_checkpoint(trainer, ckpt::checkpoint_directory(spec.resume).open_latest());
    std::vector<double> mine;
    while (trainer.next_step() < trainer.options().steps) {
      if (trainer.next_step() == spec.save_at)
        train::save_checkpoint(trainer, ckpt::checkpoint_directory(spec.save));
      mine.push_back(trainer.train_step().loss);
    }
    if (spec.save_at == trainer.options().steps)
      train::save_checkpoint(trainer, ckpt::checkpoint_directory(spec.save));
    if (first) losses = mine;
  };
  const quintet::execution<host> exec(1);
  if constexpr (std::is_same_v<Plan, quintet::serial_plan>) {
    train::trainer<float, quintet::markov_source> trainer(source, config, options(), exec);
    body(trainer, true);
  } else {
    const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
    quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
      const quintet::execution<host> rank_exec(1);
      using mesh_type = quintet::device_mesh<quintet::thread_comm>;
      mesh_type mesh(comm, degrees);
      train::trainer<float, quintet::markov_source, Plan, mesh_type> trainer(
          source, config, options(), rank_exec, &mesh);
      body(trainer, comm.rank() == 0);
    });
  }
  return losses;
}

// Every tensor of the two latest checkpoints, read whole: the same names, shapes and bits.
void require_same_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto first = ckpt::checkpoint_directory(a).open_latest();
  const auto second = ckpt::checkpoint_directory(b).open_latest();
  REQUIRE(first.index().tensors().size() == second.index().tensors().size());
  std::int64_t moments = 0;
  for (const auto& [name, tensor] : first.index().tensors()) {
    INFO("tensor " << name);
    const auto& other = second.index().tensor(name, tensor.shape);
    const ckpt::box whole = ckpt::box::whole(tensor.shape);
    const auto x = first.read<float>(name, whole);
    const auto y = second.read<float>(name, ckpt::box::whole(other.shape));
    REQUIRE(x == y);
    if (name.ends_with(train::second_moment_suffix)) {
      ++moments;
      // A moment that is all zeros would compare equal however it was (not) restored.
      double sum = 0;
      for (const float v : x) sum += v;
      REQUIRE(sum > 0);
    }
  }
  REQUIRE(moments > 0);
}

void require_close(const std::vector<double>& expected, const std::vector<double>& actual) {
  REQUIRE(expected.size() == actual.size());
  for (std::size_t s = 0; s < expected.size(); ++s)
    CHECK(actual[s] == Approx(expected[s]).epsilon(1e-5));
}

}  // namespace

TEST_CASE("a run saved and resumed continues bit for bit", "[parity][checkpoint]") {
  const auto check = [](auto plan, quintet::mesh_degrees degrees) {
    using Plan = typename decltype(plan)::type;
    temp_directory straight_dir, stopped_dir, resumed_dir;
    const auto straight = run<Plan>(degrees, {.save = straight_dir.path(), .save_at = 6});
    run<Plan>(degrees, {.save = stopped_dir.path(), .save_at = 3});
    const auto resumed = run<Plan>(
        degrees, {.resume = stopped_dir.path(), .save = resumed_dir.path(), .save_at = 6});
    REQUIRE(straight.size() == 6);
    REQUIRE(resumed == std::vector<double>(straight.begin() + 3, straight.end()));
    require_same_checkpoints(straight_dir.path(), resumed_dir.path());
  };
  SECTION("serial") { check(std::type_identity<quintet::serial_plan>{}, {}); }
  SECTION("dp 2, ZeRO-3") { check(std::type_identity<dp_plan<3>>{}, {.dp = 2}); }
  SECTION("tp 2") { check(std::type_identity<tp_plan>{}, {.tp = 2}); }
  SECTION("dp 2 x pp 2 (1f1b)") { check(std::type_identity<pp_plan>{}, {.dp = 2, .pp = 2}); }
}

namespace {

// Saved under A after 3 steps, loaded under B and saved again at once: the same checkpoint; the
// steps after it under B within the parity tolerance of A's.
template <class A, class B>
void check_reshard(quintet::mesh_degrees a, quintet::mesh_degrees b) {
  temp_directory saved, resaved;
  const auto under_a = run<A>(a, {.save = saved.path(), .save_at = 3});
  const auto under_b = run<B>(b, {.resume = saved.path(), .save = resaved.path(), .save_at = 3});
  require_same_checkpoints(saved.path(), resaved.path());
  require_close(std::vector<double>(under_a.begin() + 3, under_a.end()), under_b);
}

}  // namespace

TEST_CASE("a checkpoint saved under one plan loads under another", "[parity][checkpoint]") {
  SECTION("tp 2 -> dp 2 ZeRO-3, and back") {
    check_reshard<tp_plan, dp_plan<3>>({.tp = 2}, {.dp = 2});
    check_reshard<dp_plan<3>, tp_plan>({.dp = 2}, {.tp = 2});
  }
  SECTION("dp 4 ZeRO-1 -> dp 2 ZeRO-1, and back") {
    check_reshard<dp_plan<1>, dp_plan<1>>({.dp = 4}, {.dp = 2});
    check_reshard<dp_plan<1>, dp_plan<1>>({.dp = 2}, {.dp = 4});
  }
  SECTION("serial -> ring sp 2, and back") {
    check_reshard<quintet::serial_plan, ring_plan>({}, {.sp = 2});
    check_reshard<ring_plan, quintet::serial_plan>({.sp = 2}, {});
  }
  SECTION("dp 2 x pp 2 -> dp 4 ZeRO-3, and back") {
    check_reshard<pp_plan, dp_plan<3>>({.dp = 2, .pp = 2}, {.dp = 4});
    check_reshard<dp_plan<3>, pp_plan>({.dp = 4}, {.dp = 2, .pp = 2});
  }
  SECTION("Megatron-SP tp 2 x dp 2 ZeRO-2 -> serial") {
    using msp =
        quintet::plan<par::dp<par::zero<2>>, par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
    check_reshard<msp, quintet::serial_plan>({.dp = 2, .tp = 2}, {});
  }
}

TEST_CASE("a checkpoint of another model is refused, naming the tensor", "[checkpoint]") {
  temp_directory saved;
  run<quintet::serial_plan>({}, {.save = saved.path(), .save_at = 1});
  const quintet::execution<host> exec(1);
  auto wider = config;
  wider.d_model = 24;
  wider.heads = 4;
  train::trainer<float, quintet::markov_source> trainer(source, wider, options(), exec);
  REQUIRE_THROWS_WITH(
      train::load_checkpoint(trainer, ckpt::checkpoint_directory(saved.path()).open_latest()),
      Catch::Contains("embedding.token_weight") && Catch::Contains("shape"));
}
