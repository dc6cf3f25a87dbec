// Backward in two passes under every plan: on each rank the input pass then the weight pass leaves
// exactly the gradients of the whole backward (bit for bit), with the collectives the passes run
// (the all-reduce of a column linear's input gradient, the gathers of Megatron-SP, Ulysses'
// all-to-alls, ring attention) in the same order on every rank.
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/thread_comm.hpp>

#include <cstring>
#include <vector>

using quintet::host;
using namespace quintet::test;

namespace {

using rank_gradients = std::vector<std::vector<float>>;  // per parameter, this rank's shard

template <class Plan>
rank_gradients gradients_on_rank(quintet::thread_comm& world, quintet::mesh_degrees degrees,
                                 bool tied, bool split) {
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  const quintet::execution<host> exec;
  mesh_type mesh(world, degrees);
  quintet::nn::parameter_registry<float, host> registry(seed, mesh, Plan{});
  auto model_config = config;
  model_config.tie_weights = tied;
  quintet::nn::gpt<float, host, Plan, mesh_type> model(registry, exec, model_config, &mesh);
  for (int m = 0; m < 2; ++m) {  // two micro-batches accumulate
    const auto batch = source.batch(m, {0, 4}, 8);
    quintet::nn::context<host> ctx;
    model.forward(ctx, batch.inputs.view(), batch.targets.view());
    if (split) {
      model.backward_input(ctx, 0.125);
      model.backward_weight(ctx);
    } else {
      model.backward(ctx, 0.125);
    }
  }
  rank_gradients out;
  for (auto& p : registry) out.emplace_back(p.grad.data(), p.grad.data() + p.grad.numel());
  return out;
}

template <class Plan>
void require_split_matches_whole(quintet::mesh_degrees degrees) {
  const int world_size = degrees.tp * degrees.sp;
  for (const bool tied : {true, false}) {
    INFO("tp " << degrees.tp << ", sp " << degrees.sp << ", tied " << tied);
    std::vector<rank_gradients> whole(world_size), split(world_size);
    quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
      whole[world.rank()] = gradients_on_rank<Plan>(world, degrees, tied, false);
      split[world.rank()] = gradients_on_rank<Plan>(world, degrees, tied, true);
    });
    for (int r = 0; r < world_size; ++r) {
      INFO("rank " << r);
      REQUIRE(whole[r].size() == split[r].size());
      for (std::size_t p = 0; p < whole[r].size(); ++p) {
        INFO("parameter " << p);
        REQUIRE(whole[r][p].size() == split[r][p].size());
        REQUIRE(std::memcmp(whole[r][p].data(), split[r][p].data(),
                            whole[r][p].size() * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("the two-pass backward equals the whole backward under every plan, bit for bit",
          "[parity][split]") {
  SECTION("tensor parallel, tp = 2") { require_split_matches_whole<tp_plan>({.tp = 2}); }
  SECTION("Megatron-SP, tp = 2") { require_split_matches_whole<megatron_sp_plan>({.tp = 2}); }
  SECTION("Ulysses with tp, 2 x 2") {
    require_split_matches_whole<ulysses_plan>({.tp = 2, .sp = 2});
  }
  SECTION("ring with tp, 2 x 2") { require_split_matches_whole<ring_plan>({.tp = 2, .sp = 2}); }
}
