// MFU arithmetic against a hand computation: the default train_gpt model's parameters counted by
// hand, 6N + 12 L h s, FLOP/s and utilisation; N the same under tensor parallelism (a padded
// vocabulary counts its real rows only); the matmul probe's rate is its products' FLOPs over time.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/matmul_probe.hpp>
#include <quintet/train/model_flops.hpp>

#include <cstdint>
#include <vector>

using quintet::host;
namespace par = quintet::parallel;

namespace {

const quintet::execution<host> exec;

}  // namespace

TEST_CASE("model FLOPs per token and MFU against a hand computation", "[train][mfu]") {
  // train_gpt's default model: vocabulary 16, 2 layers, d 64, 4 heads, MLP 256, tied head, seq 64.
  const quintet::nn::gpt_config config{
      .vocab = 16, .max_seq = 64, .layers = 2, .d_model = 64, .heads = 4};
  quintet::nn::parameter_registry<float, host> registry(1);
  quintet::nn::gpt<float, host> model(registry, exec, config);
  // By hand: token table 16 x 64 = 1024, positions 64 x 64 = 4096, final norm 2 x 64 = 128;
  // per block: two norms 256, qkv 64 x 192 + 192 = 12480, attention proj 64 x 64 + 64 = 4160,
  // fc 64 x 256 + 256 = 16640, MLP proj 256 x 64 + 64 = 16448: 49984. Total 1024 + 4096 + 128 +
  // 2 x 49984 = 105216.
  const std::int64_t n = 105216;
  CHECK(quintet::train::model_parameter_count(registry) == n);
  CHECK(registry.global_numel() == n);
  // 6 x 105216 + 12 x 2 x 64 x 64 = 631296 + 98304 = 729600 FLOPs per token.
  const double per_token = quintet::train::model_flops_per_token(n, 2, 64, 64);
  CHECK(per_token == 729600.0);
  // 30,000 tokens/s: 21.888 GFLOP/s; against a 100 GFLOP/s peak, 21.888%.
  const double flops = quintet::train::model_flops_per_second(per_token, 30000.0);
  CHECK(flops == Approx(21.888e9).epsilon(1e-15));
  CHECK(quintet::train::model_flops_utilization(flops, 100e9) == Approx(0.21888).epsilon(1e-15));
  REQUIRE_THROWS_WITH(quintet::train::model_flops_utilization(flops, 0.0),
                      Catch::Contains("the peak 0 FLOP/s must be positive"));
}

TEST_CASE("N counts each parameter once whatever the plan", "[train][mfu][parallel]") {
  // Vocabulary 10 over tp = 4 is stored padded to 12 rows: N counts 10.
  const quintet::nn::gpt_config config{
      .vocab = 10, .max_seq = 8, .layers = 1, .d_model = 16, .heads = 4, .tie_weights = false};
  quintet::nn::parameter_registry<float, host> serial(1);
  quintet::nn::gpt<float, host> serial_model(serial, exec, config);
  const std::int64_t expected = quintet::train::model_parameter_count(serial);
  using plan = quintet::plan<par::tp<par::megatron_1d>>;
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  std::vector<std::int64_t> counts(4), stored(4);
  quintet::thread_world{4}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> rank_exec(1);
    mesh_type mesh(world, {.tp = 4});
    quintet::nn::parameter_registry<float, host> registry(1, mesh, plan{});
    quintet::nn::gpt<float, host, plan, mesh_type> model(registry, rank_exec, config, &mesh);
    counts[world.rank()] = quintet::train::model_parameter_count(registry);
    stored[world.rank()] = registry.global_numel();
  });
  for (int r = 0; r < 4; ++r) {
    CHECK(counts[r] == expected);
    // The stored (padded) shapes hold 2 more rows of the token table and of the untied head.
    CHECK(stored[r] == expected + 2 * 2 * 16);
  }
}

TEST_CASE("the matmul probe reports its fastest round's FLOPs over its time", "[train][mfu]") {
  const auto probe = quintet::train::probe_matmul_rate(exec, 64, 0.01);
  CHECK(probe.size == 64);
  CHECK(probe.products >= 5);  // five rounds of at least one product
  CHECK(probe.threads == 1);
  CHECK(probe.seconds >= 0.01);
  // The fastest round is at least the mean rate, and no round beats the fastest product (which
  // cannot take under a nanosecond per multiply-add here).
  const double mean = 2.0 * 64 * 64 * 64 * double(probe.products) / probe.seconds;
  CHECK(probe.flops_per_second >= mean * (1 - 1e-12));
  CHECK(probe.flops_per_second < 2.0 * 64 * 64 * 64 * 1e9);
}
