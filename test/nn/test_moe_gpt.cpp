// Mixture of experts in the GPT (nn/gpt_stage.hpp, nn/transformer_block.hpp): the whole model's
// objective — mean cross-entropy plus aux_loss_scale x every MoE block's auxiliary losses — against
// central finite differences in double (dropless and with drops, whole and split backward); which
// blocks get experts; routing groups against separate calls on each group; the recompute modes
// (none, selective, full) and the split backward give the same bits; routing() counts forwards,
// not recomputations; bad configurations are refused naming the value.
#include <catch2/catch.hpp>

#include "gradient_check.hpp"

#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_decoder.hpp>
#include <quintet/nn/moe.hpp>

#include <cstdint>
#include <string>
#include <vector>

using quintet::host;
using quintet::shape;
using quintet::test::host_tensor;

namespace {

const quintet::execution<host> exec;

quintet::tensor<std::int32_t, host> ids(shape s, std::initializer_list<std::int32_t> values) {
  quintet::tensor<std::int32_t, host> t(s);
  std::int64_t i = 0;
  for (const auto v : values) t.data()[i++] = v;
  return t;
}

// A tiny MoE GPT: 2 blocks, experts in block 1 (moe_every 2) or both (moe_every 1).
quintet::nn::gpt_config tiny(std::int64_t moe_every, double capacity_factor, std::int64_t k) {
  return {.vocab = 6,
          .max_seq = 4,
          .layers = 2,
          .d_model = 4,
          .heads = 2,
          .mlp_hidden = 5,
          .init_stddev = 0.5,
          .experts = 3,
          .top_k = k,
          .moe_every = moe_every,
          .capacity_factor = capacity_factor,
          .aux_loss_coef = 0.3,
          .z_loss_coef = 0.05};
}

void randomise_biases(quintet::nn::parameter_registry<double, host>& registry) {
  for (auto& p : registry)
    if (p.name.ends_with(".bias"))
      quintet::fill_normal(p.value, {.seed = 3, .stream = quintet::rng_stream_for(p.name)}, 0.0,
                           0.2);
}

template <class T>
bool contains(quintet::nn::parameter_registry<T, host>& registry, const std::string& name) {
  for (const auto& p : registry)
    if (p.name == name) return true;
  return false;
}

// Every block's auxiliary losses of the forwards since the last reset.
double aux_losses(quintet::nn::gpt<double, host>& model) {
  double sum = 0;
  for (const auto& block : model.stage().routing())
    sum += block.totals.load_balancing_loss + block.totals.z_loss;
  return sum;
}

}  // namespace

TEST_CASE("a MoE GPT's gradients match finite differences of CE + aux losses", "[nn][moe][gpt]") {
  struct variant {
    std::int64_t moe_every, k;
    double capacity_factor;
    bool split;
  };
  for (const variant v : {variant{2, 2, 0.0, false}, variant{1, 1, 0.0, true},
                          variant{1, 2, 0.6, false}, variant{2, 1, 0.5, true}}) {
    INFO("moe_every " << v.moe_every << ", k " << v.k << ", capacity factor " << v.capacity_factor
                      << ", split " << v.split);
    quintet::nn::parameter_registry<double, host> registry(37);
    quintet::nn::gpt<double, host> model(registry, exec, tiny(v.moe_every, v.capacity_factor, v.k));
    randomise_biases(registry);
    const auto tokens = ids(shape{2, 4}, {1, 4, 0, 5, 2, 2, 3, 1});
    const auto targets = ids(shape{2, 4}, {4, 0, 5, -1, 2, 3, 1, 0});
    const double aux_scale = 0.7;  // as a trainer's 1 / (micro-batches x dp) would be

    quintet::nn::context<host> ctx;
    model.stage().reset_routing();
    const auto result = model.forward(ctx, tokens.view(), targets.view());
    const auto routing = model.stage().routing();
    REQUIRE(routing.size() == (v.moe_every == 1 ? 2u : 1u));
    std::int64_t dropped = 0;
    for (const auto& block : routing) {
      REQUIRE(block.totals.calls == 1);
      REQUIRE(block.totals.load_balancing_loss > 0);
      REQUIRE(block.totals.z_loss > 0);
      dropped += block.totals.dropped_assignments;
    }
    REQUIRE((dropped > 0) == (v.capacity_factor > 0));
    const double scale = 1.0 / static_cast<double>(result.count);
    registry.zero_grad();
    if (v.split) {
      model.backward_input(ctx, scale, aux_scale);
      model.backward_weight(ctx);
    } else {
      model.backward(ctx, scale, aux_scale);
    }
    const auto objective = [&] {
      quintet::nn::context<host> fresh;
      model.stage().reset_routing();
      const auto r = model.forward(fresh, tokens.view(), targets.view());
      return r.loss_sum * scale + aux_scale * aux_losses(model);
    };
    std::int64_t checked = 0;
    for (auto& p : registry) {
      for (std::int64_t i = 0; i < p.value.numel(); ++i)
        quintet::test::require_close(
            p.grad.data()[i], quintet::test::central_difference(p.value.data()[i], 1e-6, objective),
            1e-6, "d" + p.name + "[" + std::to_string(i) + "]");
      checked += p.value.numel();
    }
    REQUIRE(checked > 200);
  }
}

TEST_CASE("moe_every picks the blocks with experts, the rest stay dense", "[nn][moe][gpt]") {
  quintet::nn::parameter_registry<float, host> registry(5);
  quintet::nn::gpt_config config{.vocab = 8, .max_seq = 4, .layers = 4, .d_model = 8, .heads = 2};
  config.experts = 4;
  config.moe_every = 2;
  quintet::nn::gpt<float, host> model(registry, exec, config);
  for (const int block : {0, 1, 2, 3}) {
    const std::string b = "blocks." + std::to_string(block);
    const bool moe = block % 2 == 1;  // (index + 1) % 2 == 0: blocks 1 and 3
    CHECK(contains(registry, b + ".mlp.fc.weight") == !moe);
    CHECK(contains(registry, b + ".moe.router.weight") == moe);
    CHECK(contains(registry, b + ".moe.experts.3.proj.bias") == moe);
    CHECK(config.is_moe_block(block) == moe);
  }
  const auto& fc = registry.find("blocks.1.moe.experts.2.fc.weight");
  CHECK(fc.value.shape() == shape{32, 8});  // hidden() units per expert
  config.moe_every = 1;
  CHECK(config.is_moe_block(0));
  config.experts = 0;
  CHECK_FALSE(config.is_moe_block(1));
}

TEST_CASE("routing groups route like separate calls on each group", "[nn][moe]") {
  // One layer with 3 groups against a twin (same parameters) called on each third: the same
  // outputs, input gradients and, summed over the calls, parameter gradients; the auxiliary losses
  // the mean of the calls'; capacity from a group's tokens.
  for (const double factor : {0.0, 0.7}) {
    INFO("capacity factor " << factor);
    const quintet::nn::moe_options options{.experts = 4,
                                           .top_k = 2,
                                           .capacity_factor = factor,
                                           .load_balancing_coef = 0.3,
                                           .z_loss_coef = 0.05,
                                           .init_stddev = 0.8,
                                           .proj_init_stddev = 0.6};
    quintet::nn::parameter_registry<double, host> grouped_registry(9), single_registry(9);
    quintet::nn::moe_options grouped_options = options;
    grouped_options.groups = 3;
    quintet::nn::moe<double, host> grouped(grouped_registry, exec, "moe", 5, 7, grouped_options);
    quintet::nn::moe<double, host> single(single_registry, exec, "moe", 5, 7, options);
    host_tensor x(shape{3, 4, 5}), dy(shape{3, 4, 5});
    quintet::fill_normal(x, {.seed = 1, .stream = 1}, 0.0, 1.0);
    quintet::fill_normal(dy, {.seed = 1, .stream = 2}, 0.0, 1.0);

    quintet::nn::context<host> ctx;
    const host_tensor y = grouped.forward(ctx, x.view());
    const auto stats = grouped.statistics();
    CHECK(stats.groups == 3);
    CHECK(stats.capacity == grouped.capacity(4));
    grouped_registry.zero_grad();
    const host_tensor dx = grouped.backward(ctx, dy.view(), 0.5);

    single_registry.zero_grad();
    double load_balancing = 0, z = 0;
    std::int64_t dropped = 0;
    for (std::int64_t g = 0; g < 3; ++g) {
      host_tensor xg(shape{1, 4, 5}), dyg(shape{1, 4, 5});
      quintet::copy(xg, quintet::slice(x, 0, g, g + 1));
      quintet::copy(dyg, quintet::slice(dy, 0, g, g + 1));
      quintet::nn::context<host> part;
      const host_tensor yg = single.forward(part, xg.view());
      load_balancing += single.statistics().load_balancing_loss;
      z += single.statistics().z_loss;
      dropped += single.statistics().dropped_assignments;
      // Each group's losses weigh 1 / 3 of the grouped layer's: the mean over the groups.
      const host_tensor dxg = single.backward(part, dyg.view(), 0.5 / 3);
      for (std::int64_t i = 0; i < yg.numel(); ++i) {
        REQUIRE(y.data()[g * 20 + i] == yg.data()[i]);
        REQUIRE(dx.data()[g * 20 + i] == Approx(dxg.data()[i]).epsilon(1e-13).margin(1e-15));
      }
    }
    CHECK(stats.dropped_assignments == dropped);
    CHECK((dropped > 0) == (factor > 0));
    CHECK(stats.load_balancing_loss == Approx(load_balancing / 3).epsilon(1e-14));
    CHECK(stats.z_loss == Approx(z / 3).epsilon(1e-14));
    for (auto& p : grouped_registry) {
      const auto& twin = single_registry.find(p.name);
      for (std::int64_t i = 0; i < p.grad.numel(); ++i) {
        INFO(p.name << "[" << i << "]");
        REQUIRE(p.grad.data()[i] == Approx(twin.grad.data()[i]).epsilon(1e-12).margin(1e-14));
      }
    }
  }
}

TEST_CASE("a MoE block gives the same bits under every recompute mode and in two passes",
          "[nn][moe][gpt]") {
  // The serial MoE GPT in float: each mode's gradients and loss equal recompute none's, whole and
  // split; routing() counts each forward once (full recomputation reruns it, uncounted).
  const auto run = [](quintet::nn::recompute_mode mode, bool split) {
    quintet::nn::gpt_config config = {.vocab = 7,
                                      .max_seq = 6,
                                      .layers = 2,
                                      .d_model = 8,
                                      .heads = 2,
                                      .recompute = mode,
                                      .experts = 4,
                                      .top_k = 2,
                                      .moe_every = 1,
                                      .capacity_factor = 0.8};
    quintet::nn::parameter_registry<float, host> registry(11);
    quintet::nn::gpt<float, host> model(registry, exec, config);
    const auto tokens = ids(shape{2, 6}, {1, 4, 0, 5, 2, 2, 3, 1, 6, 6, 0, 2});
    const auto targets = ids(shape{2, 6}, {4, 0, 5, 2, 2, 3, 1, 6, 6, 0, 2, 1});
    registry.zero_grad();
    model.stage().reset_routing();
    for (int micro = 0; micro < 2; ++micro) {
      quintet::nn::context<host> ctx;
      model.forward(ctx, tokens.view(), targets.view());
      if (split) {
        model.backward_input(ctx, 0.1, 0.5);
        model.backward_weight(ctx);
      } else {
        model.backward(ctx, 0.1, 0.5);
      }
    }
    for (const auto& block : model.stage().routing()) REQUIRE(block.totals.calls == 2);
    std::vector<float> grads;
    for (auto& p : registry)
      grads.insert(grads.end(), p.grad.data(), p.grad.data() + p.grad.numel());
    return grads;
  };
  const auto reference = run(quintet::nn::recompute_mode::none, false);
  for (const auto mode : {quintet::nn::recompute_mode::none, quintet::nn::recompute_mode::selective,
                          quintet::nn::recompute_mode::full})
    for (const bool split : {false, true}) {
      INFO("mode " << quintet::nn::name_of(mode) << ", split " << split);
      REQUIRE(run(mode, split) == reference);
    }
}

TEST_CASE("MoE GPT configurations are checked, naming the value", "[nn][moe][gpt]") {
  quintet::nn::gpt_config config{.vocab = 8, .max_seq = 4, .layers = 2, .d_model = 8, .heads = 2};
  config.experts = 4;
  config.top_k = 5;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("top-5 routing needs 1 <= top_k <= the 4"));
  config.top_k = 2;
  config.moe_every = 3;
  CHECK_THROWS_WITH(config.validate(),
                    Catch::Contains("MoE in every 3-th block of 2 leaves no block with experts"));
  config.moe_every = 2;
  config.capacity_factor = -1;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("the capacity factor -1 must be finite"));
  config.capacity_factor = 1;
  config.aux_loss_coef = -0.1;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("auxiliary loss coefficients (-0.1"));
  config.aux_loss_coef = 0.01;
  config.experts = -2;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("-2 experts"));
  config.experts = 4;
  CHECK_NOTHROW(config.validate());
  quintet::nn::parameter_registry<float, host> registry(1);
  quintet::nn::gpt<float, host> model(registry, exec, config);
  // The decoder finds every MoE block's router and experts (test_generation.cpp runs them).
  CHECK_NOTHROW(quintet::nn::gpt_decoder<float, host>(registry, exec, config));
  // Routing groups must divide a call's tokens.
  config.routing_groups = 3;
  quintet::nn::parameter_registry<float, host> grouped_registry(1);
  quintet::nn::gpt<float, host> grouped(grouped_registry, exec, config);
  const auto tokens = ids(shape{2, 4}, {1, 2, 3, 4, 5, 6, 7, 0});
  quintet::nn::context<host> ctx;
  CHECK_THROWS_WITH(grouped.forward(ctx, tokens.view(), tokens.view()),
                    Catch::Contains("8 tokens do not split into 3 equal routing groups"));
}
