// AdamW and SGD over a parameter registry against straightforward double-precision references,
// weight decay only on matrices, and global-norm clipping.
#include <catch2/catch.hpp>

#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/optim/sgd.hpp>
#include <quintet/tensor/fill.hpp>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

using quintet::host;
using quintet::shape;
using quintet::nn::initializer;
using quintet::nn::parameter_registry;

namespace {

const quintet::execution<host> exec;

// A matrix that decays, and a vector and a rank-2 fused bias that do not.
void make_parameters(parameter_registry<double, host>& registry) {
  using quintet::nn::weight_decay;
  const auto replicated = quintet::parallel::placement::replicated();
  registry.add("fc.weight", shape{3, 4}, initializer::normal(1.0));
  registry.add("fc.bias", shape{3}, initializer::normal(1.0), replicated, weight_decay::exempt);
  registry.add("qkv.bias", shape{3, 2}, initializer::normal(1.0), replicated, weight_decay::exempt);
}

void random_gradients(parameter_registry<double, host>& registry, std::uint64_t step) {
  for (auto& p : registry)
    quintet::fill_normal(p.grad, {.seed = step, .stream = quintet::rng_stream_for(p.name)}, 0.0,
                         1.0);
}

}  // namespace

TEST_CASE("AdamW matches the reference update, decaying only matrices", "[optim][adamw]") {
  parameter_registry<double, host> registry(3);
  make_parameters(registry);
  const quintet::kernels::adamw_hyperparameters hp{
      .lr = 0.1, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.3};
  quintet::optim::adamw<double, host> optimizer(registry, exec, hp);

  // Reference state, element by element.
  std::vector<std::vector<double>> value, m, v;
  for (auto& p : registry) {
    value.emplace_back(p.value.data(), p.value.data() + p.value.numel());
    m.emplace_back(p.value.numel(), 0.0);
    v.emplace_back(p.value.numel(), 0.0);
  }
  const double lrs[] = {0.1, 0.05, 0.02};
  const double scales[] = {1.0, 0.5, 1.0};
  for (int t = 1; t <= 3; ++t) {
    random_gradients(registry, t);
    std::size_t i = 0;
    for (auto& p : registry) {
      const double decay = p.name == "fc.weight" ? hp.weight_decay : 0.0;
      for (std::int64_t e = 0; e < p.value.numel(); ++e) {
        const double g = scales[t - 1] * p.grad.data()[e];
        m[i][e] = hp.beta1 * m[i][e] + (1 - hp.beta1) * g;
        v[i][e] = hp.beta2 * v[i][e] + (1 - hp.beta2) * g * g;
        const double m_hat = m[i][e] / (1 - std::pow(hp.beta1, t));
        const double v_hat = v[i][e] / (1 - std::pow(hp.beta2, t));
        value[i][e] -= lrs[t - 1] * (m_hat / (std::sqrt(v_hat) + hp.eps) + decay * value[i][e]);
      }
      ++i;
    }
    optimizer.step(lrs[t - 1], scales[t - 1]);
    i = 0;
    for (auto& p : registry) {
      for (std::int64_t e = 0; e < p.value.numel(); ++e)
        REQUIRE(p.value.data()[e] == Approx(value[i][e]).epsilon(1e-12));
      ++i;
    }
  }
  CHECK(optimizer.steps() == 3);
}

TEST_CASE("layers exempt biases and norm scales from weight decay, fused biases included",
          "[optim][adamw]") {
  parameter_registry<float, host> registry(1);
  quintet::nn::linear<float, host> qkv(registry, exec, "qkv", 4, 12, {.output_groups = 3});
  quintet::nn::layer_norm<float, host> norm(registry, exec, "ln", 4);
  using quintet::nn::weight_decay;
  CHECK(registry.find("qkv.weight").decay == weight_decay::apply);
  CHECK(registry.find("qkv.bias").global_shape == shape{3, 4});
  CHECK(registry.find("qkv.bias").decay == weight_decay::exempt);
  CHECK(registry.find("ln.weight").decay == weight_decay::exempt);
  CHECK(registry.find("ln.bias").decay == weight_decay::exempt);
}

TEST_CASE("SGD with momentum matches the reference update", "[optim][sgd]") {
  parameter_registry<double, host> registry(4);
  make_parameters(registry);
  const quintet::kernels::sgd_hyperparameters hp{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  quintet::optim::sgd<double, host> optimizer(registry, exec, hp);
  std::vector<std::vector<double>> value, buffer;
  for (auto& p : registry) {
    value.emplace_back(p.value.data(), p.value.data() + p.value.numel());
    buffer.emplace_back(p.value.numel(), 0.0);
  }
  for (int t = 1; t <= 3; ++t) {
    random_gradients(registry, 10 + t);
    std::size_t i = 0;
    for (auto& p : registry) {
      for (std::int64_t e = 0; e < p.value.numel(); ++e) {
        const double decay = p.name == "fc.weight" ? hp.weight_decay : 0.0;
        const double g = p.grad.data()[e] + decay * value[i][e];
        buffer[i][e] = hp.momentum * buffer[i][e] + g;
        value[i][e] -= hp.lr * buffer[i][e];
      }
      ++i;
    }
    optimizer.step(hp.lr);
    i = 0;
    for (auto& p : registry) {
      for (std::int64_t e = 0; e < p.value.numel(); ++e)
        REQUIRE(p.value.data()[e] == Approx(value[i][e]).epsilon(1e-12));
      ++i;
    }
  }
}

TEST_CASE("the global gradient norm counts every element once and clipping scales to it",
          "[optim][clip]") {
  parameter_registry<double, host> registry(5);
  make_parameters(registry);
  random_gradients(registry, 1);
  double squares = 0;
  for (auto& p : registry)
    for (std::int64_t e = 0; e < p.grad.numel(); ++e)
      squares += p.grad.data()[e] * p.grad.data()[e];
  const double norm = quintet::optim::global_gradient_norm(exec, registry);
  CHECK(norm == Approx(std::sqrt(squares)).epsilon(1e-14));
  CHECK(quintet::optim::clip_factor(norm, norm * 2) == 1.0);
  CHECK(quintet::optim::clip_factor(norm, norm / 4) == Approx(0.25));
  CHECK(quintet::optim::clip_factor(norm, 0.0) == 1.0);  // clipping off
  REQUIRE_THROWS_WITH(quintet::optim::clip_factor(std::numeric_limits<double>::quiet_NaN(), 1.0),
                      Catch::Contains("gradient norm is nan"));
  REQUIRE_THROWS_WITH(quintet::optim::clip_factor(1.0, std::numeric_limits<double>::quiet_NaN()),
                      Catch::Contains("the clipping bound is nan"));
}

TEST_CASE("the global gradient norm refuses sharded parameters", "[optim][clip]") {
  quintet::parallel::mesh_position position{};
  quintet::parallel::position_on(position, quintet::mesh_axis::tp) = {.degree = 2, .coordinate = 0};
  parameter_registry<double, host> registry(5, position);
  registry.add("w", shape{4, 2}, initializer::normal(1.0),
               quintet::parallel::placement::replicated().sharded(quintet::mesh_axis::tp, 0));
  REQUIRE_THROWS_WITH(quintet::optim::global_gradient_norm(exec, registry),
                      Catch::Contains("parameter 'w' is sharded"));
}

TEST_CASE("AdamW over owned ranges of each parameter is the whole update, range by range",
          "[optim][adamw]") {
  // Three registries with the same parameters and gradients: one optimizer updates everything,
  // two others split every parameter's flattened elements between them, as two ZeRO ranks would.
  const quintet::kernels::adamw_hyperparameters hp{.lr = 0.1, .weight_decay = 0.3};
  parameter_registry<double, host> whole(3), low(3), high(3);
  for (auto* registry : {&whole, &low, &high}) make_parameters(*registry);
  quintet::optim::adamw<double, host> all(whole, exec, hp), first(low, exec, hp),
      second(high, exec, hp);
  std::vector<std::vector<double>> initial;
  for (auto& p : low) {
    const std::int64_t n = p.value.numel(), half = n / 2;
    first.own(p.name, {0, half});
    second.own(p.name, {half, n});
    initial.emplace_back(p.value.data(), p.value.data() + n);
  }
  CHECK(first.state("fc.weight").m.numel() == 6);
  CHECK(!first.state("fc.weight").whole);
  for (int t = 1; t <= 3; ++t) {
    for (auto* registry : {&whole, &low, &high}) random_gradients(*registry, t);
    all.step(0.1, 0.7);
    first.step(0.1, 0.7);
    second.step(0.1, 0.7);
  }
  std::size_t i = 0;
  for (auto& p : whole) {
    const auto& a = low.find(p.name);
    const auto& b = high.find(p.name);
    const std::int64_t n = p.value.numel(), half = n / 2;
    for (std::int64_t e = 0; e < n; ++e) {
      INFO(p.name << "[" << e << "]");
      // Each element moved exactly as in the whole update on the rank that owns it, and not at all
      // on the other.
      const double owned = e < half ? a.value.data()[e] : b.value.data()[e];
      const double other = e < half ? b.value.data()[e] : a.value.data()[e];
      REQUIRE(owned == p.value.data()[e]);
      REQUIRE(other == initial[i][e]);
    }
    ++i;
  }
  // Owning a whole parameter (a rank whose range covers it) is the whole update.
  parameter_registry<double, host> again(3);
  make_parameters(again);
  quintet::optim::adamw<double, host> owner(again, exec, hp);
  for (auto& p : again) owner.own(p.name, {0, p.value.numel()});
  CHECK(owner.state("fc.weight").whole);
  CHECK(owner.state("fc.weight").m.shape() == shape{3, 4});
  for (int t = 1; t <= 3; ++t) {
    random_gradients(again, t);
    owner.step(0.1, 0.7);
  }
  for (auto& p : whole) {
    const auto& q = again.find(p.name);
    for (std::int64_t e = 0; e < p.value.numel(); ++e)
      REQUIRE(q.value.data()[e] == p.value.data()[e]);
  }
  REQUIRE_THROWS_WITH(first.own("fc.bias", {0, 1}),
                      Catch::Contains("'fc.bias' changes owner after 3 steps"));
  quintet::optim::adamw<double, host> fresh(whole, exec, hp);
  REQUIRE_THROWS_WITH(fresh.own("fc.bias", {2, 4}),
                      Catch::Contains("range [2, 4) is outside parameter 'fc.bias' of 3 elements"));
  REQUIRE_THROWS_WITH(fresh.own("nope", {0, 1}), Catch::Contains("no state for parameter 'nope'"));
}

TEST_CASE("AdamW reading an owned range's gradient from a buffer of its own (ZeRO-2's shard)",
          "[optim][adamw]") {
  // The same update as reading the parameter's gradient, with that gradient copied elsewhere and
  // the parameter's own gradient spoiled; the state counts the owned ranges' moments only.
  const quintet::kernels::adamw_hyperparameters hp{.lr = 0.05, .weight_decay = 0.2};
  parameter_registry<double, host> reference(4), sharded(4);
  make_parameters(reference);
  make_parameters(sharded);
  quintet::optim::adamw<double, host> plain(reference, exec, hp), from_shard(sharded, exec, hp);
  std::vector<quintet::tensor<double, host>> shards;
  std::int64_t owned_elements = 0;
  for (auto& p : sharded) {
    const std::int64_t n = p.value.numel(), begin = n / 3;
    plain.own(p.name, {begin, n});
    auto& shard = shards.emplace_back(shape{n - begin});
    from_shard.own(p.name, {begin, n}, shard.view());
    owned_elements += n - begin;
  }
  CHECK(from_shard.state_bytes() == 2 * owned_elements * std::int64_t(sizeof(double)));
  for (int t = 1; t <= 3; ++t) {
    random_gradients(reference, t);
    random_gradients(sharded, t);
    std::size_t i = 0;
    for (auto& p : sharded) {
      const std::int64_t n = p.grad.numel(), begin = n / 3;
      for (std::int64_t e = begin; e < n; ++e) {
        shards[i].data()[e - begin] = p.grad.data()[e];
        p.grad.data()[e] = 1e6;  // must not be read
      }
      ++i;
    }
    plain.step(0.05, 0.9);
    from_shard.step(0.05, 0.9);
  }
  for (auto& p : reference) {
    const auto& q = sharded.find(p.name);
    for (std::int64_t e = 0; e < p.value.numel(); ++e)
      REQUIRE(q.value.data()[e] == p.value.data()[e]);
  }
  quintet::optim::adamw<double, host> fresh(reference, exec, hp);
  quintet::tensor<double, host> wrong(shape{5});
  REQUIRE_THROWS_WITH(fresh.own("fc.weight", {0, 4}, wrong.view()),
                      Catch::Contains("a gradient of 5 elements for the range [0, 4)"));
}

TEST_CASE("AdamW allocates its moments when first used, zeroed", "[optim][adamw]") {
  // Building the optimizer holds no moments; state_bytes counts what it will hold; the first step
  // (or a checkpoint asking for the state) allocates them, zero before any update.
  const quintet::kernels::adamw_hyperparameters hp{.lr = 0.1, .weight_decay = 0.3};
  parameter_registry<double, host> registry(6), reference(6);
  make_parameters(registry);
  make_parameters(reference);
  quintet::optim::adamw<double, host> lazy(registry, exec, hp), plain(reference, exec, hp);
  const auto& untouched = std::as_const(lazy).state("fc.weight");
  CHECK(untouched.m.data() == nullptr);
  CHECK(untouched.shape == shape{3, 4});
  CHECK(lazy.state_bytes() == 2 * (12 + 3 + 6) * std::int64_t(sizeof(double)));
  // Owning a range never allocates the whole parameter's moments.
  lazy.own("fc.weight", {2, 12});
  CHECK(std::as_const(lazy).state("fc.weight").m.data() == nullptr);
  CHECK(lazy.state_bytes() == 2 * (10 + 3 + 6) * std::int64_t(sizeof(double)));
  // NaN in the blocks the moments will be given (the thread's block cache hands a freed block of
  // the same size out again), so moments left unzeroed show.
  const auto poison = [](std::initializer_list<shape> shapes) {
    std::vector<quintet::tensor<double, host>> blocks;
    for (const shape& s : shapes)
      for (int copy = 0; copy < 2; ++copy)
        quintet::fill(blocks.emplace_back(s), std::numeric_limits<double>::quiet_NaN());
  };
  poison({shape{3}});
  auto& asked = lazy.state("fc.bias");
  REQUIRE(asked.m.shape() == shape{3});
  for (std::int64_t i = 0; i < 3; ++i)
    CHECK((asked.m.data()[i] == 0.0 && asked.v.data()[i] == 0.0));
  plain.own("fc.weight", {2, 12});
  for (int t = 1; t <= 2; ++t) {
    random_gradients(registry, t);
    random_gradients(reference, t);
    if (t == 1) poison({shape{10}, shape{3, 2}});
    lazy.step(0.1);
    plain.step(0.1);
  }
  CHECK(std::as_const(lazy).state("fc.weight").m.shape() == shape{10});
  for (auto& p : reference) {
    const auto& q = registry.find(p.name);
    for (std::int64_t e = 0; e < p.value.numel(); ++e) {
      REQUIRE(std::isfinite(q.value.data()[e]));
      REQUIRE(q.value.data()[e] == p.value.data()[e]);
    }
  }
}

TEST_CASE("optimizers reject bad hyperparameters", "[optim]") {
  parameter_registry<float, host> registry(1);
  REQUIRE_THROWS_WITH((quintet::optim::adamw<float, host>(registry, exec, {.beta1 = 1.0})),
                      Catch::Contains("betas (1, 0.999) must lie in [0, 1)"));
  REQUIRE_THROWS_WITH((quintet::optim::sgd<float, host>(registry, exec, {.momentum = -0.5})),
                      Catch::Contains("momentum -0.5 must lie in [0, 1)"));
}
