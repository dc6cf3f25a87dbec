// Checkpoints of the trainer under plans: a run stopped, saved and resumed continues bit for bit;
// a checkpoint saved under one plan loads under another (each rank reads the overlapping shards)
// and, saved again at once, is the same checkpoint tensor for tensor, bit for bit; training then
// continues within the parity tolerance of the run that wrote it. A mixture-of-experts model under
// ep 2 (each rank holding half the experts) saves and loads into the serial MoE model, and back.
#include <catch2/catch.hpp>

#include "../checkpoint/temp_directory.hpp"
#include "../parallel/gpt_parity.hpp"

#include <quintet/checkpoint/plain_export.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/train/checkpointing.hpp>
#include <quintet/train/parity.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using quintet::host;

namespace {

using namespace quintet::test;
namespace train = quintet::train;
namespace ckpt = quintet::checkpoint;

template <int Stage>
using dp_plan = quintet::plan<par::dp<par::zero<Stage>>>;
using pp_plan = quintet::plan<par::dp<par::zero<0>>, par::pp<par::named_schedule>>;
using zero3_pp_plan = quintet::plan<par::dp<par::zero<3>>, par::pp<par::named_schedule>>;
using tp_pp_plan =
    quintet::plan<par::dp<par::zero<0>>, par::tp<par::megatron_1d>, par::pp<par::named_schedule>>;
using ep_plan = quintet::plan<par::dp<par::zero<0>>, par::ep<par::top_k<2>>>;
template <int Stage>
using ep_zero_plan = quintet::plan<par::dp<par::zero<Stage>>, par::ep<par::top_k<2>>>;
using tp_ep_plan =
    quintet::plan<par::dp<par::zero<0>>, par::tp<par::megatron_1d>, par::ep<par::top_k<2>>>;

// The parity model with 4 experts (top-2, with drops) in every block.
quintet::nn::gpt_config moe_config() {
  quintet::nn::gpt_config model = config;
  model.experts = 4;
  model.top_k = 2;
  model.moe_every = 1;
  model.capacity_factor = 1.0;
  return model;
}

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
std::vector<double> run(quintet::mesh_degrees degrees, const run_spec& spec,
                        const quintet::nn::gpt_config& model = config) {
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
    train::trainer<float, quintet::markov_source> trainer(source, model, options(), exec);
    body(trainer, true);
  } else {
    const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
    quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
      const quintet::execution<host> rank_exec(1);
      using mesh_type = quintet::device_mesh<quintet::thread_comm>;
      mesh_type mesh(comm, degrees);
      train::trainer<float, quintet::markov_source, Plan, mesh_type> trainer(
          source, model, options(), rank_exec, &mesh);
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
  const auto check = [](auto plan, quintet::mesh_degrees degrees,
                        const quintet::nn::gpt_config& model = config) {
    using Plan = typename decltype(plan)::type;
    temp_directory straight_dir, stopped_dir, resumed_dir;
    const auto straight = run<Plan>(degrees, {.save = straight_dir.path(), .save_at = 6}, model);
    run<Plan>(degrees, {.save = stopped_dir.path(), .save_at = 3}, model);
    const auto resumed = run<Plan>(
        degrees, {.resume = stopped_dir.path(), .save = resumed_dir.path(), .save_at = 6}, model);
    REQUIRE(straight.size() == 6);
    REQUIRE(resumed == std::vector<double>(straight.begin() + 3, straight.end()));
    require_same_checkpoints(straight_dir.path(), resumed_dir.path());
  };
  SECTION("serial") { check(std::type_identity<quintet::serial_plan>{}, {}); }
  SECTION("dp 2, ZeRO-3") { check(std::type_identity<dp_plan<3>>{}, {.dp = 2}); }
  SECTION("tp 2") { check(std::type_identity<tp_plan>{}, {.tp = 2}); }
  SECTION("dp 2 x pp 2 (1f1b)") { check(std::type_identity<pp_plan>{}, {.dp = 2, .pp = 2}); }
  SECTION("dp 2 x pp 2 (1f1b), ZeRO-3") {
    check(std::type_identity<zero3_pp_plan>{}, {.dp = 2, .pp = 2});
  }
  SECTION("MoE, ep 2") { check(std::type_identity<ep_plan>{}, {.dp = 2, .ep = 2}, moe_config()); }
  SECTION("MoE, dp 4 over ep 2, ZeRO-3") {
    check(std::type_identity<ep_zero_plan<3>>{}, {.dp = 4, .ep = 2}, moe_config());
  }
}

namespace {

// Saved under A after 3 steps, loaded under B and saved again at once: the same checkpoint; the
// steps after it under B within the parity tolerance of A's.
// A MoE model's serial run routes in the dp ranks' row blocks (train::serial_model_for), so its
// steps match the parallel run's.
template <class A, class B>
void check_reshard(quintet::mesh_degrees a, quintet::mesh_degrees b,
                   const quintet::nn::gpt_config& model = config) {
  const quintet::mesh_degrees routing = a.dp > 1 ? a : b;  // the serial side routes as the other
  const auto model_of = [&](const quintet::mesh_degrees& degrees) {
    return degrees.dp * degrees.pp * degrees.tp * degrees.sp == 1
               ? train::serial_model_for(model, routing)
               : model;
  };
  temp_directory saved, resaved;
  const auto under_a = run<A>(a, {.save = saved.path(), .save_at = 3}, model_of(a));
  const auto under_b =
      run<B>(b, {.resume = saved.path(), .save = resaved.path(), .save_at = 3}, model_of(b));
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
  SECTION(
      "dp 2 x pp 2 ZeRO-3 (each stage's shards, the tied table's on both ends) -> serial, and "
      "back") {
    check_reshard<zero3_pp_plan, quintet::serial_plan>({.dp = 2, .pp = 2}, {});
    check_reshard<quintet::serial_plan, zero3_pp_plan>({}, {.dp = 2, .pp = 2});
  }
  SECTION("tp 2 x pp 2 -> dp 4 ZeRO-3, and back") {
    check_reshard<tp_pp_plan, dp_plan<3>>({.pp = 2, .tp = 2}, {.dp = 4});
    check_reshard<dp_plan<3>, tp_pp_plan>({.dp = 4}, {.pp = 2, .tp = 2});
  }
  SECTION("MoE: ep 2 (experts split over the ranks) -> serial MoE, and back") {
    check_reshard<ep_plan, quintet::serial_plan>({.dp = 2, .ep = 2}, {}, moe_config());
    check_reshard<quintet::serial_plan, ep_plan>({}, {.dp = 2, .ep = 2}, moe_config());
  }
  SECTION("MoE: dp 4 over ep 2, ZeRO-2 (experts' shards over edp) -> serial MoE, and back") {
    check_reshard<ep_zero_plan<2>, quintet::serial_plan>({.dp = 4, .ep = 2}, {}, moe_config());
    check_reshard<quintet::serial_plan, ep_zero_plan<2>>({}, {.dp = 4, .ep = 2}, moe_config());
  }
  SECTION(
      "MoE: dp 2 over ep 2 x tp 2 (each expert's hidden units split over tp) -> serial, and "
      "back") {
    check_reshard<tp_ep_plan, quintet::serial_plan>({.dp = 2, .tp = 2, .ep = 2}, {}, moe_config());
    check_reshard<quintet::serial_plan, tp_ep_plan>({}, {.dp = 2, .tp = 2, .ep = 2}, moe_config());
  }
  SECTION("Megatron-SP tp 2 x dp 2 ZeRO-2 -> serial") {
    using msp =
        quintet::plan<par::dp<par::zero<2>>, par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
    check_reshard<msp, quintet::serial_plan>({.dp = 2, .tp = 2}, {});
  }
}

TEST_CASE("a checkpoint of another run or format is refused, naming what differs", "[checkpoint]") {
  temp_directory saved;
  run<quintet::serial_plan>({}, {.save = saved.path(), .save_at = 1});
  const quintet::execution<host> exec(1);
  const auto load_into = [&](const quintet::nn::gpt_config& model,
                             const train::training_options& training) {
    train::trainer<float, quintet::markov_source> trainer(source, model, training, exec);
    train::load_checkpoint(trainer, ckpt::checkpoint_directory(saved.path()).open_latest());
  };
  SECTION("a wider model") {
    auto wider = config;
    wider.d_model = 24;
    wider.heads = 4;
    REQUIRE_THROWS_WITH(load_into(wider, options()), Catch::Contains("model.d_model = 16") &&
                                                         Catch::Contains("this run has 24"));
  }
  SECTION("a deeper model (its first blocks' tensors would load)") {
    auto deeper = config;
    deeper.layers = config.layers + 1;
    REQUIRE_THROWS_WITH(load_into(deeper, options()), Catch::Contains("model.layers"));
  }
  SECTION("another schedule: more steps, another seed") {
    auto longer = options();
    longer.steps = 12;
    REQUIRE_THROWS_WITH(load_into(config, longer), Catch::Contains("schedule.steps = 6") &&
                                                       Catch::Contains("this run has 12"));
    auto reseeded = options();
    reseeded.seed += 1;
    REQUIRE_THROWS_WITH(load_into(config, reseeded), Catch::Contains("schedule.seed"));
  }
  SECTION("another format, or a version from the future") {
    // The training state (after the index's own format and version) rewritten in index.json.
    const auto index = ckpt::checkpoint_directory(saved.path()).checkpoint_path(1) / "index.json";
    std::string text;
    {
      std::ifstream in(index);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto rewrite = [&](std::string_view from, std::string_view to) {
      std::string changed = text;
      const auto at = changed.find(from, changed.find("\"state\""));
      REQUIRE(at != std::string::npos);
      changed.replace(at, from.size(), to);
      std::ofstream(index, std::ios::trunc) << changed;
    };
    rewrite("\"quintet.trainer\"", "\"other.trainer\"");
    REQUIRE_THROWS_WITH(load_into(config, options()),
                        Catch::Contains("format 'other.trainer', expected quintet.trainer"));
    rewrite("\"version\": 1", "\"version\": 99");
    REQUIRE_THROWS_WITH(load_into(config, options()),
                        Catch::Contains("trainer state version 99 is newer than this build's 1"));
  }
}

TEST_CASE("a checkpoint exports as one plain safetensors file of the serial model's tensors",
          "[parity][checkpoint]") {
  temp_directory saved, exported;
  run<tp_plan>({.tp = 2}, {.save = saved.path(), .save_at = 2});
  const auto reader = ckpt::checkpoint_directory(saved.path()).open_latest();
  const auto file = exported.path() / "model.safetensors";
  const std::size_t written = ckpt::export_plain(reader, file, [](std::string_view name) {
    return !name.ends_with(train::first_moment_suffix) &&
           !name.ends_with(train::second_moment_suffix);
  });
  const ckpt::safetensors_file plain(file);
  REQUIRE(plain.metadata_value(ckpt::shard_metadata_key) == nullptr);
  // Every parameter of the serial model, whole, under its name and logical shape (the tied table
  // (vocab, d), not tp's padded rows), with the bits the shards hold.
  const quintet::execution<host> exec(1);
  train::trainer<float, quintet::markov_source> serial(source, config, options(), exec);
  REQUIRE(written == serial.parameters().size());
  for (const auto& p : serial.parameters()) {
    INFO(p.name);
    const auto& entry = plain.entry(p.name);
    const auto logical = p.placement.logical_shape(p.global_shape);
    REQUIRE(entry.shape.size() == static_cast<std::size_t>(logical.rank()));
    for (int d = 0; d < logical.rank(); ++d)
      CHECK(entry.shape[static_cast<std::size_t>(d)] == static_cast<std::uint64_t>(logical[d]));
    CHECK(plain.read<float>(p.name) ==
          reader.read<float>(p.name, ckpt::box::whole(reader.index().tensor(p.name).shape)));
  }
}

TEST_CASE("a flat range of a block is cut into boxes contiguous in memory, covering it once",
          "[checkpoint]") {
  // Every range of blocks of rank 1 to 3 (offset inside a larger global tensor, some with padding
  // rows beyond the logical shape): the boxes, walked in memory order from their offsets, visit
  // each element of the range exactly once, at its own global coordinates.
  std::uint64_t seed = 7;
  const auto next = [&](std::int64_t bound) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::int64_t>((seed >> 33) % static_cast<std::uint64_t>(bound));
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + static_cast<int>(next(3));
    std::vector<std::int64_t> global(static_cast<std::size_t>(rank)),
        local(static_cast<std::size_t>(rank)), offsets(static_cast<std::size_t>(rank));
    for (std::size_t d = 0; d < global.size(); ++d) {
      local[d] = 1 + next(5);
      offsets[d] = next(3);
      global[d] = offsets[d] + local[d] + next(2);
    }
    const quintet::shape stored(global);
    std::vector<std::int64_t> logical_extents = global;
    logical_extents[0] -= next(2);  // padding rows
    const quintet::shape logical(logical_extents);
    quintet::region block(stored);
    for (int d = 0; d < rank; ++d)
      block =
          block.slice(d, offsets[static_cast<std::size_t>(d)],
                      offsets[static_cast<std::size_t>(d)] + local[static_cast<std::size_t>(d)]);
    const std::int64_t numel = block.local_shape().numel();
    std::int64_t begin = next(numel + 1), end = next(numel + 1);
    if (begin > end) std::swap(begin, end);
    INFO(fmt::format("trial {}: block {} at {} of {}, range [{}, {})", trial, block.local_shape(),
                     quintet::shape(offsets), stored, begin, end));
    std::vector<int> visits(static_cast<std::size_t>(numel), 0);
    for (const auto& b : train::boxes_of_range(block, logical, {begin, end})) {
      std::int64_t flat = b.offset;
      // Walk the box in row-major order; each element's local coordinates give its flat index.
      const std::uint64_t volume = b.where.volume();
      for (std::uint64_t i = 0; i < volume; ++i, ++flat) {
        std::uint64_t rest = i;
        std::int64_t expected = 0;
        std::vector<std::uint64_t> at(b.where.rank());
        for (std::size_t d = b.where.rank(); d-- > 0;) {
          at[d] = b.where.start[d] + rest % b.where.extent[d];
          rest /= b.where.extent[d];
        }
        for (std::size_t d = 0; d < at.size(); ++d) {
          REQUIRE(at[d] < static_cast<std::uint64_t>(logical[static_cast<int>(d)]));
          expected = expected * local[d] + (static_cast<std::int64_t>(at[d]) - offsets[d]);
        }
        REQUIRE(expected == flat);
        REQUIRE(flat >= begin);
        REQUIRE(flat < end);
        ++visits[static_cast<std::size_t>(flat)];
      }
    }
    for (std::int64_t i = 0; i < numel; ++i) {
      // Row-major local index -> the global row it sits in: padding rows are left out.
      const std::int64_t row = offsets[0] + i / (numel / local[0]);
      const int expected = i >= begin && i < end && row < logical[0] ? 1 : 0;
      REQUIRE(visits[static_cast<std::size_t>(i)] == expected);
    }
  }
}
