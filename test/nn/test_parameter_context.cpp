// parameter_registry, placement and context: names, initialisation keyed by name, shards that
// equal slices of the serial parameter, bytes counted, and the errors for misuse.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/synchronize_gradients.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/slice.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using quintet::host;
using quintet::mesh_axis;
using quintet::shape;
using quintet::nn::initializer;
using quintet::nn::parameter_registry;
using quintet::parallel::placement;

TEST_CASE("parameters are initialised by name, independently of creation order",
          "[nn][parameter]") {
  parameter_registry<float, host> first(7), second(7);
  auto& a1 = first.add("fc1.weight", shape{4, 6}, initializer::normal(0.02));
  first.add("fc2.weight", shape{6, 4}, initializer::normal(0.02));
  second.add("fc2.weight", shape{6, 4}, initializer::normal(0.02));
  auto& a2 = second.add("fc1.weight", shape{4, 6}, initializer::normal(0.02));
  REQUIRE(std::memcmp(a1.value.data(), a2.value.data(), a1.value.bytes()) == 0);
  CHECK(a1.value(0, 0) != first.find("fc2.weight").value(0, 0));
  CHECK(first.global_numel() == 48);
  CHECK(a1.grad(3, 5) == 0.0f);
  parameter_registry<float, host> other_seed(8);
  CHECK(other_seed.add("fc1.weight", shape{4, 6}, initializer::normal(0.02)).value(0, 0) !=
        a1.value(0, 0));
}

TEST_CASE("constant and uniform initialisers fill as asked", "[nn][parameter]") {
  parameter_registry<double, host> registry(1);
  auto& ones = registry.add("ln.weight", shape{5}, initializer::constant(1.0));
  auto& uniform = registry.add("u", shape{100}, initializer::uniform(-0.5, 0.5));
  for (int i = 0; i < 5; ++i) REQUIRE(ones.value(i) == 1.0);
  for (int i = 0; i < 100; ++i) REQUIRE((uniform.value(i) >= -0.5 && uniform.value(i) < 0.5));
}

TEST_CASE("a sharded parameter holds the slice of the serial parameter", "[nn][parameter]") {
  parameter_registry<float, host> serial(3);
  auto& whole = serial.add("qkv.weight", shape{12, 8}, initializer::normal(0.02));
  for (std::int64_t tp_rank = 0; tp_rank < 4; ++tp_rank) {
    quintet::parallel::mesh_position position{};
    quintet::parallel::position_on(position, mesh_axis::tp) = {.degree = 4, .coordinate = tp_rank};
    parameter_registry<float, host> sharded(3, position);
    auto& shard = sharded.add("qkv.weight", shape{12, 8}, initializer::normal(0.02),
                              placement::replicated().sharded(mesh_axis::tp, 0));
    REQUIRE(shard.value.shape() == shape{3, 8});
    quintet::tensor<float, host> expected(shape{3, 8});
    quintet::copy(expected, quintet::chunk(whole.value, 0, 4, tp_rank));
    REQUIRE(std::memcmp(shard.value.data(), expected.data(), expected.bytes()) == 0);
    CHECK(sharded.global_numel() == 96);
  }
}

TEST_CASE("placement maps mesh positions to regions, hierarchically on one dimension",
          "[nn][placement]") {
  quintet::parallel::mesh_position position{};
  quintet::parallel::position_on(position, mesh_axis::dp) = {.degree = 2, .coordinate = 1};
  quintet::parallel::position_on(position, mesh_axis::tp) = {.degree = 2, .coordinate = 0};
  const placement both =
      placement::replicated().sharded(mesh_axis::dp, 0).sharded(mesh_axis::tp, 0);
  const auto region = both.local_region(shape{8, 3}, position);
  CHECK(region.local_shape() == shape{2, 3});
  CHECK(region.offsets()[0] == 2);  // tp piece [0, 4), then its dp piece [2, 4)
  CHECK(placement::replicated().is_replicated());
  CHECK(both.sharded_dim(mesh_axis::tp) == 0);
  CHECK_FALSE(both.is_sharded(mesh_axis::sp));
  REQUIRE_THROWS_WITH(
      placement::replicated().sharded(mesh_axis::tp, 1).local_region(shape{4, 3}, position),
      Catch::Contains("dimension 1 of extent 3 does not divide over tp = 2"));
  REQUIRE_THROWS_WITH(
      placement::replicated().sharded(mesh_axis::tp, 2).local_region(shape{4, 4}, position),
      Catch::Contains("dimension 2 sharded over tp does not exist in shape (4, 4)"));
}

TEST_CASE("a rank's mesh position comes from the mesh layout", "[nn][placement]") {
  const quintet::mesh_layout layout({.dp = 2, .tp = 2, .sp = 2}, 8);
  for (int rank = 0; rank < 8; ++rank) {
    const auto position = quintet::parallel::position_in(layout, rank);
    const auto coordinates = layout.coordinates_of(rank);
    CHECK(position[static_cast<int>(mesh_axis::tp)].degree == 2);
    CHECK(position[static_cast<int>(mesh_axis::tp)].coordinate == coordinates.tp);
    CHECK(position[static_cast<int>(mesh_axis::sp)].coordinate == coordinates.sp);
    CHECK(position[static_cast<int>(mesh_axis::dp)].coordinate == coordinates.dp);
    CHECK(position[static_cast<int>(mesh_axis::pp)].degree == 1);
  }
}

TEST_CASE("registry misuse is reported by name", "[nn][parameter]") {
  parameter_registry<float, host> registry(1);
  registry.add("w", shape{2}, initializer::constant(0));
  REQUIRE_THROWS_WITH(registry.add("w", shape{2}, initializer::constant(0)),
                      Catch::Contains("a parameter named 'w' already exists"));
  REQUIRE_THROWS_WITH(registry.find("v"), Catch::Contains("no parameter named 'v'"));
}

TEST_CASE("a context keeps named tensors, counts their bytes and checks types", "[nn][context]") {
  quintet::nn::context<host> ctx;
  ctx.save<float>("block.ln.mean", shape{4, 16});
  auto& tokens = ctx.save<std::int32_t>("tokens", shape{4, 16});
  tokens(0, 0) = 42;
  CHECK(ctx.bytes() == 4 * 16 * 4 + 4 * 16 * 4);
  CHECK(ctx.get<std::int32_t>("tokens")(0, 0) == 42);
  REQUIRE_THROWS_WITH(ctx.get<float>("tokens"),
                      Catch::Contains("'tokens' was saved with another element type than f32"));
  REQUIRE_THROWS_WITH(ctx.get<float>("nope"), Catch::Contains("nothing saved under 'nope'"));
  REQUIRE_THROWS_WITH(ctx.save<float>("tokens", shape{1}), Catch::Contains("already saved"));
  ctx.clear();
  CHECK(ctx.bytes() == 0);
}

TEST_CASE("a context alias refers to a saved tensor without holding memory", "[nn][context]") {
  quintet::nn::context<host> ctx;
  auto& out = ctx.save<float>("attn.attention_output", shape{2, 3});
  out(1, 2) = 7.0f;
  ctx.alias("attn.proj.input", "attn.attention_output");
  ctx.alias("again", "attn.proj.input");  // an alias of an alias names the same tensor
  CHECK(ctx.bytes() == 2 * 3 * 4);
  CHECK(&ctx.get<float>("attn.proj.input") == &out);
  CHECK(ctx.get<float>("again")(1, 2) == 7.0f);
  REQUIRE_THROWS_WITH(ctx.get<std::int32_t>("again"),
                      Catch::Contains("'again' was saved with another element type"));
  REQUIRE_THROWS_WITH(ctx.alias("x", "missing"),
                      Catch::Contains("cannot alias 'x' to 'missing', nothing is saved"));
  REQUIRE_THROWS_WITH(ctx.alias("again", "attn.attention_output"),
                      Catch::Contains("'again' is already saved"));
}

namespace {

namespace parallel = quintet::parallel;
using quintet::mesh_axis_set;

using megatron_sp_plan =
    quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<parallel::megatron_sp>>;
using tp_ring_plan =
    quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<parallel::ring>>;

// A random, never-zero value per (stream, element): gradients that a lost copy would show.
double nonzero_value(std::uint64_t stream, std::int64_t element) {
  const double u =
      quintet::uniform_double({.seed = 99, .stream = stream}, static_cast<std::uint64_t>(element));
  return u < 0.5 ? u - 1.0 : u;
}

}  // namespace

TEST_CASE("placement: sharded_axes lists the axes a parameter is sharded over", "[nn][placement]") {
  CHECK(placement::replicated().sharded_axes().empty());
  const placement two = placement::replicated().sharded(mesh_axis::dp, 1).sharded(mesh_axis::tp, 0);
  CHECK(two.sharded_axes() == mesh_axis_set{mesh_axis::tp, mesh_axis::dp});
  CHECK_FALSE(two.is_replicated());
  for (const mesh_axis axis : quintet::all_mesh_axes)
    CHECK(two.sharded_axes().contains(axis) == two.is_sharded(axis));
  CHECK(placement::replicated().sharded(mesh_axis::edp, 0).sharded_axes() ==
        mesh_axis_set{mesh_axis::edp});
}

TEST_CASE("placement: partial axes are recorded apart from the sharding", "[nn][placement]") {
  CHECK(placement::replicated().partial_axes().empty());
  const placement sharded = placement::replicated().sharded(mesh_axis::tp, 0);
  const placement partial = sharded.partial({mesh_axis::sp, mesh_axis::dp});
  CHECK(partial.partial_axes() == mesh_axis_set{mesh_axis::sp, mesh_axis::dp});
  // Partial is not sharded, and sharding keeps the partial axes.
  CHECK(partial.sharded_axes() == mesh_axis_set{mesh_axis::tp});
  CHECK(partial.sharded(mesh_axis::sp, 1).partial_axes() == partial.partial_axes());
  // partial(axes) says which axes: a second call states them anew.
  CHECK(partial.partial({mesh_axis::tp}).partial_axes() == mesh_axis_set{mesh_axis::tp});
  CHECK(partial.partial({}).partial_axes().empty());
}

TEST_CASE("placement: the stages that hold a parameter, stage 0 alone by default",
          "[nn][placement]") {
  const placement plain = placement::replicated();
  CHECK(plain.stages() == std::vector<int>{0});
  CHECK(plain.held_by_stage(0));
  CHECK_FALSE(plain.held_by_stage(1));
  CHECK(plain.first_stage() == 0);

  // A token table tied between the first and last of 4 stages, given in any order.
  const placement tied = plain.held_by({3, 0});
  CHECK(tied.stages() == std::vector<int>{0, 3});
  CHECK(tied.held_by_stage(3));
  CHECK_FALSE(tied.held_by_stage(1));
  CHECK(tied.first_stage() == 0);

  const placement later = plain.held_by(std::vector<int>{9, 5, 5, 63});
  CHECK(later.stages() == std::vector<int>{5, 9, 63});
  CHECK(later.first_stage() == 5);
  CHECK_FALSE(later.held_by_stage(0));  // held_by replaces the default
  CHECK(later.held_by_stage(63));
  CHECK_FALSE(later.held_by_stage(-1));
  CHECK_FALSE(later.held_by_stage(64));

  CHECK_THROWS_WITH(plain.held_by(std::vector<int>{}),
                    Catch::Contains("must be held by at least one stage"));
  CHECK_THROWS_WITH(plain.held_by({1, 64}), Catch::Contains("stage 64 is outside [0, 64)"));
  CHECK_THROWS_WITH(plain.held_by({-1}), Catch::Contains("stage -1 is outside [0, 64)"));
}

TEST_CASE("placement: the logical shape, the stored one unless set, must fit in it",
          "[nn][placement]") {
  const shape stored{12, 8};
  CHECK(placement::replicated().logical_shape(stored) == stored);
  // A vocabulary of 10 padded to 12 over tp = 4.
  const placement padded =
      placement::replicated().sharded(mesh_axis::tp, 0).with_logical_shape(shape{10, 8});
  CHECK(padded.logical_shape(stored) == shape{10, 8});
  CHECK(padded.sharded_axes() == mesh_axis_set{mesh_axis::tp});  // the rest is kept
  CHECK(placement::replicated().with_logical_shape(stored).logical_shape(stored) == stored);
  CHECK_THROWS_WITH(padded.logical_shape(shape{12, 8, 1}), Catch::Contains("differ in rank"));
  CHECK_THROWS_WITH(padded.logical_shape(shape{12}), Catch::Contains("differ in rank"));
  CHECK_THROWS_WITH(
      padded.logical_shape(shape{9, 8}),
      Catch::Contains("logical shape (10, 8) does not fit in the stored shape (9, 8)"));
  CHECK_THROWS_WITH(padded.logical_shape(shape{12, 7}), Catch::Contains("does not fit"));
}

TEST_CASE("placement: equality compares sharding, partial axes, stages and logical shape",
          "[nn][placement]") {
  const placement base = placement::replicated();
  CHECK(base == placement::replicated());
  CHECK(base.sharded(mesh_axis::tp, 0) == placement::replicated().sharded(mesh_axis::tp, 0));
  CHECK_FALSE(base.sharded(mesh_axis::tp, 0) == base.sharded(mesh_axis::tp, 1));
  CHECK_FALSE(base.sharded(mesh_axis::tp, 0) == base.sharded(mesh_axis::sp, 0));

  CHECK(base.partial({mesh_axis::tp}) == base.partial({mesh_axis::tp}));
  CHECK_FALSE(base == base.partial({mesh_axis::tp}));
  CHECK_FALSE(base.partial({mesh_axis::tp}) == base.partial({mesh_axis::sp}));

  CHECK(base.held_by({0}) == base);  // stage 0 alone is the default
  CHECK_FALSE(base == base.held_by({1}));
  CHECK_FALSE(base.held_by({0, 1}) == base.held_by({1}));
  CHECK(base.held_by({2, 1}) == base.held_by({1, 2}));

  CHECK(base.with_logical_shape(shape{10, 4}) == base.with_logical_shape(shape{10, 4}));
  CHECK_FALSE(base == base.with_logical_shape(shape{10, 4}));
  CHECK_FALSE(base.with_logical_shape(shape{10, 4}) == base.with_logical_shape(shape{11, 4}));
}

TEST_CASE(
    "parameter_registry: under a plan, the position comes from the mesh and the partial "
    "axes from the plan",
    "[nn][parameter]") {
  // What each rank's registry made of its parameters (Catch2 asserts on the main thread only).
  struct rank_record {
    parallel::mesh_position position{};
    std::vector<mesh_axis_set> partial;
    std::int64_t sharded_offset = -1;
    std::vector<float> sharded_values;
  };
  std::vector<rank_record> megatron(4), ring(4);
  REQUIRE_NOTHROW(quintet::thread_world{4}.run([&](quintet::thread_comm& world) {
    const auto me = static_cast<std::size_t>(world.rank());
    {
      quintet::device_mesh<quintet::thread_comm> mesh(world, {.tp = 4});
      parameter_registry<float, host> registry(5, mesh, megatron_sp_plan{});
      registry.add("ln.weight", shape{6}, initializer::constant(1.0));
      auto& fc = registry.add("fc.weight", shape{8, 3}, initializer::normal(0.02),
                              placement::replicated().sharded(mesh_axis::tp, 0));
      // A partial axis the placement already names is kept beside the plan's.
      registry.add("extra.bias", shape{3}, initializer::constant(0.0),
                   placement::replicated().partial({mesh_axis::dp}));
      rank_record& r = megatron[me];
      r.position = registry.position();
      for (const auto& p : registry) r.partial.push_back(p.placement.partial_axes());
      r.sharded_offset = fc.local.offsets()[0];
      r.sharded_values.assign(fc.value.data(), fc.value.data() + fc.value.numel());
    }
    {
      quintet::device_mesh<quintet::thread_comm> mesh(world, {.tp = 2, .sp = 2});
      parameter_registry<float, host> registry(5, mesh, tp_ring_plan{});
      registry.add("ln.weight", shape{6}, initializer::constant(1.0));
      auto& fc = registry.add("fc.weight", shape{8, 3}, initializer::normal(0.02),
                              placement::replicated().sharded(mesh_axis::tp, 0));
      rank_record& r = ring[me];
      r.position = registry.position();
      for (const auto& p : registry) r.partial.push_back(p.placement.partial_axes());
      r.sharded_offset = fc.local.offsets()[0];
      r.sharded_values.assign(fc.value.data(), fc.value.data() + fc.value.numel());
    }
  }));

  parameter_registry<float, host> serial(5);
  const auto& whole = serial.add("fc.weight", shape{8, 3}, initializer::normal(0.02));
  const auto rows = [&](std::int64_t begin, std::int64_t end) {
    return std::vector<float>(whole.value.data() + begin * 3, whole.value.data() + end * 3);
  };
  const auto at = [](const parallel::mesh_position& position, mesh_axis axis) {
    return std::pair{position[static_cast<std::size_t>(axis)].degree,
                     position[static_cast<std::size_t>(axis)].coordinate};
  };
  using degree_and_coordinate = std::pair<std::int64_t, std::int64_t>;
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    const auto me = static_cast<std::size_t>(rank);
    // {.tp = 4}: the world rank is the tp coordinate; every other axis is one rank.
    const rank_record& m = megatron[me];
    CHECK(at(m.position, mesh_axis::tp) == degree_and_coordinate{4, rank});
    for (const mesh_axis axis :
         {mesh_axis::sp, mesh_axis::dp, mesh_axis::pp, mesh_axis::ep, mesh_axis::edp})
      CHECK(at(m.position, axis) == degree_and_coordinate{1, 0});
    // megatron_sp: the replicated parameter saw only the rank's sequence block, the shard did not.
    CHECK(m.partial == std::vector<mesh_axis_set>{mesh_axis_set{mesh_axis::tp}, mesh_axis_set{},
                                                  mesh_axis_set{mesh_axis::tp, mesh_axis::dp}});
    CHECK(m.sharded_offset == 2 * rank);
    CHECK(m.sharded_values == rows(2 * rank, 2 * rank + 2));
    // {.tp = 2, .sp = 2}: rank = tp + 2 sp. Ring leaves every gradient partial over sp.
    const rank_record& g = ring[me];
    CHECK(at(g.position, mesh_axis::tp) == degree_and_coordinate{2, rank % 2});
    CHECK(at(g.position, mesh_axis::sp) == degree_and_coordinate{2, rank / 2});
    CHECK(at(g.position, mesh_axis::dp) == degree_and_coordinate{1, 0});
    CHECK(g.partial ==
          std::vector<mesh_axis_set>{mesh_axis_set{mesh_axis::sp}, mesh_axis_set{mesh_axis::sp}});
    CHECK(g.sharded_offset == 4 * (rank % 2));
    CHECK(g.sharded_values == rows(4 * (rank % 2), 4 * (rank % 2) + 4));
  }
}

TEMPLATE_TEST_CASE(
    "parameter_registry: flatten moves values and gradients into buckets keyed by "
    "partial axes, bit for bit",
    "[nn][parameter][flatten]", float, double) {
  using T = TestType;
  constexpr std::int64_t per_line = 64 / static_cast<std::int64_t>(sizeof(T));
  // tp rank 1 of 2 under the megatron_sp rule: tp-sharded parameters are not partial, replicated
  // ones are partial over tp; "extra" is also partial over dp by its own placement.
  parallel::mesh_position position{};
  parallel::position_on(position, mesh_axis::tp) = {.degree = 2, .coordinate = 1};
  parameter_registry<T, host> registry(5, position, &megatron_sp_plan::partial_gradient_axes);
  const placement tp_rows = placement::replicated().sharded(mesh_axis::tp, 0);
  registry.add("qkv.weight", shape{6, 4}, initializer::normal(0.02), tp_rows);
  registry.add("ln.weight", shape{5}, initializer::uniform(0.5, 1.5));
  registry.add("proj.weight", shape{4, 6}, initializer::normal(0.02),
               placement::replicated().sharded(mesh_axis::tp, 1));
  registry.add("ln.bias", shape{7}, initializer::uniform(-1.0, 1.0));
  auto& extra = registry.add("extra", shape{17}, initializer::normal(1.0),
                             placement::replicated().partial({mesh_axis::dp}));
  registry.add("fc.weight", shape{2, 2}, initializer::normal(0.02), tp_rows);
  registry.add("big", shape{40}, initializer::normal(0.02), tp_rows);

  // Random non-zero gradients, and copies of every value and gradient as they are now.
  std::map<std::string, std::vector<T>> values, grads;
  std::uint64_t stream = 0;
  for (auto& p : registry) {
    for (std::int64_t i = 0; i < p.grad.numel(); ++i)
      p.grad.data()[i] = static_cast<T>(nonzero_value(stream, i));
    ++stream;
    values[p.name].assign(p.value.data(), p.value.data() + p.value.numel());
    grads[p.name].assign(p.grad.data(), p.grad.data() + p.grad.numel());
  }
  const auto local_shape_of = [&](std::string_view name) {
    return registry.find(name).value.shape();
  };
  const shape extra_shape = local_shape_of("extra");

  REQUIRE_FALSE(registry.flattened());
  registry.flatten();
  REQUIRE(registry.flattened());
  auto& buckets = registry.buckets();

  // Buckets in order of first appearance of their partial set, parameters in registration order.
  REQUIRE(buckets.size() == 3);
  const std::vector<std::pair<mesh_axis_set, std::vector<std::string>>> expected = {
      {{}, {"qkv.weight", "proj.weight", "fc.weight", "big"}},
      {{mesh_axis::tp}, {"ln.weight", "ln.bias"}},
      {{mesh_axis::tp, mesh_axis::dp}, {"extra"}},
  };
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    auto& bucket = buckets[b];
    INFO("bucket " << quintet::name_of(bucket.partial_axes));
    CHECK(bucket.partial_axes == expected[b].first);
    REQUIRE(bucket.parameters.size() == expected[b].second.size());
    REQUIRE(bucket.offsets.size() == bucket.parameters.size());
    REQUIRE(bucket.values.numel() == bucket.grads.numel());
    std::vector<bool> covered(static_cast<std::size_t>(bucket.values.numel()), false);
    std::int64_t end = 0;
    for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
      auto& p = *bucket.parameters[i];
      INFO("parameter " << p.name);
      CHECK(&p == &registry.find(expected[b].second[i]));
      const std::int64_t offset = bucket.offsets[i], n = p.value.numel();
      // Each parameter starts on a fresh 64-byte line after the previous one, and is a view of
      // exactly its range of the bucket.
      CHECK(offset % per_line == 0);
      CHECK(offset >= end);
      CHECK(offset - end < per_line);
      CHECK(reinterpret_cast<std::uintptr_t>(p.value.data()) % 64 == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(p.grad.data()) % 64 == 0);
      CHECK(p.value.data() == bucket.values.data() + offset);
      CHECK(p.grad.data() == bucket.grads.data() + offset);
      CHECK(p.value.shape() == local_shape_of(p.name));
      CHECK(p.grad.shape() == p.value.shape());
      REQUIRE(offset + n <= bucket.values.numel());
      // The same bits as before.
      CHECK(std::memcmp(p.value.data(), values[p.name].data(), sizeof(T) * values[p.name].size()) ==
            0);
      CHECK(std::memcmp(p.grad.data(), grads[p.name].data(), sizeof(T) * grads[p.name].size()) ==
            0);
      for (std::int64_t k = offset; k < offset + n; ++k)
        covered[static_cast<std::size_t>(k)] = true;
      end = offset + n;
    }
    CHECK(bucket.values.numel() >= end);
    CHECK(bucket.values.numel() - end < per_line);
    // Padding is zero in both buffers.
    for (std::int64_t k = 0; k < bucket.values.numel(); ++k) {
      if (covered[static_cast<std::size_t>(k)]) continue;
      REQUIRE(bucket.values.data()[k] == T(0));
      REQUIRE(bucket.grads.data()[k] == T(0));
    }
  }
  // The reference add() returned follows its parameter into the bucket.
  CHECK(extra.value.data() == buckets[2].values.data());
  CHECK(extra.value.shape() == extra_shape);
  // Writing through a parameter's view writes the bucket.
  extra.grad.data()[3] = T(42);
  CHECK(buckets[2].grads.data()[3] == T(42));

  SECTION("flatten is idempotent") {
    std::vector<const T*> buffers;
    for (auto& bucket : buckets) buffers.push_back(bucket.values.data());
    const T* const qkv = registry.find("qkv.weight").value.data();
    registry.flatten();
    REQUIRE(registry.buckets().size() == 3);
    for (std::size_t b = 0; b < buckets.size(); ++b) CHECK(buckets[b].values.data() == buffers[b]);
    CHECK(registry.find("qkv.weight").value.data() == qkv);
    CHECK(std::memcmp(registry.find("qkv.weight").value.data(), values["qkv.weight"].data(),
                      sizeof(T) * values["qkv.weight"].size()) == 0);
  }
  SECTION("zero_grad clears the buckets, padding included, and leaves the values") {
    buckets[1].grads.data()[buckets[1].grads.numel() - 1] = T(7);  // dirty a padding element
    registry.zero_grad();
    for (auto& bucket : buckets)
      for (std::int64_t k = 0; k < bucket.grads.numel(); ++k)
        REQUIRE(bucket.grads.data()[k] == T(0));
    for (auto& p : registry)
      CHECK(std::memcmp(p.value.data(), values[p.name].data(), sizeof(T) * values[p.name].size()) ==
            0);
  }
  SECTION("a parameter added after flatten is refused, by name") {
    REQUIRE_THROWS_WITH(registry.add("late.weight", shape{2}, initializer::constant(1.0)),
                        Catch::Contains("'late.weight' is added after the parameters were "
                                        "flattened into buckets"));
    CHECK(registry.size() == 7);
  }
}

TEST_CASE("parameter_registry: buckets() flattens on first use", "[nn][parameter][flatten]") {
  parameter_registry<float, host> registry(3);
  auto& w = registry.add("w", shape{3, 3}, initializer::normal(1.0));
  registry.add("b", shape{3}, initializer::uniform(-1.0, 1.0));
  const std::vector<float> before(w.value.data(), w.value.data() + w.value.numel());
  REQUIRE_FALSE(registry.flattened());
  auto& buckets = registry.buckets();
  CHECK(registry.flattened());
  // The serial registry leaves nothing partial: one bucket.
  REQUIRE(buckets.size() == 1);
  CHECK(buckets[0].partial_axes.empty());
  CHECK(w.value.data() == buckets[0].values.data());
  CHECK(std::vector<float>(w.value.data(), w.value.data() + w.value.numel()) == before);
}

TEST_CASE("parameter_registry: buckets of a size limit, padded to split over their partial axes",
          "[nn][parameter][flatten]") {
  using quintet::nn::bucket_layout;
  using quintet::nn::initializer;
  using quintet::nn::parameter_registry;
  // dp = 3: every gradient is partial over dp (as parallel::zero's rule makes it).
  quintet::parallel::mesh_position position{};
  quintet::parallel::position_on(position, mesh_axis::dp) = {.degree = 3, .coordinate = 2};
  parameter_registry<float, host> registry(5, position, [](const quintet::parallel::placement&) {
    return quintet::mesh_axis_set{mesh_axis::dp};
  });
  // 20, 40, 8 and 100 elements: padded to 32, 48, 16 and 112 (16 floats per 64-byte line).
  for (const auto& [name, n] : std::vector<std::pair<std::string, std::int64_t>>{
           {"a", 20}, {"b", 40}, {"c", 8}, {"d", 100}})
    registry.add(name, shape{n}, initializer::normal(1.0));
  std::vector<std::vector<float>> before;
  for (auto& p : registry) before.emplace_back(p.value.data(), p.value.data() + p.value.numel());
  registry.flatten(bucket_layout{.max_elements = 96, .shardable = true});
  auto& buckets = registry.buckets();
  // a, b and c (32 + 48 + 16 = 96) fit in one bucket of 96; d (112) is larger: a bucket alone.
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].parameters.size() == 3);
  CHECK(buckets[1].parameters.size() == 1);
  // Each padded to a multiple of 3 ranks x 16 floats: 96 -> 96, 112 -> 144.
  CHECK(buckets[0].values.numel() == 96);
  CHECK(buckets[1].values.numel() == 144);
  std::size_t i = 0;
  for (auto& p : registry) {
    CHECK(std::vector<float>(p.value.data(), p.value.data() + p.value.numel()) == before[i++]);
    CHECK(reinterpret_cast<std::uintptr_t>(p.grad.data()) % 64 == 0);
  }

  SECTION("release_gradients drops the buffers; zero_grad makes them again, zeroed") {
    registry.find("b").grad.data()[0] = 3.0f;
    registry.release_gradients();
    CHECK(registry.gradients_released());
    for (auto& bucket : buckets) CHECK(bucket.grads.data() == nullptr);
    CHECK(registry.find("b").grad.data() == nullptr);
    registry.zero_grad();
    CHECK_FALSE(registry.gradients_released());
    auto& b = registry.find("b");
    REQUIRE(b.grad.data() != nullptr);
    CHECK(b.grad.data() == buckets[0].grads.data() + buckets[0].offsets[1]);
    CHECK(b.grad.shape() == shape{40});
    for (auto& bucket : buckets)
      for (std::int64_t k = 0; k < bucket.grads.numel(); ++k) REQUIRE(bucket.grads.data()[k] == 0);
  }
  SECTION("a negative size is refused") {
    parameter_registry<float, host> other(5);
    other.add("w", shape{4}, initializer::constant(1.0));
    REQUIRE_THROWS_WITH(other.flatten(bucket_layout{.max_elements = -1}),
                        Catch::Contains("buckets of at most -1 elements"));
  }
  SECTION("flattening again keeps the layout; another layout is refused") {
    registry.flatten();
    registry.flatten(bucket_layout{.max_elements = 96, .shardable = true});
    CHECK(buckets.size() == 2);
    REQUIRE_THROWS_WITH(registry.flatten(bucket_layout{}),
                        Catch::Contains("already flattened into buckets of at most 96 elements "
                                        "(shardable); asked for 0"));
  }
  SECTION("released gradients are refused by the norm and the synchronisation") {
    registry.release_gradients();
    REQUIRE_THROWS_WITH(quintet::optim::global_gradient_norm(quintet::execution<host>(1), registry),
                        Catch::Contains("the gradient buffers were released"));
    quintet::thread_world{1}.run([&](quintet::thread_comm& comm) {
      quintet::device_mesh<quintet::thread_comm> mesh(comm, {});
      REQUIRE_THROWS_WITH(quintet::parallel::synchronize_gradients(registry, mesh),
                          Catch::Contains("the gradient buffers were released"));
    });
  }
}

TEST_CASE("parameter_registry: deferred storage draws each parameter in its bucket, the same bits",
          "[nn][parameter][flatten]") {
  using quintet::nn::bucket_layout;
  using quintet::nn::parameter_storage;
  // Two ranks' worth of registries (tp rank 1 of 2 under megatron_sp's rule, dp 2 shardable
  // buckets): the deferred one's values equal the immediate one's, bit for bit, and its gradients
  // and padding are zero.
  quintet::parallel::mesh_position position{};
  quintet::parallel::position_on(position, mesh_axis::tp) = {.degree = 2, .coordinate = 1};
  quintet::parallel::position_on(position, mesh_axis::dp) = {.degree = 2, .coordinate = 0};
  parameter_registry<float, host> immediate(9, position, &megatron_sp_plan::partial_gradient_axes);
  parameter_registry<float, host> deferred(9, position, &megatron_sp_plan::partial_gradient_axes,
                                           parameter_storage::deferred);
  const placement tp_rows = placement::replicated().sharded(mesh_axis::tp, 0);
  for (auto* registry : {&immediate, &deferred}) {
    registry->add("qkv.weight", shape{6, 40}, initializer::normal(0.02), tp_rows);
    registry->add("ln.weight", shape{33}, initializer::constant(1.0));
    registry->add("ln.bias", shape{7}, initializer::uniform(-1.0, 1.0),
                  placement::replicated().partial({mesh_axis::dp}));
    registry->add("fc.weight", shape{50, 3}, initializer::normal(1.0), tp_rows);
  }
  CHECK(immediate.initialized());
  REQUIRE_FALSE(deferred.initialized());
  // Before flatten: shapes known, no storage.
  auto& qkv = deferred.find("qkv.weight");
  CHECK(qkv.local_shape() == shape{3, 40});
  CHECK(qkv.value.data() == nullptr);
  CHECK(qkv.grad.data() == nullptr);
  CHECK(deferred.global_numel() == immediate.global_numel());

  const bucket_layout layout{.max_elements = 160, .shardable = true};
  immediate.flatten(layout);
  auto& expected = immediate.buckets();
  // NaN in the blocks the deferred buckets will be given (the thread's block cache hands a freed
  // block of the same size out again), so a value or gradient left undrawn or unzeroed shows.
  {
    std::vector<quintet::tensor<float, host>> poison;
    for (const auto& bucket : expected)
      for (int copy = 0; copy < 2; ++copy) {
        auto& block = poison.emplace_back(bucket.values.shape());
        quintet::fill(block, std::numeric_limits<float>::quiet_NaN());
      }
  }
  deferred.flatten(layout);
  REQUIRE(deferred.initialized());
  auto& got = deferred.buckets();
  REQUIRE(got.size() == expected.size());
  REQUIRE(got.size() >= 3);  // qkv and fc in separate buckets of at most 160
  for (std::size_t b = 0; b < got.size(); ++b) {
    INFO("bucket " << b);
    REQUIRE(got[b].values.numel() == expected[b].values.numel());
    CHECK(got[b].offsets == expected[b].offsets);
    CHECK(std::memcmp(got[b].values.data(), expected[b].values.data(), got[b].values.bytes()) == 0);
    for (std::int64_t k = 0; k < got[b].grads.numel(); ++k) REQUIRE(got[b].grads.data()[k] == 0);
  }
  // The references add() returned follow their parameters into the buckets, values drawn.
  CHECK(qkv.value.data() == got[0].values.data());
  CHECK(qkv.value.shape() == shape{3, 40});
  CHECK(qkv.value(2, 39) == immediate.find("qkv.weight").value(2, 39));
  CHECK(qkv.value(2, 39) != 0.0f);
  CHECK(deferred.find("ln.weight").value(32) == 1.0f);
  REQUIRE_THROWS_WITH(deferred.add("late", shape{2}, initializer::constant(1.0)),
                      Catch::Contains("'late' is added after the parameters were flattened"));
}

TEST_CASE(
    "parameter_registry: a deferred registry refuses zero_grad before flatten, and checks "
    "initialisers when they are added",
    "[nn][parameter][flatten]") {
  parameter_registry<double, host> registry(4, quintet::nn::parameter_storage::deferred);
  auto& w = registry.add("w", shape{5, 3}, initializer::normal(1.0));
  // zero_grad would have to pick a bucket layout: flatten is the caller's to call.
  REQUIRE_THROWS_WITH(registry.zero_grad(), Catch::Contains("zero_grad before flatten"));
  REQUIRE_FALSE(registry.flattened());
  REQUIRE_THROWS_WITH(registry.add("bad", shape{2}, initializer::normal(-1.0)),
                      Catch::Contains("'bad' is initialised with a negative standard deviation"));
  REQUIRE_THROWS_WITH(registry.add("worse", shape{2}, initializer::uniform(1.0, 0.5)),
                      Catch::Contains("'worse' is initialised uniformly over [1, 0.5)"));
  registry.flatten();
  registry.zero_grad();
  REQUIRE(w.grad.data() != nullptr);
  for (std::int64_t i = 0; i < w.grad.numel(); ++i) CHECK(w.grad.data()[i] == 0.0);
  parameter_registry<double, host> reference(4);
  const auto& r = reference.add("w", shape{5, 3}, initializer::normal(1.0));
  CHECK(std::memcmp(w.value.data(), r.value.data(), r.value.bytes()) == 0);
}
