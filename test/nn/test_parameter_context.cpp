// parameter_registry, placement and context: names, initialisation keyed by name, shards that
// equal slices of the serial parameter, bytes counted, and the errors for misuse.
#include <catch2/catch.hpp>

#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>

#include <cstring>

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
