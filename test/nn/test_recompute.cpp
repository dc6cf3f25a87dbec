// Activation recomputation per block (none, selective, full): the same losses and gradients as
// keeping everything, bit for bit, serially and under every plan on thread ranks, whole and in
// two passes, with ZeRO-3's acquire/release hooks; the collectives the recomputation re-issues,
// counted; and the bytes a block keeps after forward against the formula derived in docs/nn.md
// ("Activation recomputation").
#include <catch2/catch.hpp>

#include "../parallel/gpt_parity.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/recompute_mode.hpp>
#include <quintet/nn/transformer_block.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/synchronize_gradients.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/train/gpt_pipeline.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

using quintet::host;
using quintet::shape;
using quintet::nn::recompute_mode;
using namespace quintet::test;

namespace {

constexpr recompute_mode all_modes[] = {recompute_mode::none, recompute_mode::selective,
                                        recompute_mode::full};

// What a run leaves to compare: every step's loss and every parameter's gradient (this rank's
// shard) after every step, as raw floats compared bit for bit.
struct run_bits {
  std::vector<double> losses;
  std::vector<std::vector<float>> gradients;  // step-major: (steps x parameters)
  std::vector<std::string> names;
};

void require_same_bits(const run_bits& expected, const run_bits& got) {
  REQUIRE(got.losses.size() == expected.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    INFO("step " << i);
    // Exact: memcmp, so a NaN on both sides still counts as a difference only if its bits differ.
    REQUIRE(std::memcmp(&got.losses[i], &expected.losses[i], sizeof(double)) == 0);
  }
  REQUIRE(got.gradients.size() == expected.gradients.size());
  for (std::size_t i = 0; i < got.gradients.size(); ++i) {
    INFO("gradient " << i << " (" << expected.names[i % expected.names.size()] << ")");
    REQUIRE(got.gradients[i].size() == expected.gradients[i].size());
    REQUIRE(std::memcmp(got.gradients[i].data(), expected.gradients[i].data(),
                        got.gradients[i].size() * sizeof(float)) == 0);
  }
}

// Blocks' entries of a context: name -> bytes (0 for an alias).
std::map<std::string, std::size_t> block_entries(const quintet::nn::context<host>& ctx) {
  std::map<std::string, std::size_t> out;
  ctx.for_each([&](const quintet::nn::context_entry& e) {
    if (e.name.starts_with("blocks.")) out[std::string(e.name)] = e.is_alias() ? 0 : e.bytes;
  });
  return out;
}

// Bytes held by the entries of block 0.
std::size_t block0_bytes(const quintet::nn::context<host>& ctx) {
  std::size_t total = 0;
  for (const auto& [name, bytes] : block_entries(ctx))
    if (name.starts_with("blocks.0.")) total += bytes;
  return total;
}

// Three steps of the GPT of `Plan` on one rank: two micro-batches each, backward whole or in two
// passes, the gradients synchronised and a plain SGD step between steps (so every step starts from
// other parameters). Checks that after a whole backward the blocks' entries are exactly those
// forward kept (what was recomputed is gone), after the two passes some of them (none when the
// blocks recompute fully; all in mode none); `ok` turns false otherwise (threads may not use
// Catch2's macros).
template <class Plan, class Mesh>
run_bits run_steps(Mesh* mesh, quintet::nn::parameter_registry<float, host>& registry,
                   quintet::nn::gpt_config model_config, recompute_mode mode, bool split, bool& ok,
                   int threads = 1, std::int64_t seq = 8) {
  const quintet::execution<host> exec(threads);
  model_config.recompute = mode;
  quintet::nn::gpt<float, host, Plan, Mesh> model(registry, exec, model_config, mesh);
  run_bits out;
  for (auto& p : registry) out.names.push_back(p.name);
  for (int step = 0; step < 3; ++step) {
    registry.zero_grad();
    double loss = 0;
    for (int m = 0; m < 2; ++m) {
      const auto batch = source.batch(2 * step + m, {0, 4}, seq);
      quintet::nn::context<host> ctx;
      loss += model.forward(ctx, batch.inputs.view(), batch.targets.view()).loss_sum;
      const auto kept = block_entries(ctx);
      if (split) {
        model.backward_input(ctx, 0.01);
        model.backward_weight(ctx);
      } else {
        model.backward(ctx, 0.01);
      }
      const auto left = block_entries(ctx);
      if (!split || mode == recompute_mode::none) {
        ok = ok && left == kept;
      } else {
        for (const auto& entry : left) ok = ok && kept.contains(entry.first);
        ok = ok && left.size() < kept.size() && (mode != recompute_mode::full || left.empty());
      }
    }
    out.losses.push_back(loss);
    if constexpr (quintet::mesh_like<Mesh>) par::synchronize_gradients(registry, *mesh);
    for (auto& p : registry) {
      out.gradients.emplace_back(p.grad.data(), p.grad.data() + p.grad.numel());
      for (std::int64_t i = 0; i < p.value.numel(); ++i)
        p.value.data()[i] -= 0.5f * p.grad.data()[i];
    }
  }
  return out;
}

run_bits serial_bits(quintet::nn::gpt_config model_config, recompute_mode mode, bool split,
                     bool& ok, int threads = 1, std::int64_t seq = 8) {
  quintet::nn::parameter_registry<float, host> registry(seed);
  return run_steps<quintet::serial_plan, par::no_mesh>(nullptr, registry, model_config, mode, split,
                                                       ok, threads, seq);
}

// Every rank's bits for a run of `Plan` on thread ranks.
template <class Plan>
std::vector<run_bits> plan_bits(quintet::mesh_degrees degrees, recompute_mode mode, bool split,
                                bool& ok) {
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  const int world_size = degrees.tp * degrees.sp;
  std::vector<run_bits> out(world_size);
  std::vector<char> fine(world_size, 1);
  quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
    mesh_type mesh(world, degrees);
    quintet::nn::parameter_registry<float, host> registry(seed, mesh, Plan{});
    bool mine = true;
    out[world.rank()] = run_steps<Plan>(&mesh, registry, config, mode, split, mine);
    fine[world.rank()] = mine;
  });
  for (const char f : fine) ok = ok && f != 0;
  return out;
}

template <class Plan>
void require_plan_modes_identical(quintet::mesh_degrees degrees) {
  bool ok = true;
  const auto reference = plan_bits<Plan>(degrees, recompute_mode::none, false, ok);
  for (const recompute_mode mode : all_modes)
    for (const bool split : {false, true}) {
      INFO("tp " << degrees.tp << ", sp " << degrees.sp << ", recompute " << name_of(mode)
                 << (split ? ", backward in two passes" : ""));
      const auto got = plan_bits<Plan>(degrees, mode, split, ok);
      REQUIRE(ok);
      for (std::size_t r = 0; r < got.size(); ++r) {
        INFO("rank " << r);
        require_same_bits(reference[r], got[r]);
      }
    }
}

}  // namespace

TEST_CASE("recompute modes parse and print as the command line writes them", "[nn][recompute]") {
  for (const recompute_mode mode : all_modes)
    CHECK(quintet::nn::parse_recompute_mode(name_of(mode)) == mode);
  CHECK(name_of(recompute_mode::selective) == "selective");
  CHECK(quintet::nn::gpt_config{}.recompute == recompute_mode::none);
  CHECK_FALSE(quintet::nn::try_parse_recompute_mode("Full").has_value());
  REQUIRE_THROWS_WITH(quintet::nn::parse_recompute_mode("attention"),
                      Catch::Contains("recompute mode 'attention': expected none, selective or "
                                      "full"));
}

TEST_CASE("every recompute mode gives the serial GPT's losses and gradients bit for bit",
          "[nn][recompute]") {
  for (const bool tied : {true, false}) {
    auto model_config = config;
    model_config.tie_weights = tied;
    model_config.layers = 3;
    bool ok = true;
    const run_bits reference = serial_bits(model_config, recompute_mode::none, false, ok);
    for (const recompute_mode mode : all_modes)
      for (const bool split : {false, true}) {
        INFO("tied " << tied << ", recompute " << name_of(mode)
                     << (split ? ", backward in two passes" : ""));
        const run_bits got = serial_bits(model_config, mode, split, ok);
        REQUIRE(ok);  // after backward the blocks keep what forward kept, nothing recomputed
        require_same_bits(reference, got);
      }
  }
  // Products large enough for OpenBLAS to split them over 4 threads: it splits by output blocks,
  // each sum made in one order, the same in forward and in the recomputation.
  const quintet::nn::gpt_config wide{
      .vocab = 10, .max_seq = 64, .layers = 2, .d_model = 64, .heads = 4, .mlp_hidden = 256};
  bool ok = true;
  const run_bits reference = serial_bits(wide, recompute_mode::none, false, ok, 4, 64);
  for (const recompute_mode mode : all_modes)
    for (const bool split : {false, true}) {
      INFO("4 threads, recompute " << name_of(mode) << (split ? ", backward in two passes" : ""));
      const run_bits got = serial_bits(wide, mode, split, ok, 4, 64);
      REQUIRE(ok);
      require_same_bits(reference, got);
    }
}

TEST_CASE("a recomputing stage recomputes inside the backward's acquire (ZeRO-3 hooks)",
          "[nn][recompute]") {
  // The hooks hold a parameter's values only between its piece's acquire and release and poison
  // them (NaN) otherwise, as ZeRO-3 drops the gathered values: a recomputation outside the
  // acquire would read NaN, and the gradients would differ.
  const auto run = [](recompute_mode mode, bool hooks) {
    const quintet::execution<host> exec(1);
    auto model_config = config;
    model_config.recompute = mode;
    quintet::nn::parameter_registry<float, host> registry(seed);
    quintet::nn::gpt<float, host> model(registry, exec, model_config);
    std::map<const void*, std::vector<float>> held;  // the real values, by parameter
    const auto poison = [](quintet::nn::parameter<float, host>& p) {
      for (std::int64_t i = 0; i < p.value.numel(); ++i)
        p.value.data()[i] = std::numeric_limits<float>::quiet_NaN();
    };
    if (hooks) {
      for (auto& p : registry) {
        held[&p].assign(p.value.data(), p.value.data() + p.value.numel());
        poison(p);
      }
      model.stage().on_parameter_access(
          {.acquire =
               [&](const quintet::nn::parameter_use<float, host>& now,
                   const quintet::nn::parameter_use<float, host>*) {
                 for (auto* p : now.parameters)
                   std::copy(held[p].begin(), held[p].end(), p->value.data());
               },
           .release =
               [&](const quintet::nn::parameter_use<float, host>& now) {
                 for (auto* p : now.parameters) poison(*p);
               }});
    }
    registry.zero_grad();
    const auto batch = source.batch(0, {0, 4}, 8);
    quintet::nn::context<host> ctx;
    const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
    model.backward(ctx, 0.01);
    run_bits out;
    out.losses.push_back(loss.loss_sum);
    for (auto& p : registry) {
      out.names.push_back(p.name);
      out.gradients.emplace_back(p.grad.data(), p.grad.data() + p.grad.numel());
    }
    return out;
  };
  const run_bits reference = run(recompute_mode::none, false);
  REQUIRE(std::isfinite(reference.losses[0]));
  for (const recompute_mode mode : all_modes) {
    INFO("recompute " << name_of(mode));
    require_same_bits(reference, run(mode, true));
  }
}

TEST_CASE("every recompute mode gives the same bits under every plan, whole and split",
          "[parity][recompute]") {
  SECTION("tensor parallel, tp = 2") { require_plan_modes_identical<tp_plan>({.tp = 2}); }
  SECTION("Megatron-SP, tp = 2") { require_plan_modes_identical<megatron_sp_plan>({.tp = 2}); }
  SECTION("Ulysses, sp = 2") { require_plan_modes_identical<ulysses_plan>({.sp = 2}); }
  SECTION("ring, sp = 2") { require_plan_modes_identical<ring_plan>({.sp = 2}); }
  SECTION("Ulysses with tp, 2 x 2") {
    require_plan_modes_identical<ulysses_plan>({.tp = 2, .sp = 2});
  }
  SECTION("ring with tp, 2 x 2") { require_plan_modes_identical<ring_plan>({.tp = 2, .sp = 2}); }
}

// ---- Pipelines: the stages' blocks recompute, the zero-bubble schedules in two passes ----------

namespace {

struct pipeline_rank_result {
  run_bits bits;
  std::size_t peak_context_bytes = 0;
};

// Every pp rank's step of schedule `name` (p ranks, m micro-batches) over a 4-layer parity GPT.
std::vector<pipeline_rank_result> pipeline_run(const std::string& name, int p, int m,
                                               recompute_mode mode) {
  namespace pl = quintet::parallel::pipeline;
  const pl::schedule s = pl::generate(name, {.ranks = p, .micro_batches = m}, 2);
  std::vector<pipeline_rank_result> out(p);
  quintet::thread_world{p}.run([&](quintet::thread_comm& pp) {
    const quintet::execution<host> exec(1);
    auto model_config = config;
    model_config.layers = 4;
    model_config.recompute = mode;
    quintet::nn::parameter_registry<float, host> registry(seed);
    using pipeline_type = quintet::train::gpt_pipeline<float, host, quintet::thread_comm>;
    pipeline_type pipeline(registry, exec, model_config, s, pp);
    std::vector<quintet::token_batch> batches;
    for (int i = 0; i < m; ++i) batches.push_back(source.batch(0, {2 * i, 2 * i + 2}, 8));
    const auto losses = pipeline.step(
        [&](int i) {
          const auto& b = batches[static_cast<std::size_t>(i)];
          return typename pipeline_type::micro_batch{.tokens = b.inputs.view(),
                                                     .targets = b.targets.view()};
        },
        0.01);
    pipeline_rank_result& mine = out[pp.rank()];
    for (const auto& loss : losses) mine.bits.losses.push_back(loss.loss_sum);
    for (auto& p : registry) {
      mine.bits.names.push_back(p.name);
      mine.bits.gradients.emplace_back(p.grad.data(), p.grad.data() + p.grad.numel());
    }
    mine.peak_context_bytes = pipeline.runtime().stats().peak_context_bytes;
  });
  return out;
}

}  // namespace

TEST_CASE("pipeline schedules give the same bits in every recompute mode, and hold less",
          "[parity][recompute][pipeline]") {
  // 1f1b runs whole backwards; zb-h1 and zb-v the input and weight passes apart.
  for (const std::string name : {"1f1b", "zb-h1", "zb-v"}) {
    const auto reference = pipeline_run(name, 2, 3, recompute_mode::none);
    const auto selective = pipeline_run(name, 2, 3, recompute_mode::selective);
    const auto full = pipeline_run(name, 2, 3, recompute_mode::full);
    for (std::size_t r = 0; r < reference.size(); ++r) {
      INFO(name << ", rank " << r);
      require_same_bits(reference[r].bits, selective[r].bits);
      require_same_bits(reference[r].bits, full[r].bits);
      CHECK(selective[r].peak_context_bytes < reference[r].peak_context_bytes);
      // Between a zero-bubble schedule's two passes both keep what the weight pass reads (the
      // sublayers' inputs and dy): where that window is a rank's peak, full holds selective's.
      if (name == "1f1b") {
        CHECK(full[r].peak_context_bytes < selective[r].peak_context_bytes);
      } else {
        CHECK(full[r].peak_context_bytes <= selective[r].peak_context_bytes);
      }
    }
  }
}

// ---- The collectives the recomputation re-issues -------------------------------------------

namespace {

using tally_map = std::map<std::pair<std::string, quintet::comm_operation>, quintet::comm_tally>;

struct traffic {
  tally_map forward, backward;  // rank 0's
};

// One forward and backward of the parity GPT with `layers` blocks, counted on rank 0.
template <class Plan>
traffic count_traffic(quintet::mesh_degrees degrees, std::int64_t layers, recompute_mode mode) {
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  using counted_mesh = quintet::device_mesh<counted_comm>;
  traffic out;
  auto model_config = config;
  model_config.layers = layers;
  model_config.recompute = mode;
  quintet::thread_world{degrees.tp * degrees.sp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    counted_comm counted(world.split(0, world.rank()));
    counted_mesh mesh(counted, degrees);
    quintet::nn::parameter_registry<float, host> registry(seed, mesh, Plan{});
    quintet::nn::gpt<float, host, Plan, counted_mesh> model(registry, exec, model_config, &mesh);
    const auto batch = source.batch(0, {0, 4}, 8);
    counted.ledger().clear();
    quintet::nn::context<host> ctx;
    model.forward(ctx, batch.inputs.view(), batch.targets.view());
    const tally_map forward = counted.ledger().tallies();
    counted.ledger().clear();
    model.backward(ctx, 0.01);
    if (world.rank() == 0) out = {forward, counted.ledger().tallies()};
  });
  return out;
}

// a - b + c, per (axis, operation), over every key any of them has.
tally_map combine(const tally_map& a, const tally_map& b, const tally_map& c = {}) {
  std::set<tally_map::key_type> keys;
  for (const auto* m : {&a, &b, &c})
    for (const auto& [key, tally] : *m) keys.insert(key);
  const auto get = [](const tally_map& m, const tally_map::key_type& key) {
    const auto found = m.find(key);
    return found == m.end() ? quintet::comm_tally{} : found->second;
  };
  tally_map out;
  for (const auto& key : keys) {
    const auto x = get(a, key), y = get(b, key), z = get(c, key);
    const quintet::comm_tally sum{x.calls - y.calls + z.calls, x.bytes - y.bytes + z.bytes,
                                  x.bus_bytes - y.bus_bytes + z.bus_bytes};
    if (sum.calls != 0 || sum.bytes != 0) out[key] = sum;
  }
  return out;
}

std::string describe(const tally_map& m) {
  std::string text;
  for (const auto& [key, tally] : m)
    text += key.first + " " + std::string(quintet::name_of(key.second)) + ": " +
            std::to_string(tally.calls) + " calls, " + std::to_string(tally.bytes) + " bytes; ";
  return text.empty() ? "nothing" : text;
}

// One layer's traffic (the 2-layer model's minus the 1-layer model's) in each mode: forward is
// the same; full recomputation's backward adds exactly the layer's forward, selective's adds the
// attention core's (ring attention's exchanges on sp; nothing for the other styles, whose core is
// local once q, k, v are kept).
template <class Plan>
void require_recomputed_traffic(quintet::mesh_degrees degrees, bool core_communicates) {
  std::map<recompute_mode, std::pair<tally_map, tally_map>> layer;  // forward, backward
  for (const recompute_mode mode : all_modes) {
    const traffic two = count_traffic<Plan>(degrees, 2, mode);
    const traffic one = count_traffic<Plan>(degrees, 1, mode);
    layer[mode] = {combine(two.forward, one.forward), combine(two.backward, one.backward)};
  }
  const auto& [forward, backward] = layer[recompute_mode::none];
  REQUIRE(!forward.empty());
  tally_map core;  // the attention core's forward traffic: ring attention's, on sp
  if (core_communicates)
    for (const auto& [key, tally] : forward)
      if (key.first == "sp") core[key] = tally;
  REQUIRE(core_communicates == !core.empty());
  for (const recompute_mode mode : {recompute_mode::selective, recompute_mode::full}) {
    INFO("recompute " << name_of(mode));
    const auto& [f, b] = layer[mode];
    INFO("forward " << describe(f) << " | backward " << describe(b));
    CHECK(f == forward);
    CHECK(combine(b, backward) == (mode == recompute_mode::full ? forward : core));
  }
}

}  // namespace

TEST_CASE("recomputation re-issues the forward's collectives in backward, and only those",
          "[parity][recompute]") {
  SECTION("tensor parallel, tp = 2") { require_recomputed_traffic<tp_plan>({.tp = 2}, false); }
  SECTION("Megatron-SP, tp = 2") { require_recomputed_traffic<megatron_sp_plan>({.tp = 2}, false); }
  SECTION("Ulysses with tp, 2 x 2") {
    require_recomputed_traffic<ulysses_plan>({.tp = 2, .sp = 2}, false);
  }
  SECTION("ring with tp, 2 x 2") {
    require_recomputed_traffic<ring_plan>({.tp = 2, .sp = 2}, true);
  }
}

// ---- Memory -----------------------------------------------------------------------------------

namespace {

// The elements one block keeps per rank after forward (fp32 tensors and fp32 statistics, so 4
// bytes each), for a micro-batch of b sequences of s tokens, width h, a heads, H hidden units,
// with n ranks sharing the heads (tp, or tp x sp under Ulysses and ring) and r rows of the
// sequence per rank between the layers (s; s / tp under Megatron-SP; s / sp under Ulysses and
// ring). docs/nn.md derives it term by term:
//   none       4 brh (ln1, ln2, qkv and fc inputs) + 4 br (ln means and rstds)
//              + (3 bsh (q, k, v) + bsh (attention output) + 2 bsH (GELU input and output)
//                 + abs (log-sum-exp)) / n
//              + bsh / n under Ulysses (the projection's own copy of its input, in rows)
//   selective  none - (bsh + abs) / n (the attention output and the log-sum-exp)
//   full       brh (the block's input)
struct block_shape {
  std::int64_t b, s, h, a, H;
};

std::int64_t kept_elements(const block_shape& m, recompute_mode mode, std::int64_t n,
                           std::int64_t r, bool ulysses = false) {
  const std::int64_t bsh = m.b * m.s * m.h, brh = m.b * r * m.h, abs = m.a * m.b * m.s;
  const std::int64_t none =
      4 * brh + 4 * m.b * r + (4 * bsh + 2 * m.b * m.s * m.H + abs) / n + (ulysses ? bsh / n : 0);
  switch (mode) {
    case recompute_mode::none:
      return none;
    case recompute_mode::selective:
      return none - (bsh + abs) / n;
    case recompute_mode::full:
      return brh;
  }
  return -1;
}

// One serial block's bytes after forward.
std::size_t serial_block_bytes(const block_shape& m, recompute_mode mode) {
  const quintet::execution<host> exec(1);
  quintet::nn::parameter_registry<float, host> registry(5);
  quintet::nn::transformer_block<float, host> block(
      registry, exec, "blocks.0",
      {.d_model = m.h, .heads = m.a, .mlp_hidden = m.H, .recompute = mode});
  quintet::tensor<float, host> x(shape{m.b, m.s, m.h});
  quintet::fill_normal(x, {.seed = 1, .stream = 1}, 0.0, 1.0);
  quintet::nn::context<host> ctx;
  block.forward(ctx, x.view());
  return ctx.bytes();
}

// Block 0's bytes after forward of the parity GPT, per rank, under `Plan`.
template <class Plan>
std::vector<std::size_t> plan_block_bytes(quintet::mesh_degrees degrees, recompute_mode mode) {
  using mesh_type = quintet::device_mesh<quintet::thread_comm>;
  std::vector<std::size_t> out(degrees.tp * degrees.sp);
  auto model_config = config;
  model_config.recompute = mode;
  quintet::thread_world{degrees.tp * degrees.sp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    mesh_type mesh(world, degrees);
    quintet::nn::parameter_registry<float, host> registry(seed, mesh, Plan{});
    quintet::nn::gpt<float, host, Plan, mesh_type> model(registry, exec, model_config, &mesh);
    const auto batch = source.batch(0, {0, 4}, 8);
    quintet::nn::context<host> ctx;
    model.forward(ctx, batch.inputs.view(), batch.targets.view());
    out[world.rank()] = block0_bytes(ctx);
  });
  return out;
}

template <class Plan>
void require_plan_memory(quintet::mesh_degrees degrees, std::int64_t rows, bool ulysses = false) {
  const block_shape m{4, 8, config.d_model, config.heads, config.hidden()};
  const std::int64_t n = degrees.tp * degrees.sp;
  for (const recompute_mode mode : all_modes) {
    INFO("tp " << degrees.tp << ", sp " << degrees.sp << ", recompute " << name_of(mode));
    for (const std::size_t bytes : plan_block_bytes<Plan>(degrees, mode))
      CHECK(static_cast<std::int64_t>(bytes) == 4 * kept_elements(m, mode, n, rows, ulysses));
  }
}

}  // namespace

TEST_CASE("a block keeps the bytes of the formula in each recompute mode", "[nn][recompute]") {
  // Odd sizes, one sequence longer than the width, a head count that is not a power of two.
  for (const block_shape m : {block_shape{2, 16, 8, 2, 32}, block_shape{3, 5, 12, 3, 20},
                              block_shape{1, 64, 16, 4, 64}, block_shape{4, 8, 16, 8, 32}}) {
    INFO("b " << m.b << ", s " << m.s << ", h " << m.h << ", a " << m.a << ", H " << m.H);
    std::map<recompute_mode, std::size_t> bytes;
    for (const recompute_mode mode : all_modes) {
      INFO("recompute " << name_of(mode));
      bytes[mode] = serial_block_bytes(m, mode);
      CHECK(static_cast<std::int64_t>(bytes[mode]) == 4 * kept_elements(m, mode, 1, m.s));
    }
    CHECK(bytes[recompute_mode::selective] < bytes[recompute_mode::none]);
    CHECK(bytes[recompute_mode::full] < bytes[recompute_mode::selective]);
  }
  // With H = 4h, Korthikanti et al.'s sbh (34 + 5as/h) 16-bit bytes become, in fp32 without
  // dropout masks and with the log-sum-exp for the (s, s) probabilities, 64 sbh + 4 abs (+ 16 bs
  // of layer-norm statistics the paper leaves out); selective 60 sbh + 16 bs (the paper's 34 sbh
  // keeps the projection input, 2 sbh of it); full 4 sbh (the paper's 2 sbh).
  const std::int64_t b = 2, s = 32, h = 16, a = 4;
  const block_shape m{b, s, h, a, 4 * h};
  CHECK(serial_block_bytes(m, recompute_mode::none) == 64 * s * b * h + 4 * a * s * b + 16 * s * b);
  CHECK(serial_block_bytes(m, recompute_mode::selective) == 60 * s * b * h + 16 * s * b);
  CHECK(serial_block_bytes(m, recompute_mode::full) == 4 * s * b * h);
}

TEST_CASE("a block keeps the bytes of the formula under every plan", "[parity][recompute]") {
  SECTION("tensor parallel, tp = 2") { require_plan_memory<tp_plan>({.tp = 2}, 8); }
  SECTION("Megatron-SP, tp = 2") { require_plan_memory<megatron_sp_plan>({.tp = 2}, 4); }
  SECTION("Ulysses, sp = 2") { require_plan_memory<ulysses_plan>({.sp = 2}, 4, true); }
  SECTION("ring, sp = 2") { require_plan_memory<ring_plan>({.sp = 2}, 4); }
  SECTION("Ulysses with tp, 2 x 2") {
    require_plan_memory<ulysses_plan>({.tp = 2, .sp = 2}, 4, true);
  }
  SECTION("ring with tp, 2 x 2") { require_plan_memory<ring_plan>({.tp = 2, .sp = 2}, 4); }
}
