// Sequence parallelism proven by parity with the serial GPT: Megatron-SP on the tp group,
// DeepSpeed-Ulysses and ring attention on the sp axis, alone and with tp, up to 8 thread ranks;
// the same global batch, K = 5 AdamW steps, every step's loss and every parameter shard compared
// with the serial run (tolerance argued in test_tensor_parallel.cpp: sequence parallelism, too,
// changes only the order of sums — partial gradients summed over ranks, attention over key blocks
// merged). Then each style's traffic per layer against its formula, the activation memory per
// layer, and the bad input each style refuses.
#include <catch2/catch.hpp>

#include "gpt_measure.hpp"
#include "gpt_parity.hpp"

#include <quintet/comm/thread_comm.hpp>

#include <vector>

using quintet::host;
using quintet::shape;
using namespace quintet::test;

namespace {

template <class Plan>
std::vector<run_result> run_plan(quintet::mesh_degrees degrees, const parity_setup& setup = {}) {
  const int world_size = degrees.tp * degrees.sp;
  std::vector<run_result> per_rank(world_size);
  quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
    per_rank[world.rank()] = parallel_rank<Plan>(world, degrees, setup);
  });
  return per_rank;
}

template <class Plan>
void require_plan_matches_serial(const run_result& serial, quintet::mesh_degrees degrees,
                                 const parity_setup& setup = {}) {
  INFO("tp = " << degrees.tp << ", sp = " << degrees.sp);
  require_matches_serial(serial, run_plan<Plan>(degrees, setup));
}

}  // namespace

TEST_CASE("Megatron sequence parallel GPT matches the serial GPT step by step",
          "[parity][sequence][megatron_sp]") {
  const run_result serial = serial_run();
  for (const int tp : {2, 4}) require_plan_matches_serial<megatron_sp_plan>(serial, {.tp = tp});
}

TEST_CASE("every plan matches the serial GPT with an untied head and padding targets",
          "[parity][sequence]") {
  // The untied head is a column_linear over the padded vocabulary; padding targets leave rows,
  // and under sp = 4 some ranks' rows, counting nothing in the loss.
  parity_setup setup{.ignore_some_targets = true};
  setup.model.tie_weights = false;
  const run_result serial = serial_run(setup);
  require_plan_matches_serial<tp_plan>(serial, {.tp = 4}, setup);
  require_plan_matches_serial<megatron_sp_plan>(serial, {.tp = 2}, setup);
  require_plan_matches_serial<ulysses_plan>(serial, {.tp = 2, .sp = 2}, setup);
  require_plan_matches_serial<ring_plan>(serial, {.sp = 4}, setup);
  require_plan_matches_serial<ring_plan>(serial, {.tp = 2, .sp = 2}, setup);
}

TEST_CASE("sequence parallel plans of degree 1 are bit-identical to the serial GPT",
          "[parity][sequence]") {
  const run_result serial = serial_run();
  const auto require_one_identical = [&](const std::vector<run_result>& ranks) {
    REQUIRE(ranks.size() == 1);
    require_identical(serial, ranks[0]);
  };
  require_one_identical(run_plan<megatron_sp_plan>({}));
  require_one_identical(run_plan<ulysses_plan>({}));
  require_one_identical(run_plan<ring_plan>({}));
}

TEST_CASE("Ulysses GPT matches the serial GPT step by step", "[parity][sequence][ulysses]") {
  const run_result serial = serial_run();
  using ulysses_only = quintet::plan<par::sp<par::ulysses>>;
  for (const int sp : {2, 4}) require_plan_matches_serial<ulysses_only>(serial, {.sp = sp});
  require_plan_matches_serial<ulysses_plan>(serial, {.tp = 2, .sp = 2});
  require_plan_matches_serial<ulysses_plan>(serial, {.tp = 2, .sp = 4});
  require_plan_matches_serial<ulysses_plan>(serial, {.tp = 4, .sp = 2});
}

TEST_CASE("ring attention GPT matches the serial GPT step by step", "[parity][sequence][ring]") {
  const run_result serial = serial_run();
  using ring_only = quintet::plan<par::sp<par::ring>>;
  for (const int sp : {2, 4}) require_plan_matches_serial<ring_only>(serial, {.sp = sp});
  require_plan_matches_serial<ring_plan>(serial, {.tp = 2, .sp = 2});
  require_plan_matches_serial<ring_plan>(serial, {.tp = 2, .sp = 4});
}

namespace {

// The parity batch: b = 4 sequences of s = 8 tokens, h = d_model, a = heads.
constexpr std::int64_t b = 4, s = 8;
const std::int64_t h = config.d_model, a = config.heads;
const std::int64_t bsh_bytes = b * s * h * 4;

quintet::comm_tally share(const rank_measure& two, const rank_measure& one, bool forward,
                          const char* axis, quintet::comm_operation op) {
  return forward ? layer_share(two.forward, one.forward, axis, op)
                 : layer_share(two.backward, one.backward, axis, op);
}

}  // namespace

TEST_CASE(
    "Megatron-SP moves per layer the volume of tensor parallelism as all-gathers and "
    "reduce-scatters",
    "[parity][sequence][megatron_sp][volume]") {
  using op = quintet::comm_operation;
  for (const int tp : {2, 4}) {
    INFO("tp = " << tp);
    const auto one = measure<megatron_sp_plan>({.tp = tp}, 1);
    const auto two = measure<megatron_sp_plan>({.tp = tp}, 2);
    const double gather_factor = (tp - 1.0) / tp;
    for (int r = 0; r < tp; ++r) {
      INFO("rank " << r);
      // Forward: all-gather before each column_linear, reduce-scatter after each row_linear, each
      // of the whole (b, s, h): bus volume 4 (t-1)/t bsh, the 2 all-reduces' 2 x 2 (t-1)/t bsh.
      const auto gathers = share(two[r], one[r], true, "tp", op::all_gather);
      const auto scatters = share(two[r], one[r], true, "tp", op::reduce_scatter);
      CHECK(gathers.calls == 2);
      CHECK(gathers.bytes == 2 * bsh_bytes);
      CHECK(scatters.calls == 2);
      CHECK(scatters.bytes == 2 * bsh_bytes);
      CHECK(gathers.bus_bytes + scatters.bus_bytes == Approx(2 * 2 * bsh_bytes * gather_factor));
      CHECK(share(two[r], one[r], true, "tp", op::all_reduce).calls == 0);
      // Backward: the mirror image (reduce-scatter of each column_linear's dx, all-gather of each
      // row_linear's dy) plus one all-gather per column_linear to rebuild the input it kept only
      // a block of (Korthikanti et al.'s choice: 1/t of the memory for 1.5x the traffic).
      const auto back_gathers = share(two[r], one[r], false, "tp", op::all_gather);
      const auto back_scatters = share(two[r], one[r], false, "tp", op::reduce_scatter);
      CHECK(back_scatters.calls == 2);
      CHECK(back_scatters.bytes == 2 * bsh_bytes);
      CHECK(back_gathers.calls == 2 + 2);
      CHECK(back_gathers.bytes == (2 + 2) * bsh_bytes);
      CHECK(share(two[r], one[r], false, "tp", op::all_reduce).calls == 0);
    }
  }
}

TEST_CASE("Ulysses moves per layer all-to-alls of 4 b*s*h / (sp*tp) per rank",
          "[parity][sequence][ulysses][volume]") {
  using op = quintet::comm_operation;
  for (const auto degrees : {quintet::mesh_degrees{.sp = 2}, quintet::mesh_degrees{.sp = 4},
                             quintet::mesh_degrees{.tp = 2, .sp = 2}}) {
    const int tp = degrees.tp, sp = degrees.sp;
    INFO("tp = " << tp << ", sp = " << sp);
    const auto one = measure<ulysses_plan>(degrees, 1), two = measure<ulysses_plan>(degrees, 2);
    for (int r = 0; r < tp * sp; ++r) {
      INFO("rank " << r);
      for (const bool forward : {true, false}) {
        INFO((forward ? "forward" : "backward"));
        // q, k, v (one fused all-to-all of 3 bsh / (sp tp)) to head shards, the attention output
        // (bsh / (sp tp)) back; backward the same two the other way.
        const auto exchanged = share(two[r], one[r], forward, "sp", op::all_to_all);
        CHECK(exchanged.calls == 2);
        CHECK(exchanged.bytes == 4 * bsh_bytes / (sp * tp));
        CHECK(exchanged.bus_bytes == Approx(4.0 * bsh_bytes / (sp * tp) * (sp - 1) / sp));
        // Tensor parallelism on each rank's rows: 2 all-reduces of b (s / sp) h per direction (at
        // tp = 1 they are still called, and move nothing: bus bytes 0).
        const auto reduced = share(two[r], one[r], forward, "tp", op::all_reduce);
        CHECK(reduced.calls == 2);
        CHECK(reduced.bytes == 2 * bsh_bytes / sp);
        CHECK(reduced.bus_bytes == Approx(2.0 * bsh_bytes / sp * 2.0 * (tp - 1) / tp));
      }
    }
  }
}

TEST_CASE("ring attention passes sp - 1 key and value blocks per layer forward, sp backward",
          "[parity][sequence][ring][volume]") {
  using op = quintet::comm_operation;
  for (const auto degrees : {quintet::mesh_degrees{.sp = 2}, quintet::mesh_degrees{.sp = 4},
                             quintet::mesh_degrees{.tp = 2, .sp = 2}}) {
    const int tp = degrees.tp, sp = degrees.sp;
    INFO("tp = " << tp << ", sp = " << sp);
    const auto one = measure<ring_plan>(degrees, 1), two = measure<ring_plan>(degrees, 2);
    // A rank's K and V: 2 x (b, s / sp, h / tp) fp32.
    const std::int64_t kv_bytes = 2 * bsh_bytes / (sp * tp);
    for (int r = 0; r < tp * sp; ++r) {
      INFO("rank " << r);
      const auto sent = share(two[r], one[r], true, "sp", op::send);
      CHECK(sent.calls == sp - 1);
      CHECK(sent.bytes == (sp - 1) * kv_bytes);
      CHECK(share(two[r], one[r], true, "sp", op::recv).bytes == (sp - 1) * kv_bytes);
      // Backward: K and V go around again with the gradients (dK, dV) gathered for them so far,
      // sp - 1 passes of 4 blocks, then one pass of the finished (dK, dV) brings them home.
      const auto back = share(two[r], one[r], false, "sp", op::send);
      CHECK(back.calls == sp);
      CHECK(back.bytes == (sp - 1) * 2 * kv_bytes + kv_bytes);
    }
  }
}

// Activation bytes one layer keeps per rank (fp32, no dropout, attention keeping its log-sum-exp
// instead of the (s, s) probabilities), with an MLP of H hidden units (H = 4h gives 12 and 16):
//   tp only            4 bsh + (4 bsh + 2 bsH) / t + 4bs + abs/t
//   megatron_sp        (8 bsh + 2 bsH + 4bs + abs) / t
//   ring               4 bsh / p + (4 bsh + 2 bsH) / (t p) + 4bs / p + abs / (t p)
//   ulysses            the same + bsh / (t p): the attention output is kept in the head layout for
//                      attention's backward and in the sequence layout for the projection's dW
// against Korthikanti et al.'s 16-bit sbh (10 + 24/t + 5as/h) and sbh (34 + 5as/h) / t bytes:
// docs/sequence_parallel.md sets them side by side.
TEST_CASE("activation memory per layer follows the formula of each plan",
          "[parity][sequence][memory]") {
  const auto layer_bytes = [](const auto& two, const auto& one) {
    return static_cast<std::int64_t>(two[0].context_bytes - one[0].context_bytes);
  };
  const std::int64_t bs = b * s, bsh = b * s * h, bsH = b * s * config.hidden(), abs = a * b * s;
  for (const int t : {1, 2, 4}) {
    INFO("t = " << t);
    CHECK(layer_bytes(measure<tp_plan>({.tp = t}, 2), measure<tp_plan>({.tp = t}, 1)) ==
          4 * (4 * bsh + (4 * bsh + 2 * bsH) / t + 4 * bs + abs / t));
    CHECK(layer_bytes(measure<megatron_sp_plan>({.tp = t}, 2),
                      measure<megatron_sp_plan>({.tp = t}, 1)) ==
          4 * (8 * bsh + 2 * bsH + 4 * bs + abs) / t);
  }
  for (const auto degrees :
       {quintet::mesh_degrees{.sp = 2}, quintet::mesh_degrees{.tp = 2, .sp = 2},
        quintet::mesh_degrees{.sp = 4}, quintet::mesh_degrees{.tp = 2, .sp = 4}}) {
    const std::int64_t t = degrees.tp, p = degrees.sp;
    INFO("t = " << t << ", p = " << p);
    const std::int64_t ring =
        4 * (4 * bsh / p + (4 * bsh + 2 * bsH) / (t * p) + 4 * bs / p + abs / (t * p));
    CHECK(layer_bytes(measure<ring_plan>(degrees, 2), measure<ring_plan>(degrees, 1)) == ring);
    CHECK(layer_bytes(measure<ulysses_plan>(degrees, 2), measure<ulysses_plan>(degrees, 1)) ==
          ring + 4 * bsh / (t * p));
  }
}

TEST_CASE("the vocabulary-parallel head never holds the whole logits", "[parity][tensor]") {
  for (const int tp : {2, 4}) {
    INFO("tp = " << tp);
    std::vector<shape> logits(tp);  // checked by the main thread: Catch2 v2 is not thread-safe
    quintet::thread_world{tp}.run([&](quintet::thread_comm& world) {
      using mesh_type = quintet::device_mesh<quintet::thread_comm>;
      const quintet::execution<host> exec;
      mesh_type mesh(world, {.tp = tp});
      quintet::nn::parameter_registry<float, host> registry(
          seed, mesh, tp_plan{});
      quintet::nn::gpt<float, host, tp_plan, mesh_type> model(registry, exec, config, &mesh);
      const auto batch = source.batch(0, {0, 4}, 8);
      quintet::nn::context<host> ctx;
      model.forward(ctx, batch.inputs.view(), batch.targets.view());
      logits[world.rank()] = ctx.get<float>("lm_head.logits").shape();
    });
    // 10 ids padded to a multiple of tp: (b, s, 12 / tp) or (b, s, 10 / 2).
    const std::int64_t columns = (tp == 2 ? 10 : 12) / tp;
    for (const shape& each : logits) REQUIRE(each == shape{b, s, columns});
  }
}

TEST_CASE("sequence parallel plans refuse what does not divide", "[parity][sequence]") {
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  const auto build = [](auto plan_tag, quintet::mesh_degrees degrees, quintet::nn::gpt_config cfg,
                        std::int64_t seq) {
    using Plan = decltype(plan_tag);
    quintet::thread_world{degrees.tp * degrees.sp}.run([&](quintet::thread_comm& world) {
      const quintet::execution<host> exec;
      mesh_type mesh(world, degrees);
      quintet::nn::parameter_registry<float, host> registry(
          seed, mesh, Plan{});
      quintet::nn::gpt<float, host, Plan, mesh_type> model(registry, exec, cfg, &mesh);
      const auto batch = source.batch(0, {0, 2}, seq);
      quintet::nn::context<host> ctx;
      model.forward(ctx, batch.inputs.view(), batch.targets.view());
    });
  };
  auto four_heads = config;
  four_heads.heads = 4;  // 4 heads over tp x sp = 2 x 4 = 8 ranks
  SECTION("Ulysses heads over tp x sp") {
    REQUIRE_THROWS_WITH(build(ulysses_plan{}, {.tp = 2, .sp = 4}, four_heads, 8),
                        Catch::Contains("4 heads do not divide over tp x sp = 2 x 4"));
  }
  SECTION("Ulysses sequence over sp") {
    REQUIRE_THROWS_WITH(build(ulysses_plan{}, {.sp = 4}, config, 6),
                        Catch::Contains("a sequence of 6 tokens does not split over 4 ranks"));
  }
  SECTION("ring sequence over 2 sp zig-zag chunks") {
    REQUIRE_THROWS_WITH(
        build(ring_plan{}, {.sp = 2}, config, 6),
        Catch::Contains("sequence of 6 tokens does not split into 2 x sp = 4 zig-zag chunks"));
  }
  SECTION("Megatron-SP sequence over tp") {
    REQUIRE_THROWS_WITH(build(megatron_sp_plan{}, {.tp = 4}, config, 6),
                        Catch::Contains("a sequence of 6 tokens does not split over 4 ranks"));
  }
  SECTION("a mesh axis the plan does not use") {
    REQUIRE_THROWS_WITH(build(tp_plan{}, {.tp = 2, .sp = 2}, config, 8),
                        Catch::Contains("the mesh has sp = 2 but the plan has no"));
    REQUIRE_THROWS_WITH(build(megatron_sp_plan{}, {.tp = 2, .sp = 2}, config, 8),
                        Catch::Contains("megatron_sp shards the sequence on tp and needs sp = 1"));
  }
}

TEST_CASE("ranks given different micro-batches are refused on every rank", "[parity][sequence]") {
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  const auto run = [](auto plan_tag, quintet::mesh_degrees degrees) {
    using Plan = decltype(plan_tag);
    std::vector<int> refused(degrees.tp * degrees.sp, 0);
    quintet::thread_world{degrees.tp * degrees.sp}.run([&](quintet::thread_comm& world) {
      const quintet::execution<host> exec;
      mesh_type mesh(world, degrees);
      quintet::nn::parameter_registry<float, host> registry(
          seed, mesh, Plan{});
      quintet::nn::gpt<float, host, Plan, mesh_type> model(registry, exec, config, &mesh);
      // Each rank reads its own rows, as a loader for other libraries' sequence parallelism would.
      const auto batch = source.batch(world.rank(), {0, 4}, 8);
      quintet::nn::context<host> ctx;
      try {
        model.forward(ctx, batch.inputs.view(), batch.targets.view());
      } catch (const quintet::error& e) {
        refused[world.rank()] =
            std::string(e.what()).find("were given different micro-batches") != std::string::npos;
      }
    });
    return refused;
  };
  CHECK(run(ring_plan{}, {.sp = 2}) == std::vector<int>{1, 1});
  CHECK(run(tp_plan{}, {.tp = 2}) == std::vector<int>{1, 1});
  CHECK(run(ulysses_plan{}, {.tp = 2, .sp = 2}) == std::vector<int>{1, 1, 1, 1});
}
