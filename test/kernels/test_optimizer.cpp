// AdamW and SGD updates against the textbook formulas stepped in double over several steps, and
// the squared norm against a double sum; bad hyperparameters and mismatched state raise errors.
#include "kernel_test_support.hpp"

#include <quintet/kernels/optimizer.hpp>
#include <quintet/kernels/squared_norm.hpp>

#include <cmath>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;

TEST_CASE("adamw_update follows AdamW with bias correction and decoupled decay",
          "[kernels][optimizer]") {
  const execution<host> exec;
  const k::adamw_hyperparameters hp{
      .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  for (const shape& s : {shape{1}, shape{3, 17}, shape{33}}) {
    auto param = random_tensor<float>(s, 1);
    tensor<float, host> m(s), v(s);
    quintet::fill(m, 0.0f);
    quintet::fill(v, 0.0f);
    std::vector<double> p = to_double(param), md(p.size(), 0.0), vd(p.size(), 0.0);
    for (std::int64_t step = 1; step <= 4; ++step) {
      auto grad = random_tensor<float>(s, 10 + step);
      const double scale = step == 3 ? 0.5 : 1.0;  // a clipping factor on one step
      const auto g = to_double(grad);
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double gi = scale * g[i];
        md[i] = 0.8 * md[i] + 0.2 * gi;
        vd[i] = 0.95 * vd[i] + 0.05 * gi * gi;
        const double m_hat = md[i] / (1 - std::pow(0.8, step));
        const double v_hat = vd[i] / (1 - std::pow(0.95, step));
        p[i] -= 0.01 * (m_hat / (std::sqrt(v_hat) + 1e-6) + 0.1 * p[i]);
      }
      k::adamw_update(exec, param, grad, m, v, hp, step, scale);
    }
    INFO("shape " << s.to_string());
    require_close(param, p, 1e-6, 1e-6, "param");
    require_close(m, md, 1e-5, 1e-7, "m");
    require_close(v, vd, 1e-5, 1e-8, "v");
  }
}

TEST_CASE("sgd_update follows SGD with momentum and weight decay", "[kernels][optimizer]") {
  const execution<host> exec;
  const k::sgd_hyperparameters hp{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  auto param = random_tensor<double>(shape{5, 7}, 1);
  auto plain = random_tensor<double>(shape{5, 7}, 1);
  tensor<double, host> buffer(param.shape());
  quintet::fill(buffer, 0.0);
  std::vector<double> p = to_double(param), b(p.size(), 0.0), q = to_double(plain);
  for (int step = 1; step <= 3; ++step) {
    auto grad = random_tensor<double>(param.shape(), 20 + step);
    const auto g = to_double(grad);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double gi = 2.0 * g[i] + 0.01 * p[i];
      b[i] = 0.9 * b[i] + gi;
      p[i] -= 0.1 * b[i];
      q[i] -= 0.1 * g[i];
    }
    k::sgd_update(exec, param, grad, buffer, hp, 2.0);
    k::sgd_update(exec, plain, grad, k::sgd_hyperparameters{.lr = 0.1});
  }
  require_close(param, p, 1e-14, 1e-14, "sgd with momentum");
  require_close(buffer, b, 1e-14, 1e-14, "momentum buffer");
  require_close(plain, q, 1e-14, 1e-14, "plain sgd");
}

TEST_CASE("squared_norm sums squares in double", "[kernels][optimizer]") {
  const execution<host> exec;
  auto x = random_tensor<float>(shape{1000, 33}, 3);
  double want = 0;
  for (const double v : to_double(x)) want += v * v;
  REQUIRE(k::squared_norm(exec, x) == Approx(want).epsilon(1e-12));
  auto h = random_tensor<quintet::bf16>(shape{17}, 4);
  double want_h = 0;
  for (const double v : to_double(h)) want_h += v * v;
  REQUIRE(k::squared_norm(exec, h) == Approx(want_h).epsilon(1e-12));
}

TEST_CASE("optimizer kernels reject bad hyperparameters and mismatched state",
          "[kernels][optimizer][errors]") {
  const execution<host> exec;
  tensor<float, host> p(shape{4}), g(shape{4}), m(shape{4}), v(shape{5});
  quintet::fill(p, 1.0f);
  quintet::fill(g, 1.0f);
  quintet::fill(m, 0.0f);
  REQUIRE_THROWS_WITH(k::adamw_update(exec, p, g, m, v, {}, 1),
                      Catch::Contains("v has shape (5,), expected (4,)"));
  REQUIRE_THROWS_WITH(k::adamw_update(exec, p, g, m, m, {}, 0),
                      Catch::Contains("step count starts at 1, got 0"));
  REQUIRE_THROWS_WITH(k::adamw_update(exec, p, g, m, m, {.beta1 = 1.0}, 1),
                      Catch::Contains("beta1 1 and beta2 0.999 must be in [0, 1)"));
  REQUIRE_THROWS_WITH(k::sgd_update(exec, p, g, {.momentum = 0.9}),
                      Catch::Contains("momentum 0.9 needs a momentum buffer"));
  tensor<float, host> g_long(shape{5});
  REQUIRE_THROWS_WITH(k::sgd_update(exec, p, g_long, {}),
                      Catch::Contains("equal shapes") && Catch::Contains("(5,)"));
}
