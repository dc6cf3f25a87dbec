// Tensor parallelism (Megatron-LM 1D) proven by parity with the serial GPT: the same global batch,
// K = 5 AdamW steps, every step's loss and every parameter shard compared with the serial run.
//
// Tolerance (fp32): tensor parallelism changes only the order of sums — a row_linear adds tp
// partial products, a column_linear's input gradient sums tp contributions — so each reduction
// differs by a few ulp (~1e-7 relative). Over 5 steps these stay below 1e-5 relative in the loss;
// AdamW normalises updates (m / sqrt(v)), so a parameter moves at most ~lr per step and its
// difference stays within 1e-4 relative or 2e-6 absolute at lr = 1e-3.
#include <catch2/catch.hpp>

#include "gpt_measure.hpp"
#include "gpt_parity.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>

#include <vector>

using quintet::host;
using quintet::shape;

namespace {

using namespace quintet::test;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;

std::vector<run_result> tensor_parallel_run(int tp) {
  std::vector<run_result> per_rank(tp);
  quintet::thread_world{tp}.run(
      [&](quintet::thread_comm& world) { per_rank[world.rank()] = tensor_parallel_rank(world); });
  return per_rank;
}

}  // namespace

TEST_CASE("tensor parallel GPT matches the serial GPT step by step", "[parity][tensor]") {
  const run_result serial = serial_run();
  for (const int tp : {2, 4}) {
    INFO("tp = " << tp);
    const auto ranks = tensor_parallel_run(tp);
    require_matches_serial(serial, ranks);
    // Sharded parameters really are sharded.
    const auto local = [&](const char* name) { return shard_of(ranks[0], name).where.local_shape(); };
    CHECK(local("blocks.0.mlp.fc.weight") == shape{32 / tp, 16});
    CHECK(local("blocks.0.attn.qkv.weight") == shape{3, 16 / tp, 16});
    CHECK(local("blocks.0.attn.proj.weight") == shape{16, 16 / tp});
    // The vocabulary of 10 is padded to a multiple of tp and split: 5 ids per rank at tp = 2,
    // 3 at tp = 4 (12 ids, the last rank holding 1 real id and 2 padding rows).
    CHECK(local("embedding.token_weight") == shape{(tp == 2 ? 10 : 12) / tp, 16});
    // Its logical shape stays the vocabulary's, whatever the padding.
    CHECK(shard_of(ranks[0], "embedding.token_weight").logical == shape{10, 16});
  }
}

TEST_CASE("a tensor-parallel plan of degree 1 is bit-identical to the serial GPT",
          "[parity][tensor]") {
  const run_result serial = serial_run();
  const auto ranks = tensor_parallel_run(1);
  require_identical(serial, ranks[0]);
}

TEST_CASE("tensor parallelism rejects heads that do not divide over tp", "[parity][tensor]") {
  REQUIRE_THROWS_WITH(quintet::thread_world{3}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec;
    mesh_type mesh(world, {.tp = 3});
    quintet::nn::parameter_registry<float, host> registry(
        1, mesh, tp_plan{});
    quintet::nn::gpt<float, host, tp_plan, mesh_type> model(
        registry, exec, {.vocab = 8, .max_seq = 8, .layers = 1, .d_model = 12, .heads = 4}, &mesh);
  }),
                      Catch::Contains("4 heads do not divide over tp = 3"));
}

TEST_CASE("tensor parallelism moves 2 all-reduces of b*s*h forward and 2 backward per layer",
          "[parity][tensor][volume]") {
  using quintet::comm_operation;
  constexpr int tp = 2;
  const auto one = measure<tp_plan>({.tp = tp}, 1), two = measure<tp_plan>({.tp = tp}, 2);
  // b * s * h elements of fp32 per all-reduce; bus bytes 2(n-1)/n of that.
  const std::int64_t bsh_bytes = 4 * 8 * config.d_model * 4, rows = 4 * 8;
  for (int r = 0; r < tp; ++r) {
    INFO("rank " << r);
    for (tally_map rank_measure::*direction : {&rank_measure::forward, &rank_measure::backward}) {
      const auto layer =
          layer_share(two[r].*direction, one[r].*direction, "tp", comm_operation::all_reduce);
      CHECK(layer.calls == 2);
      CHECK(layer.bytes == 2 * bsh_bytes);
      CHECK(layer.bus_bytes == Approx(2 * bsh_bytes * 2.0 * (tp - 1) / tp));
    }
    // Outside the blocks: the forward checks that the ranks share the batch (2 int64), the
    // vocabulary-parallel embedding sums its partial rows (b*s*h), the loss all-reduces the row
    // maxima (rows fp32) and the (sum of exponentials, target logit) pairs (2 rows fp32);
    // backward, the tied head sums its input gradient (b*s*h).
    const auto forward = one[r].forward.at({"tp", comm_operation::all_reduce});
    CHECK(forward.calls == 2 + 1 + 1 + 2);
    CHECK(forward.bytes == 2 * bsh_bytes + 16 + bsh_bytes + rows * 4 + 2 * rows * 4);
    const auto backward = one[r].backward.at({"tp", comm_operation::all_reduce});
    CHECK(backward.calls == 2 + 1);
    CHECK(backward.bytes == 2 * bsh_bytes + bsh_bytes);
    CHECK(one[r].forward.size() == 1);  // nothing but those all-reduces, on tp only
    CHECK(one[r].backward.size() == 1);
  }
}

TEST_CASE("column_linear rejects output groups that do not split the features",
          "[parity][tensor]") {
  REQUIRE_THROWS_WITH(
      quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
        const quintet::execution<host> exec;
        quintet::nn::parameter_registry<float, host> registry(1);
        quintet::parallel::column_linear<float, host, quintet::thread_comm> layer(
            registry, exec, world, "qkv", 4, 12, {.output_groups = 0});
      }),
      Catch::Contains("column_linear 'qkv': 12 output features do not split into 0 groups"));
}
