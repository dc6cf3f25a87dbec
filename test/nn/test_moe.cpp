// The mixture-of-experts layer (nn/moe.hpp, nn/router.hpp, kernels/moe.hpp): the whole layer,
// router included, against central finite differences in double (inputs and every parameter; the
// objective sum(dy * y) + load-balancing loss + z-loss) with and without dropped tokens, k = 1 and
// 2; the forward against a token-by-token reference; the auxiliary losses, the top-k choice with
// its tie rule and capacity against hand computations; determinism; errors at construction.
#include <catch2/catch.hpp>

#include "gradient_check.hpp"

#include <quintet/nn/moe.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

using quintet::host;
using quintet::shape;
using quintet::nn::drop_order;
using quintet::nn::moe_options;
using quintet::test::host_tensor;

namespace {

const quintet::execution<host> exec;

template <class T>
using registry_of = quintet::nn::parameter_registry<T, host>;

// The layer computed token by token from the registry's parameters, in double: logits, softmax,
// top k (stable sort: ties to the lower expert), gates, capacity (each expert's assignments sorted
// by probability or kept in token order), then sum_j gate_j mlp_{e_j}(x_t) over the kept ones.
template <class T>
std::vector<double> reference_forward(registry_of<T>& registry, const std::string& name,
                                      const quintet::tensor<T, host>& x, std::int64_t hidden,
                                      const moe_options& options) {
  const std::int64_t d = x.shape()[x.rank() - 1], tokens = x.numel() / d;
  const std::int64_t experts = options.experts, k = options.top_k;
  const auto value = [&](const std::string& parameter, std::int64_t i) {
    return static_cast<double>(registry.find(name + parameter).value.data()[i]);
  };
  const auto input = [&](std::int64_t t, std::int64_t c) {
    return static_cast<double>(x.data()[t * d + c]);
  };
  std::vector<std::vector<double>> probs(tokens, std::vector<double>(experts));
  std::vector<std::vector<std::int64_t>> chosen(tokens);
  std::vector<std::vector<double>> gates(tokens);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<double> logits(experts);
    for (std::int64_t e = 0; e < experts; ++e)
      for (std::int64_t c = 0; c < d; ++c)
        logits[e] += value(".router.weight", e * d + c) * input(t, c);
    const double peak = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (std::int64_t e = 0; e < experts; ++e) sum += std::exp(logits[e] - peak);
    for (std::int64_t e = 0; e < experts; ++e) probs[t][e] = std::exp(logits[e] - peak) / sum;
    std::vector<std::int64_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return probs[t][a] > probs[t][b]; });
    chosen[t].assign(order.begin(), order.begin() + k);
    double chosen_sum = 0;
    for (const auto e : chosen[t]) chosen_sum += probs[t][e];
    for (const auto e : chosen[t])
      gates[t].push_back(k == 1 ? probs[t][e] : probs[t][e] / chosen_sum);
  }
  // kept[t][j]: whether token t's j-th choice survives capacity.
  std::vector<std::vector<bool>> kept(tokens, std::vector<bool>(k, true));
  const std::int64_t capacity =
      quintet::nn::expert_capacity(options.capacity_factor, tokens, k, experts);
  for (std::int64_t e = 0; e < experts && capacity > 0; ++e) {
    std::vector<std::pair<std::int64_t, std::int64_t>> mine;  // (token, slot) in token order
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t j = 0; j < k; ++j)
        if (chosen[t][j] == e) mine.emplace_back(t, j);
    if (options.drop == drop_order::lowest_probability)
      std::stable_sort(mine.begin(), mine.end(),
                       [&](auto a, auto b) { return probs[a.first][e] > probs[b.first][e]; });
    for (std::size_t r = static_cast<std::size_t>(capacity); r < mine.size(); ++r)
      kept[mine[r].first][mine[r].second] = false;
  }
  std::vector<double> y(static_cast<std::size_t>(tokens * d), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      if (!kept[t][j]) continue;
      const std::string expert = ".experts." + std::to_string(chosen[t][j]);
      std::vector<double> a(hidden);
      for (std::int64_t h = 0; h < hidden; ++h) {
        double v = value(expert + ".fc.bias", h);
        for (std::int64_t c = 0; c < d; ++c)
          v += value(expert + ".fc.weight", h * d + c) * input(t, c);
        a[h] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      }
      for (std::int64_t c = 0; c < d; ++c) {
        double o = value(expert + ".proj.bias", c);
        for (std::int64_t h = 0; h < hidden; ++h)
          o += value(expert + ".proj.weight", c * hidden + h) * a[h];
        y[t * d + c] += gates[t][j] * o;
      }
    }
  return y;
}

// Random non-zero biases, so their paths are exercised.
template <class T>
void randomise_biases(registry_of<T>& registry) {
  for (auto& p : registry)
    if (p.name.ends_with(".bias"))
      quintet::fill_normal(p.value, {.seed = 3, .stream = 4}, 0.0, 0.3);
}

// Every input and parameter element against central differences of
// L = sum(dy * y) + load-balancing loss + z-loss; returns the forward's routing.
quintet::nn::routing_statistics check_moe_gradients(std::uint64_t seed, const moe_options& options,
                                                    const shape& input_shape, std::int64_t hidden,
                                                    bool skew_to_expert_0 = false) {
  registry_of<double> registry(seed);
  const std::int64_t d = input_shape[input_shape.rank() - 1];
  quintet::nn::moe<double, host> layer(registry, exec, "blocks.1.moe", d, hidden, options);
  randomise_biases(registry);
  host_tensor x(input_shape);
  quintet::fill_normal(x, {.seed = seed, .stream = 2}, 0.0, 1.0);
  if (skew_to_expert_0) {
    // x[:, 0] >= 1 and a router row 0 of (4, 0, ...): every token's first choice is expert 0.
    auto& w = registry.find("blocks.1.moe.router.weight").value;
    for (std::int64_t c = 0; c < d; ++c) w.data()[c] = c == 0 ? 4.0 : 0.0;
    for (std::int64_t t = 0; t < x.numel() / d; ++t)
      x.data()[t * d] = 1 + std::abs(x.data()[t * d]);
  }
  host_tensor dy(input_shape);
  quintet::fill_normal(dy, {.seed = 77, .stream = 1}, 0.0, 1.0);

  quintet::nn::context<host> ctx;
  const host_tensor y = layer.forward(ctx, x.view());
  const quintet::nn::routing_statistics routing = layer.statistics();
  REQUIRE(routing.load_balancing_loss > 0);
  REQUIRE(routing.z_loss > 0);
  registry.zero_grad();
  const host_tensor dx = layer.backward(ctx, dy.view());
  REQUIRE(dx.shape() == input_shape);

  const auto loss = [&] {
    quintet::nn::context<host> fresh;
    const host_tensor out = layer.forward(fresh, x.view());
    return quintet::test::dot(out, dy) + layer.aux_loss();
  };
  const double step = 1e-6, tolerance = 1e-6;
  for (std::int64_t i = 0; i < x.numel(); ++i)
    quintet::test::require_close(dx.data()[i],
                                 quintet::test::central_difference(x.data()[i], step, loss),
                                 tolerance, "dx[" + std::to_string(i) + "]");
  for (auto& p : registry)
    for (std::int64_t i = 0; i < p.value.numel(); ++i)
      quintet::test::require_close(p.grad.data()[i],
                                   quintet::test::central_difference(p.value.data()[i], step, loss),
                                   tolerance, "d" + p.name + "[" + std::to_string(i) + "]");
  return routing;
}

// The router's context entries of the last forward.
std::vector<std::int32_t> positions(const quintet::nn::context<host>& ctx,
                                    const std::string& name) {
  const auto& p = ctx.get<std::int32_t>(name + ".router.position");
  return {p.data(), p.data() + p.numel()};
}
std::vector<std::int32_t> experts_chosen(const quintet::nn::context<host>& ctx,
                                         const std::string& name) {
  const auto& e = ctx.get<std::int32_t>(name + ".router.expert");
  return {e.data(), e.data() + e.numel()};
}

}  // namespace

TEST_CASE("moe backward matches finite differences, router and auxiliary losses included",
          "[nn][moe]") {
  const moe_options base{.experts = 4,
                         .load_balancing_coef = 0.3,
                         .z_loss_coef = 0.05,
                         .init_stddev = 0.8,
                         .proj_init_stddev = 0.6};
  for (const std::int64_t k : {1, 2}) {
    SECTION("dropless, k = " + std::to_string(k)) {
      moe_options options = base;
      options.top_k = k;
      options.capacity_factor = 0;
      const auto routing = check_moe_gradients(31 + k, options, shape{2, 5, 4}, 6);
      REQUIRE(routing.dropped_assignments == 0);
      REQUIRE(routing.capacity == 0);
    }
    SECTION("tokens dropped by probability, k = " + std::to_string(k)) {
      moe_options options = base;
      options.top_k = k;
      options.capacity_factor = 0.5;
      const auto routing = check_moe_gradients(41 + k, options, shape{2, 5, 4}, 6);
      REQUIRE(routing.capacity == (k == 1 ? 2 : 3));  // ceil(0.5 x 10 x k / 4)
      REQUIRE(routing.dropped_assignments > 0);
      if (k == 1) REQUIRE(routing.dropped_tokens > 0);  // tokens left with the residual only
    }
    SECTION("tokens dropped by position, k = " + std::to_string(k)) {
      moe_options options = base;
      options.top_k = k;
      options.capacity_factor = 0.5;
      options.drop = drop_order::position;
      const auto routing = check_moe_gradients(51 + k, options, shape{10, 4}, 5);
      REQUIRE(routing.dropped_assignments > 0);
    }
    SECTION("every token's first choice is one expert, k = " + std::to_string(k)) {
      moe_options options = base;
      options.top_k = k;
      options.capacity_factor = 0;
      const auto routing = check_moe_gradients(61 + k, options, shape{7, 4}, 5, true);
      REQUIRE(routing.kept[0] == 7);
      if (k == 1) REQUIRE(routing.kept == std::vector<std::int64_t>{7, 0, 0, 0});
      if (k == 1) REQUIRE(routing.min_load() == 0);  // experts with no tokens
      options.capacity_factor = 1.0;                 // capacity ceil(7 k / 4): expert 0 drops most
      const auto capped = check_moe_gradients(61 + k, options, shape{7, 4}, 5, true);
      REQUIRE(capped.kept[0] == capped.capacity);
      REQUIRE(capped.routed[0] == 7);
      if (k == 1) REQUIRE(capped.dropped_assignments == 7 - capped.capacity);
      REQUIRE(capped.dropped_assignments >= 7 - capped.capacity);
    }
  }
}

TEST_CASE("moe forward matches a token-by-token reference", "[nn][moe]") {
  for (const auto& [k, factor, drop] :
       {std::tuple{1, 0.0, drop_order::lowest_probability},
        std::tuple{2, 0.0, drop_order::lowest_probability},
        std::tuple{2, 0.6, drop_order::lowest_probability},
        std::tuple{1, 0.7, drop_order::position}, std::tuple{3, 0.5, drop_order::position}}) {
    const moe_options options{.experts = 5,
                              .top_k = k,
                              .capacity_factor = factor,
                              .drop = drop,
                              .init_stddev = 0.7,
                              .proj_init_stddev = 0.5};
    registry_of<double> registry(71);
    quintet::nn::moe<double, host> layer(registry, exec, "moe", 6, 9, options);
    randomise_biases(registry);
    host_tensor x(shape{3, 7, 6});
    quintet::fill_normal(x, {.seed = 72, .stream = 2}, 0.0, 1.0);
    quintet::nn::context<host> ctx;
    const host_tensor y = layer.forward(ctx, x.view());
    REQUIRE((factor == 0) == (layer.statistics().dropped_assignments == 0));
    const auto expected = reference_forward(registry, "moe", x, 9, options);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      INFO("k " << k << ", capacity factor " << factor << ", y[" << i << "]");
      REQUIRE(y.data()[i] == Approx(expected[i]).epsilon(1e-12).margin(1e-12));
    }
  }
}

TEST_CASE("moe in float matches the double reference", "[nn][moe]") {
  const moe_options options{.experts = 3, .top_k = 2, .capacity_factor = 0, .init_stddev = 0.5};
  registry_of<float> registry(81);
  quintet::nn::moe<float, host> layer(registry, exec, "moe", 8, 16, options);
  randomise_biases(registry);
  quintet::tensor<float, host> x(shape{12, 8});
  quintet::fill_normal(x, {.seed = 82, .stream = 2}, 0.0, 1.0);
  quintet::nn::context<host> ctx;
  const auto y = layer.forward(ctx, x.view());
  const auto expected = reference_forward(registry, "moe", x, 16, options);
  for (std::int64_t i = 0; i < y.numel(); ++i)
    REQUIRE(y.data()[i] == Approx(expected[i]).epsilon(1e-5).margin(1e-6));
  quintet::tensor<float, host> dy(y.shape());
  quintet::fill_normal(dy, {.seed = 83, .stream = 1}, 0.0, 1.0);
  const auto dx = layer.backward(ctx, dy.view());
  REQUIRE(dx.shape() == x.shape());
}

// Router weights (3, 2) = [[1, 0], [0, 1], [0, 0]] and x = [[1, 0], [0, 2], [0.5, 0.5]] give the
// logits [1, 0, 0], [0, 2, 0], [0.5, 0.5, 0]: token 2 ties experts 0 and 1 (and, for the second
// choice, token 0 ties 1 and 2, token 1 ties 0 and 2).
TEST_CASE("the auxiliary losses, top-k and gates match a hand computation", "[nn][moe]") {
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), eh = std::exp(0.5);
  const double p[3][3] = {{e1 / (e1 + 2), 1 / (e1 + 2), 1 / (e1 + 2)},
                          {1 / (e2 + 2), e2 / (e2 + 2), 1 / (e2 + 2)},
                          {eh / (2 * eh + 1), eh / (2 * eh + 1), 1 / (2 * eh + 1)}};
  const double lse[3] = {std::log(e1 + 2), std::log(e2 + 2), std::log(2 * eh + 1)};
  const double mean_p[3] = {(p[0][0] + p[1][0] + p[2][0]) / 3, (p[0][1] + p[1][1] + p[2][1]) / 3,
                            (p[0][2] + p[1][2] + p[2][2]) / 3};
  const double z = (lse[0] * lse[0] + lse[1] * lse[1] + lse[2] * lse[2]) / 3;

  for (const std::int64_t k : {1, 2}) {
    registry_of<double> registry(5);
    quintet::nn::moe<double, host> layer(registry, exec, "moe", 2, 3,
                                         {.experts = 3,
                                          .top_k = k,
                                          .capacity_factor = 0,
                                          .load_balancing_coef = 0.1,
                                          .z_loss_coef = 0.01});
    const double w[] = {1, 0, 0, 1, 0, 0};
    std::copy(std::begin(w), std::end(w), registry.find("moe.router.weight").value.data());
    host_tensor x(shape{3, 2});
    const double xs[] = {1, 0, 0, 2, 0.5, 0.5};
    std::copy(std::begin(xs), std::end(xs), x.data());
    quintet::nn::context<host> ctx;
    layer.forward(ctx, x.view());
    const auto& stats = layer.statistics();
    const auto& gate = ctx.get<double>("moe.router.gate");
    INFO("k = " << k);
    if (k == 1) {
      // Choices 0, 1, 0 (the tie to the lower index): f = (2/3, 1/3, 0).
      REQUIRE(experts_chosen(ctx, "moe") == std::vector<std::int32_t>{0, 1, 0});
      REQUIRE(stats.routed == std::vector<std::int64_t>{2, 1, 0});
      const double balance = 3 * (2.0 / 3 * mean_p[0] + 1.0 / 3 * mean_p[1]);
      REQUIRE(stats.load_balancing_loss == Approx(0.1 * balance).epsilon(1e-14));
      // k = 1: the gate is the probability itself.
      REQUIRE(gate.data()[0] == Approx(p[0][0]).epsilon(1e-14));
      REQUIRE(gate.data()[1] == Approx(p[1][1]).epsilon(1e-14));
      REQUIRE(gate.data()[2] == Approx(p[2][0]).epsilon(1e-14));
    } else {
      // (0, 1), (1, 0), (0, 1): f = (1/2, 1/2, 0).
      REQUIRE(experts_chosen(ctx, "moe") == std::vector<std::int32_t>{0, 1, 1, 0, 0, 1});
      REQUIRE(stats.routed == std::vector<std::int64_t>{3, 3, 0});
      const double balance = 3 * (0.5 * mean_p[0] + 0.5 * mean_p[1]);
      REQUIRE(stats.load_balancing_loss == Approx(0.1 * balance).epsilon(1e-14));
      // Renormalised over the chosen two.
      REQUIRE(gate.data()[0] == Approx(p[0][0] / (p[0][0] + p[0][1])).epsilon(1e-14));
      REQUIRE(gate.data()[1] == Approx(p[0][1] / (p[0][0] + p[0][1])).epsilon(1e-14));
      REQUIRE(gate.data()[2] == Approx(p[1][1] / (p[1][1] + p[1][0])).epsilon(1e-14));
      REQUIRE(gate.data()[4] == Approx(0.5).epsilon(1e-14));
    }
    REQUIRE(stats.z_loss == Approx(0.01 * z).epsilon(1e-14));
    REQUIRE(layer.aux_loss() == Approx(stats.load_balancing_loss + stats.z_loss).epsilon(1e-15));
    REQUIRE(stats.kept == stats.routed);  // dropless
  }
}

// Router weights (2, 2) = [[1, 0], [-1, 0]]: token t's logits are (a_t, -a_t) with a = (0.5, 2, 1,
// -1), so tokens 0, 1, 2 prefer expert 0 with probabilities sigmoid(2 a) = 0.73, 0.98, 0.88 and
// token 3 prefers expert 1. Four tokens, capacity factor 0.5: capacity ceil(0.5 x 4 x k / 2) = k.
TEST_CASE("capacity drops the documented tokens, by probability or by position", "[nn][moe]") {
  struct expectation {
    std::int64_t k;
    drop_order drop;
    std::vector<std::int32_t> position;  // (tokens, k), -1 dropped
    std::int64_t dropped_tokens;
  };
  const expectation cases[] = {
      // k = 1, capacity 1: expert 0 keeps the most probable token (1) or the first (0).
      {1, drop_order::lowest_probability, {-1, 0, -1, 1}, 2},
      {1, drop_order::position, {0, -1, -1, 1}, 2},
      // k = 2, capacity 2, every token on both experts (slot 0 the preferred one). By probability
      // expert 0 keeps tokens 1, 2 (rows 0, 1) and expert 1 tokens 0, 3 (rows 2, 3).
      {2, drop_order::lowest_probability, {-1, 2, 0, -1, 1, -1, 3, -1}, 0},
      // By position both experts keep tokens 0 and 1; tokens 2 and 3 keep nothing.
      {2, drop_order::position, {0, 2, 1, 3, -1, -1, -1, -1}, 2},
  };
  for (const auto& c : cases) {
    INFO("k = " << c.k << ", by " << (c.drop == drop_order::position ? "position" : "probability"));
    const moe_options options{
        .experts = 2, .top_k = c.k, .capacity_factor = 0.5, .drop = c.drop, .init_stddev = 0.7};
    registry_of<double> registry(9);
    quintet::nn::moe<double, host> layer(registry, exec, "moe", 2, 4, options);
    randomise_biases(registry);
    const double w[] = {1, 0, -1, 0};
    std::copy(std::begin(w), std::end(w), registry.find("moe.router.weight").value.data());
    host_tensor x(shape{4, 2});
    const double xs[] = {0.5, 0.3, 2.0, -0.1, 1.0, 0.7, -1.0, 0.2};
    std::copy(std::begin(xs), std::end(xs), x.data());
    quintet::nn::context<host> ctx;
    const host_tensor y = layer.forward(ctx, x.view());
    const auto& stats = layer.statistics();
    REQUIRE(stats.capacity == c.k);
    REQUIRE(positions(ctx, "moe") == c.position);
    REQUIRE(stats.routed ==
            (c.k == 1 ? std::vector<std::int64_t>{3, 1} : std::vector<std::int64_t>{4, 4}));
    REQUIRE(stats.kept ==
            (c.k == 1 ? std::vector<std::int64_t>{1, 1} : std::vector<std::int64_t>{2, 2}));
    REQUIRE(stats.dropped_assignments == 2 * c.k);
    REQUIRE(stats.dropped_fraction() == 0.5);
    REQUIRE(stats.dropped_tokens == c.dropped_tokens);
    REQUIRE(stats.min_load() == c.k);
    REQUIRE(stats.max_load() == c.k);
    // f_e counts assignments before dropping: (3/4, 1/4) for k = 1, not the kept (1/2, 1/2).
    double mean_p0 = 0;
    for (const double a : {0.5, 2.0, 1.0, -1.0}) mean_p0 += 1 / (1 + std::exp(-2 * a)) / 4;
    const double f0 = c.k == 1 ? 0.75 : 0.5;
    REQUIRE(stats.load_balancing_loss ==
            Approx(0.01 * 2 * (f0 * mean_p0 + (1 - f0) * (1 - mean_p0))).epsilon(1e-12));
    // A token dropped by all its experts gets exactly zero; the others are the reference's.
    const auto expected = reference_forward(registry, "moe", x, 4, options);
    for (std::int64_t t = 0; t < 4; ++t) {
      const bool all_dropped =
          std::all_of(c.position.begin() + t * c.k, c.position.begin() + (t + 1) * c.k,
                      [](std::int32_t at) { return at < 0; });
      for (std::int64_t j = 0; j < 2; ++j) {
        const double got = y.data()[t * 2 + j];
        if (all_dropped)
          REQUIRE(got == 0.0);
        else
          REQUIRE(got != 0.0);
        REQUIRE(got == Approx(expected[t * 2 + j]).epsilon(1e-12).margin(1e-14));
      }
    }
  }
}

TEST_CASE("route_top_k numbers the kept rows from first_row, counts unchanged", "[nn][moe]") {
  // 4 tokens, 3 experts, top-2, capacity 2, the least probable over capacity dropped: expert 0
  // keeps tokens 1, 3 (drops 0), expert 1 tokens 0, 2 (drops 3), expert 2 tokens 1, 2.
  host_tensor probs(shape{4, 3});
  const double ps[] = {0.5, 0.3, 0.2, 0.6, 0.1, 0.3, 0.2, 0.5, 0.3, 0.7, 0.2, 0.1};
  std::copy(std::begin(ps), std::end(ps), probs.data());
  const std::vector<std::int32_t> from_zero = {-1, 2, 0, 4, 3, 5, 1, -1};
  for (const std::int64_t first_row : {0, 7}) {
    INFO("first row " << first_row);
    quintet::tensor<std::int32_t, host> expert(shape{4, 2}), position(shape{4, 2});
    host_tensor gate(shape{4, 2});
    quintet::tensor<std::int64_t, host> routed(shape{3}), kept(shape{3});
    quintet::kernels::route_top_k(
        exec, probs, expert, gate, position, routed, kept,
        {.k = 2, .capacity = 2, .drop = drop_order::lowest_probability, .first_row = first_row});
    for (std::size_t i = 0; i < from_zero.size(); ++i)
      REQUIRE(position.data()[i] ==
              (from_zero[i] < 0 ? -1 : from_zero[i] + static_cast<std::int32_t>(first_row)));
    REQUIRE(std::vector<std::int64_t>(routed.data(), routed.data() + 3) ==
            std::vector<std::int64_t>{3, 3, 2});
    REQUIRE(std::vector<std::int64_t>(kept.data(), kept.data() + 3) ==
            std::vector<std::int64_t>{2, 2, 2});
  }
  quintet::tensor<std::int32_t, host> expert(shape{4, 2}), position(shape{4, 2});
  host_tensor gate(shape{4, 2});
  quintet::tensor<std::int64_t, host> routed(shape{3}), kept(shape{3});
  REQUIRE_THROWS_WITH(quintet::kernels::route_top_k(exec, probs, expert, gate, position, routed,
                                                    kept, {.k = 2, .first_row = -1}),
                      Catch::Contains("first row -1 is negative"));
  REQUIRE_THROWS_WITH(
      quintet::kernels::route_top_k(exec, probs, expert, gate, position, routed, kept,
                                    {.k = 2, .first_row = std::int64_t{1} << 31}),
      Catch::Contains("8 assignments from row 2147483648 exceed the int32 positions"));
}

TEST_CASE("dropless routing never drops, whatever the load", "[nn][moe]") {
  for (const std::int64_t k : {1, 2, 4}) {
    registry_of<double> registry(91);
    quintet::nn::moe<double, host> layer(
        registry, exec, "moe", 8, 4,
        {.experts = 4, .top_k = k, .capacity_factor = 0, .init_stddev = 1.0});
    // A router that favours expert 2 strongly for most tokens: a load far above any capacity.
    auto& w = registry.find("moe.router.weight").value;
    for (std::int64_t c = 0; c < 8; ++c) w.data()[2 * 8 + c] = 2.0;
    host_tensor x(shape{64, 8});
    quintet::fill_normal(x, {.seed = 92, .stream = 2}, 0.5, 1.0);
    quintet::nn::context<host> ctx;
    layer.forward(ctx, x.view());
    const auto& stats = layer.statistics();
    INFO("k = " << k);
    REQUIRE(stats.capacity == 0);
    REQUIRE(stats.dropped_assignments == 0);
    REQUIRE(stats.dropped_fraction() == 0.0);
    REQUIRE(stats.kept == stats.routed);
    REQUIRE(std::accumulate(stats.kept.begin(), stats.kept.end(), std::int64_t{0}) == 64 * k);
    // The skew is real: expert 2 holds more than capacity factor 1 would let it.
    if (k < 4) REQUIRE(stats.kept[2] > quintet::nn::expert_capacity(1.0, 64, k, 4));
    for (const std::int32_t at : positions(ctx, "moe")) REQUIRE(at >= 0);
  }
}

TEST_CASE("expert capacity is ceil(factor x tokens x k / experts)", "[nn][moe]") {
  using quintet::nn::expert_capacity;
  REQUIRE(expert_capacity(0.0, 100, 2, 8) == 0);
  REQUIRE(expert_capacity(1.0, 100, 2, 8) == 25);
  REQUIRE(expert_capacity(1.25, 10, 2, 4) == 7);  // 6.25
  REQUIRE(expert_capacity(1.1, 10, 1, 1) == 11);  // not 12 from 1.1's representation error
  REQUIRE(expert_capacity(0.01, 3, 1, 4) == 1);   // at least one
  REQUIRE_THROWS_WITH(expert_capacity(-0.5, 10, 1, 2),
                      Catch::Contains("capacity factor -0.5 must be finite and non-negative"));
}

TEST_CASE("two moe forwards and backwards give identical bits", "[nn][moe]") {
  const moe_options options{.experts = 4, .top_k = 2, .capacity_factor = 0.8, .init_stddev = 0.5};
  registry_of<float> registry(101);
  quintet::nn::moe<float, host> layer(registry, exec, "moe", 16, 24, options);
  randomise_biases(registry);
  quintet::tensor<float, host> x(shape{4, 9, 16}), dy(shape{4, 9, 16});
  quintet::fill_normal(x, {.seed = 102, .stream = 2}, 0.0, 1.0);
  quintet::fill_normal(dy, {.seed = 103, .stream = 2}, 0.0, 1.0);
  const auto run = [&] {
    registry.zero_grad();
    quintet::nn::context<host> ctx;
    auto y = layer.forward(ctx, x.view());
    auto dx = layer.backward(ctx, dy.view());
    std::vector<float> bits(y.data(), y.data() + y.numel());
    bits.insert(bits.end(), dx.data(), dx.data() + dx.numel());
    for (auto& p : registry) bits.insert(bits.end(), p.grad.data(), p.grad.data() + p.grad.numel());
    bits.push_back(static_cast<float>(layer.aux_loss()));
    return bits;
  };
  const auto first = run();
  REQUIRE(layer.statistics().dropped_assignments > 0);
  const auto second = run();
  REQUIRE(first.size() == second.size());
  REQUIRE(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
  REQUIRE(std::any_of(first.begin(), first.end(), [](float v) { return v != 0.0f; }));
}

TEST_CASE("moe rejects bad options and inputs at construction and forward", "[nn][moe]") {
  registry_of<float> registry(1);
  REQUIRE_THROWS_WITH(
      (quintet::nn::moe<float, host>(registry, exec, "moe", 4, 8, {.experts = 4, .top_k = 5})),
      Catch::Contains("top-5 routing needs 1 <= k <= the 4 experts"));
  REQUIRE_THROWS_WITH(
      (quintet::nn::moe<float, host>(registry, exec, "moe", 4, 8, {.experts = 0, .top_k = 1})),
      Catch::Contains("0 experts; at least 1 is needed"));
  REQUIRE_THROWS_WITH(
      (quintet::nn::moe<float, host>(registry, exec, "moe", 4, 8, {.capacity_factor = -1.0})),
      Catch::Contains("the capacity factor -1 must be finite and non-negative"));
  registry_of<float> fresh(1);
  quintet::nn::moe<float, host> layer(fresh, exec, "moe", 4, 8);
  quintet::nn::context<host> ctx;
  quintet::tensor<float, host> x(shape{2, 5});
  quintet::fill(x, 1.0f);
  REQUIRE_THROWS_WITH(
      layer.forward(ctx, x.view()),
      Catch::Contains("moe 'moe': input has shape (2, 5), its last dimension must be 4"));
}

TEST_CASE("moe names its parameters after the layer, the router and each expert", "[nn][moe]") {
  registry_of<float> registry(1);
  quintet::nn::moe<float, host> layer(registry, exec, "blocks.3.moe", 4, 8, {.experts = 2});
  std::vector<std::string> names;
  for (const auto& p : registry) names.push_back(p.name);
  REQUIRE(names == std::vector<std::string>{
                       "blocks.3.moe.router.weight", "blocks.3.moe.experts.0.fc.weight",
                       "blocks.3.moe.experts.0.fc.bias", "blocks.3.moe.experts.0.proj.weight",
                       "blocks.3.moe.experts.0.proj.bias", "blocks.3.moe.experts.1.fc.weight",
                       "blocks.3.moe.experts.1.fc.bias", "blocks.3.moe.experts.1.proj.weight",
                       "blocks.3.moe.experts.1.proj.bias"});
  REQUIRE(registry.find("blocks.3.moe.router.weight").value.shape() == shape{2, 4});
  REQUIRE(registry.find("blocks.3.moe.experts.1.fc.weight").value.shape() == shape{8, 4});
  REQUIRE(registry.find("blocks.3.moe.experts.1.proj.weight").value.shape() == shape{4, 8});
  REQUIRE(registry.find("blocks.3.moe.experts.0.proj.bias").decay ==
          quintet::nn::weight_decay::exempt);
}
