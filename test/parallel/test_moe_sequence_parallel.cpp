// A mixture-of-experts layer whose tokens are split over sequence parallelism (sp<ring>: zig-zag
// chunks, sp<ulysses>: contiguous blocks; sp<megatron_sp>: contiguous blocks on the tp ranks,
// which also split every expert's hidden units), proven by parity with the serial layer over the
// whole micro-batch, in double. The group routes as one group (parallel::sequence_tokens gathers
// the router's logits), so each rank's output and input gradient equal the serial layer's on its
// rows, the routing statistics are the serial ones on every rank, and the gradients, each rank's
// partial over the group, sum to the serial ones (under megatron_sp the experts' tp slices are
// whole: each equals the serial gradient's slice). Compared within 1e-12 relative (margin 1e-14):
// the products run over each rank's rows (or hidden units) instead of all of them, and the sums
// over the group add in another order. Also: sequence_tokens' gather and split on their own, and
// what it refuses; the traffic on counting ranks (the positions gathered once per sequence length,
// the logits every forward, nothing in backward; under Megatron-SP also the tokens' gathers and
// reduce-scatters, those of the dense MLP); and the MoE GPT in the trainer with its tokens split
// over sp (ring, ulysses) or tp (megatron_sp), alone and with tp, ep and pp, against the serial
// MoE GPT (train::check_parity, the tolerances of the other MoE parity tests).
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/moe.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/sequence/megatron_sp.hpp>
#include <quintet/parallel/sequence/ring.hpp>
#include <quintet/parallel/sequence/sequence_tokens.hpp>
#include <quintet/parallel/sequence/ulysses.hpp>
#include <quintet/parallel/tensor/megatron_1d.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/train/parity.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace qp = quintet::parallel;
using quintet::host;
using quintet::shape;
using quintet::nn::drop_order;
using quintet::nn::moe_options;
using host_tensor = quintet::tensor<double, host>;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;
using registry_type = quintet::nn::parameter_registry<double, host>;

const quintet::execution<host> exec;
constexpr std::uint64_t seed = 77;
constexpr std::int64_t d_model = 6, hidden = 10, batch = 2;

std::vector<double> values_of(const host_tensor& t) { return {t.data(), t.data() + t.numel()}; }

void require_close(const std::vector<double>& got, const std::vector<double>& expected,
                   const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-12).margin(1e-14));
  }
}

moe_options layer_options(std::int64_t k, double capacity_factor, drop_order drop) {
  return {.experts = 4,
          .top_k = k,
          .capacity_factor = capacity_factor,
          .drop = drop,
          .load_balancing_coef = 0.3,
          .z_loss_coef = 0.05,
          .init_stddev = 0.7,
          .proj_init_stddev = 0.5};
}

// The elements of `whole` (row-major, of the region's global shape) inside `block`, in order.
std::vector<double> region_values(const std::vector<double>& whole, const quintet::region& block) {
  const shape local = block.local_shape();
  std::vector<double> picked;
  shape::index_array index{};
  for (std::int64_t i = 0; i < local.numel(); ++i) {
    std::int64_t rest = i;
    for (int d = local.rank() - 1; d >= 0; --d) {
      index[d] = rest % local[d];
      rest /= local[d];
    }
    picked.push_back(whole.at(static_cast<std::size_t>(block.global_index(index))));
  }
  return picked;
}

// Random biases, the serial ones on every rank (a tp rank draws its slice of them).
void random_biases(registry_type& registry) {
  for (auto& p : registry)
    if (p.name.ends_with(".bias"))
      quintet::fill_normal(p.value, {.seed = 5, .stream = quintet::rng_stream_for(p.name)}, 0.0,
                           0.3, p.local);
}

// This rank's rows of a (batch, seq, d) tensor under the style's layout.
template <class Style>
host_tensor rows_of(const host_tensor& whole, mesh_type& mesh) {
  const auto layout = qp::strategy_traits<Style>::activation_layout(&mesh, whole.shape()[1]);
  return qp::take_rows(whole.view(), layout);
}

// The plan and mesh of a style whose tokens split over n ranks: sp<Style> over sp, or Megatron-SP
// over tp (with the tensor parallelism it needs).
template <class Style>
struct token_group {
  using plan = quintet::plan<qp::sp<Style>>;
  static constexpr quintet::mesh_axis axis = quintet::mesh_axis::sp;
  static quintet::mesh_degrees degrees(int n) { return {.sp = n}; }
};
template <>
struct token_group<qp::megatron_sp> {
  using plan = quintet::plan<qp::tp<qp::megatron_1d>, qp::sp<qp::megatron_sp>>;
  static constexpr quintet::mesh_axis axis = quintet::mesh_axis::tp;
  static quintet::mesh_degrees degrees(int n) { return {.tp = n}; }
};

struct serial_result {
  host_tensor y, dx;
  quintet::nn::routing_statistics stats;
  std::map<std::string, std::vector<double>> grads;
};

// What a check saw: the serial routing, and each rank's own kept rows per expert (its context).
struct routing_seen {
  quintet::nn::routing_statistics serial;
  std::vector<std::vector<std::int64_t>> kept_here;  // per rank of the group
};

// One check: the serial layer over (batch, seq) tokens against the `group` ranks of Style's
// token group; `steer` sets the router's weights on both sides alike. The parallel layer runs its
// backward split (input pass, drop_input_pass_tensors, weight pass), as zero-bubble schedules
// and recomputation do.
template <class Style>
routing_seen check_sequence_parallel_moe(
    int group, std::int64_t seq, const moe_options& options,
    const std::function<void(registry_type&)>& steer = [](registry_type&) {}) {
  host_tensor x(shape{batch, seq, d_model}), dy(shape{batch, seq, d_model});
  quintet::fill_normal(x, {.seed = 21}, 0.0, 1.0);
  quintet::fill_normal(dy, {.seed = 22}, 0.0, 1.0);

  serial_result serial{.y = {}, .dx = {}, .stats = {}, .grads = {}};
  {
    registry_type registry(seed);
    quintet::nn::moe<double, host> layer(registry, exec, "moe", d_model, hidden, options);
    random_biases(registry);
    steer(registry);
    quintet::nn::context<host> ctx;
    serial.y = layer.forward(ctx, x.view());
    serial.stats = layer.statistics();
    serial.dx = layer.backward(ctx, dy.view());
    for (auto& p : registry) {
      host_tensor g(p.grad.shape());
      quintet::copy(g, p.grad);
      serial.grads[p.name] = values_of(g);
    }
  }

  // Each rank's results, checked on this thread afterwards (Catch's assertions are not
  // thread-safe).
  struct rank_result {
    std::vector<double> y, dx, expected_y, expected_dx;
    quintet::nn::routing_statistics stats;
    std::vector<std::int64_t> kept_here;
    std::map<std::string, std::vector<double>> summed;  // gradients summed over the group
    std::map<std::string, std::vector<double>> slice, expected_slice;  // the experts' tp slices
    std::map<std::string, quintet::mesh_axis_set> partial;
  };
  std::vector<rank_result> ranks(static_cast<std::size_t>(group));
  using plan = typename token_group<Style>::plan;
  quintet::thread_world{group}.run([&](quintet::thread_comm& world) {
    mesh_type mesh(world, token_group<Style>::degrees(group));
    registry_type registry(seed, mesh, plan{});
    quintet::nn::moe<double, host, plan, mesh_type> layer(registry, exec, "moe", d_model, hidden,
                                                          options, &mesh);
    random_biases(registry);
    steer(registry);
    rank_result& r = ranks[static_cast<std::size_t>(world.rank())];
    quintet::nn::context<host> ctx;
    r.y = values_of(layer.forward(ctx, rows_of<Style>(x, mesh).view()));
    r.stats = layer.statistics();
    // This rank's own kept rows (the experts run on them; under megatron_sp on the group's).
    if (ctx.contains("moe.router.kept")) {
      const auto& kept = ctx.get<std::int64_t>("moe.router.kept");
      r.kept_here.assign(kept.data(), kept.data() + kept.numel());
    }
    r.dx = values_of(layer.backward_input(ctx, rows_of<Style>(dy, mesh).view()));
    layer.drop_input_pass_tensors(ctx);
    layer.backward_weight(ctx);
    r.expected_y = values_of(rows_of<Style>(serial.y, mesh));
    r.expected_dx = values_of(rows_of<Style>(serial.dx, mesh));
    for (auto& p : registry) {
      r.partial[p.name] = p.placement.partial_axes();
      host_tensor g(p.grad.shape());
      quintet::copy(g, p.grad);
      if (p.placement.is_sharded(quintet::mesh_axis::tp)) {
        r.slice[p.name] = values_of(g);
        r.expected_slice[p.name] = region_values(serial.grads.at(p.name), p.local);
      } else {
        world.all_reduce(g, quintet::reduce_op::sum);
        r.summed[p.name] = values_of(g);
      }
    }
  });
  for (int rank = 0; rank < group; ++rank) {
    INFO("rank " << rank << " of " << group);
    const rank_result& r = ranks[static_cast<std::size_t>(rank)];
    require_close(r.y, r.expected_y, "y");
    require_close(r.dx, r.expected_dx, "dx");
    // The group's routing, the same on every rank.
    CHECK(r.stats.tokens == serial.stats.tokens);
    CHECK(r.stats.capacity == serial.stats.capacity);
    CHECK(r.stats.routed == serial.stats.routed);
    CHECK(r.stats.kept == serial.stats.kept);
    CHECK(r.stats.dropped_assignments == serial.stats.dropped_assignments);
    CHECK(r.stats.dropped_tokens == serial.stats.dropped_tokens);
    CHECK(r.stats.load_balancing_loss ==
          Approx(serial.stats.load_balancing_loss).epsilon(1e-12).margin(1e-14));
    CHECK(r.stats.z_loss == Approx(serial.stats.z_loss).epsilon(1e-12).margin(1e-14));
    // Every gradient held whole is partial over the group: summed, the serial one; a tp slice
    // is the serial gradient's slice.
    REQUIRE(r.summed.size() + r.slice.size() == serial.grads.size());
    for (const auto& [name, summed] : r.summed) {
      INFO(name);
      CHECK(r.partial.at(name) == quintet::mesh_axis_set{token_group<Style>::axis});
      require_close(summed, serial.grads.at(name), "gradient summed over the group");
    }
    for (const auto& [name, slice] : r.slice) {
      INFO(name);
      CHECK(r.partial.at(name) == quintet::mesh_axis_set{});
      require_close(slice, r.expected_slice.at(name), "tp slice of the gradient");
    }
  }
  routing_seen seen{.serial = serial.stats, .kept_here = {}};
  if (std::is_same_v<Style, qp::megatron_sp>) return seen;  // no own rows' counts kept
  for (const rank_result& r : ranks) seen.kept_here.push_back(r.kept_here);
  // The ranks' own rows per expert add up to the group's.
  for (std::size_t e = 0; e < serial.stats.kept.size(); ++e) {
    std::int64_t sum = 0;
    for (const auto& kept : seen.kept_here) sum += kept.at(e);
    CHECK(sum == serial.stats.kept[e]);
  }
  return seen;
}

}  // namespace

TEST_CASE("sequence_tokens gathers an sp group's rows in serial order and splits them back",
          "[parity][sequence][expert]") {
  constexpr std::int64_t seq = 12, width = 3;
  host_tensor whole(shape{batch * seq, width});
  quintet::fill_normal(whole, {.seed = 9}, 0.0, 1.0);
  for (const int sp : {2, 3}) {
    for (const bool zigzag : {false, true}) {
      INFO("sp " << sp << (zigzag ? ", zig-zag" : ", contiguous"));
      std::vector<std::vector<double>> mine(static_cast<std::size_t>(sp)),
          picked(static_cast<std::size_t>(sp)), gathered(static_cast<std::size_t>(sp));
      quintet::thread_world{sp}.run([&](quintet::thread_comm& group) {
        const auto layout = zigzag ? qp::sequence_layout::zigzag(seq, sp, group.rank())
                                   : qp::sequence_layout::contiguous(seq, sp, group.rank(), "t");
        qp::sequence_tokens tokens(group, layout, seq);
        const host_tensor rows = tokens.local(whole.view());  // (batch, seq / sp, width)
        const auto at = static_cast<std::size_t>(group.rank());
        mine[at] = values_of(rows);
        // Row (b, i) of rows is serial row b x seq + the position the style gives local row i.
        const std::vector<std::int64_t> serial = tokens.serial_rows(batch);
        const std::int64_t local = seq / sp;
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t i = 0; i < local; ++i) {
            const std::int64_t position =
                zigzag ? qp::zigzag_split(sp, seq).global_position(group.rank(), i)
                       : group.rank() * local + i;
            if (serial[b * local + i] != b * seq + position) picked[at].push_back(-1.0);
            for (std::int64_t c = 0; c < width; ++c)
              picked[at].push_back(whole(b * seq + position, c));
          }
        gathered[at] = values_of(tokens.gather(reshape(rows, shape{batch * seq / sp, width})));
      });
      for (int rank = 0; rank < sp; ++rank) {
        INFO("rank " << rank);
        const auto at = static_cast<std::size_t>(rank);
        CHECK(mine[at].size() == static_cast<std::size_t>(batch * seq / sp * width));
        CHECK(mine[at] == picked[at]);
        CHECK(gathered[at] == values_of(whole));
      }
    }
  }
  SECTION("layouts that do not tile the sequence are refused on every rank") {
    CHECK_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& group) {
      // Both ranks claim positions 0..5 of 12.
      qp::sequence_tokens tokens(group, qp::sequence_layout{{{0, 0, 6}}}, seq);
    }),
                      Catch::Contains("holds position 0 of a sequence of 12, outside it or held "
                                      "twice"));
    CHECK_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& group) {
      qp::sequence_tokens tokens(group, qp::sequence_layout::whole(5), seq);
    }),
                      Catch::Contains("5 positions on each of 2 ranks do not make a sequence of "
                                      "12"));
  }
}

TEST_CASE("a MoE layer with its tokens split over sp routes them as the serial layer does",
          "[parity][sequence][expert]") {
  for (const std::int64_t k : {1, 2}) {
    SECTION("ring, sp 2, dropless, k " + std::to_string(k)) {
      check_sequence_parallel_moe<qp::ring>(2, 8, layer_options(k, 0.0, {}));
    }
    SECTION("ring, sp 2, drops by probability, k " + std::to_string(k)) {
      const auto seen = check_sequence_parallel_moe<qp::ring>(
          2, 8, layer_options(k, 0.5, drop_order::lowest_probability));
      CHECK(seen.serial.dropped_assignments > 0);
    }
    SECTION("ulysses, sp 3, drops by position, k " + std::to_string(k)) {
      const auto seen = check_sequence_parallel_moe<qp::ulysses>(
          3, 9, layer_options(k, 0.5, drop_order::position));
      CHECK(seen.serial.dropped_assignments > 0);
    }
    SECTION("ring, sp 3, drops by position, k " + std::to_string(k)) {
      const auto seen = check_sequence_parallel_moe<qp::ring>(
          3, 12, layer_options(k, 0.75, drop_order::position));
      CHECK(seen.serial.dropped_assignments > 0);
    }
    SECTION("megatron_sp, tp 2, dropless, k " + std::to_string(k)) {
      check_sequence_parallel_moe<qp::megatron_sp>(2, 8, layer_options(k, 0.0, {}));
    }
    SECTION("megatron_sp, tp 2, drops by probability, k " + std::to_string(k)) {
      const auto seen = check_sequence_parallel_moe<qp::megatron_sp>(
          2, 8, layer_options(k, 0.5, drop_order::lowest_probability));
      CHECK(seen.serial.dropped_assignments > 0);
    }
    SECTION("megatron_sp, tp 5 (hidden 10: 2 units each), drops by position, k " +
            std::to_string(k)) {
      const auto seen = check_sequence_parallel_moe<qp::megatron_sp>(
          5, 10, layer_options(k, 0.75, drop_order::position));
      CHECK(seen.serial.dropped_assignments > 0);
    }
  }
  SECTION("every logit tied: all tokens choose expert 0, whose capacity rank 0's rows fill") {
    // A zero router gives every expert the same probability: top-1 takes expert 0 (ties go to the
    // lower index), and by position its capacity ceil(0.75 x 16 / 4) = 3 keeps the first three
    // tokens in serial order, all of them rank 0's (ulysses: positions 0-3 of each sequence).
    const auto zero_router = [](registry_type& registry) {
      auto& w = registry.find("moe.router.weight").value;
      std::fill(w.data(), w.data() + w.numel(), 0.0);
    };
    const auto seen = check_sequence_parallel_moe<qp::ulysses>(
        2, 8, layer_options(1, 0.75, drop_order::position), zero_router);
    CHECK(seen.serial.kept == std::vector<std::int64_t>{3, 0, 0, 0});
    CHECK(seen.serial.dropped_tokens == batch * 8 - 3);
    CHECK(seen.kept_here.at(0) == std::vector<std::int64_t>{3, 0, 0, 0});
    CHECK(seen.kept_here.at(1) == std::vector<std::int64_t>{0, 0, 0, 0});  // no rows at all
    // Megatron-SP alike: rank 1's rows all dropped, three experts computing nothing.
    const auto megatron = check_sequence_parallel_moe<qp::megatron_sp>(
        2, 8, layer_options(1, 0.75, drop_order::position), zero_router);
    CHECK(megatron.serial.kept == std::vector<std::int64_t>{3, 0, 0, 0});
  }
}

TEMPLATE_TEST_CASE("a MoE layer over sp or Megatron-SP refuses what it cannot route, on every rank",
                   "[parity][sequence][expert]", qp::ring, qp::megatron_sp) {
  using plan = typename token_group<TestType>::plan;
  const std::string axis(quintet::name_of(token_group<TestType>::axis));
  const auto build = [](const moe_options& options, bool flat_input) {
    quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
      mesh_type mesh(world, token_group<TestType>::degrees(2));
      registry_type registry(seed, mesh, plan{});
      quintet::nn::moe<double, host, plan, mesh_type> layer(registry, exec, "moe", d_model, hidden,
                                                            options, &mesh);
      host_tensor x(flat_input ? shape{8, d_model} : shape{batch, 4, d_model});
      quintet::fill_normal(x, {.seed = 1}, 0.0, 1.0);
      quintet::nn::context<host> ctx;
      (void)layer.forward(ctx, x.view());
    });
  };
  moe_options grouped = layer_options(2, 0.0, {});
  grouped.groups = 2;
  CHECK_THROWS_WITH(
      build(grouped, false),
      Catch::Contains("2 routing groups with the tokens split over " + axis + " = 2"));
  CHECK_THROWS_WITH(build(layer_options(2, 0.0, {}), true),
                    Catch::Contains("with the tokens split over " + axis +
                                    " the input is (batch, this rank's positions, d)"));
  CHECK_NOTHROW(build(layer_options(2, 0.0, {}), false));
}

namespace {

namespace par = quintet::parallel;
namespace train = quintet::train;
using tensor_parallel = par::tp<par::megatron_1d>;
using ring_moe_plan = quintet::plan<par::sp<par::ring>, tensor_parallel>;
using ulysses_moe_plan =
    quintet::plan<par::dp<par::zero<1>>, tensor_parallel, par::sp<par::ulysses>>;
using ring_ep_plan = quintet::plan<par::dp<par::zero<0>>, tensor_parallel, par::sp<par::ring>,
                                   par::ep<par::top_k<2>>>;
using ring_pp_moe_plan =
    quintet::plan<tensor_parallel, par::sp<par::ring>, par::pp<par::named_schedule>>;
using megatron_moe_plan =
    quintet::plan<par::dp<par::zero<1>>, tensor_parallel, par::sp<par::megatron_sp>>;
using megatron_ep_plan = quintet::plan<par::dp<par::zero<0>>, tensor_parallel,
                                       par::sp<par::megatron_sp>, par::ep<par::top_k<2>>>;
using megatron_pp_moe_plan =
    quintet::plan<tensor_parallel, par::sp<par::megatron_sp>, par::pp<par::named_schedule>>;

// The parity model (2 blocks, d 16, 8 heads, seq 8) with 4 experts in every block, top-2, and
// strong auxiliary losses, so that a wrong weighting of them shows in the parameters.
quintet::nn::gpt_config moe_model(double capacity_factor, std::int64_t layers = 2) {
  quintet::nn::gpt_config model = quintet::test::config;
  model.layers = layers;
  model.experts = 4;
  model.top_k = 2;
  model.moe_every = 1;
  model.capacity_factor = capacity_factor;
  model.aux_loss_coef = 0.1;
  model.z_loss_coef = 0.01;
  return model;
}

train::training_options moe_training(int micro_batches) {
  train::training_options options = quintet::test::training;
  options.batch = 8;
  options.micro_batches = micro_batches;
  return options;
}

// The plan against the serial MoE GPT; every serial parameter covered, tokens dropped when the
// capacity says so (the serial run's expert load), and each expert held by world / ep ranks.
template <class Plan>
void require_moe_parity(const quintet::nn::gpt_config& model,
                        const train::training_options& options, quintet::mesh_degrees degrees) {
  const auto report = train::check_parity<float, Plan>(
      quintet::test::source, model, options, degrees,
      train::parity_tolerance::for_adamw(options.lr, options.steps));
  INFO(report.summary());
  REQUIRE(report.passed);
  REQUIRE(report.uncovered.empty());
  std::map<std::string, int> holders;
  for (const auto& p : report.parameters)
    if (p.name.find(".experts.") != std::string::npos) ++holders[p.name];
  REQUIRE(!holders.empty());
  const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
  if (degrees.pp == 1)
    for (const auto& [name, count] : holders) {
      INFO(name);
      CHECK(count == world / degrees.ep);
    }
}

}  // namespace

TEST_CASE("a MoE GPT with its tokens split over sp trains like the serial MoE GPT",
          "[parity][sequence][expert][moe]") {
  SECTION("ring sp 2, tokens dropped, 2 micro-batches") {
    require_moe_parity<ring_moe_plan>(moe_model(1.0), moe_training(2), {.sp = 2});
  }
  SECTION("ulysses sp 2 x tp 2 (experts split over tp), ZeRO-1 over dp 2, tokens dropped") {
    require_moe_parity<ulysses_moe_plan>(moe_model(1.0), moe_training(1),
                                         {.dp = 2, .tp = 1, .sp = 2});
    require_moe_parity<ulysses_moe_plan>(moe_model(1.0), moe_training(1), {.tp = 2, .sp = 2});
  }
  SECTION("dp 2 over ep 2, x ring sp 2: each sp rank's tokens to its ep group's experts") {
    require_moe_parity<ring_ep_plan>(moe_model(1.0), moe_training(2), {.dp = 2, .sp = 2, .ep = 2});
    require_moe_parity<ring_ep_plan>(moe_model(0.0), moe_training(1), {.dp = 2, .sp = 2, .ep = 2});
  }
  SECTION("pp 2 x ring sp 2, 1f1b and zb-v: the stages' MoE blocks route over sp") {
    for (const char* schedule : {"1f1b", "zb-v"}) {
      INFO(schedule);
      train::training_options options = moe_training(4);
      options.pipeline.schedule = schedule;
      require_moe_parity<ring_pp_moe_plan>(moe_model(1.0, 4), options, {.pp = 2, .sp = 2});
    }
  }
}

TEST_CASE("a MoE GPT under Megatron-SP (tokens sharded over tp) trains like the serial MoE GPT",
          "[parity][sequence][expert][moe]") {
  SECTION("tp 2, tokens dropped, 2 micro-batches") {
    require_moe_parity<megatron_moe_plan>(moe_model(1.0), moe_training(2), {.tp = 2});
  }
  SECTION("tp 2 x ZeRO-1 over dp 2, dropless") {
    require_moe_parity<megatron_moe_plan>(moe_model(0.0), moe_training(1), {.dp = 2, .tp = 2});
  }
  SECTION("dp 2 over ep 2 x tp 2: the tp group's gathered tokens to its ep group's experts") {
    require_moe_parity<megatron_ep_plan>(moe_model(1.0), moe_training(2),
                                         {.dp = 2, .tp = 2, .ep = 2});
  }
  SECTION("pp 2 x tp 2, 1f1b and zb-v") {
    for (const char* schedule : {"1f1b", "zb-v"}) {
      INFO(schedule);
      train::training_options options = moe_training(4);
      options.pipeline.schedule = schedule;
      require_moe_parity<megatron_pp_moe_plan>(moe_model(1.0, 4), options, {.pp = 2, .tp = 2});
    }
  }
}

namespace {

// Each mode's run of the MoE GPT on two ranks of Plan (mesh `degrees`).
template <class Plan>
std::map<quintet::nn::recompute_mode, std::vector<train::parity_run>> recompute_runs(
    quintet::mesh_degrees degrees) {
  std::map<quintet::nn::recompute_mode, std::vector<train::parity_run>> runs;
  for (const auto mode : {quintet::nn::recompute_mode::none, quintet::nn::recompute_mode::selective,
                          quintet::nn::recompute_mode::full}) {
    quintet::nn::gpt_config model = moe_model(1.0);
    model.recompute = mode;
    auto& ranks = runs[mode];
    ranks.resize(2);
    quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
      const quintet::execution<host> rank_exec(1);
      mesh_type mesh(world, degrees);
      ranks[static_cast<std::size_t>(world.rank())] = train::parity_rank<float, Plan>(
          quintet::test::source, model, moe_training(2), rank_exec, &mesh);
    });
  }
  return runs;
}

}  // namespace

TEST_CASE("under ring sp and Megatron-SP, recompute full and selective give recompute none's bits",
          "[parity][sequence][expert][moe]") {
  // full reruns each MoE block's forward in backward, its collectives over the group included.
  const auto runs = GENERATE(as<std::string>{}, "ring", "megatron_sp") == "ring"
                        ? recompute_runs<ring_moe_plan>({.sp = 2})
                        : recompute_runs<megatron_moe_plan>({.tp = 2});
  for (const auto mode :
       {quintet::nn::recompute_mode::selective, quintet::nn::recompute_mode::full})
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("mode " << quintet::nn::name_of(mode) << ", rank " << r);
      quintet::test::require_identical(runs.at(quintet::nn::recompute_mode::none)[r],
                                       runs.at(mode)[r]);
    }
}

TEST_CASE("a MoE layer over sp moves the positions once and E logits a token per forward",
          "[parity][sequence][expert]") {
  // On counting ranks: forward twice at one sequence length, backward once, then a forward at
  // another length. all_gather's bytes are its output (nccl-tests' S), bus bytes S (n - 1) / n.
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  using counted_mesh = quintet::device_mesh<counted_comm>;
  using plan = quintet::plan<qp::sp<qp::ring>>;
  constexpr std::int64_t experts = 4;
  for (const int sp : {2, 4}) {
    INFO("sp " << sp);
    const std::int64_t seq = 4 * sp, longer = 8 * sp;
    std::vector<std::vector<quintet::comm_tally>> got(static_cast<std::size_t>(sp));
    std::vector<std::int64_t> backward_calls(static_cast<std::size_t>(sp));
    quintet::thread_world{sp}.run([&](quintet::thread_comm& world) {
      counted_comm counted(world.split(0, world.rank()));
      counted_mesh mesh(counted, {.sp = sp});
      quintet::nn::parameter_registry<float, host> registry(seed, mesh, plan{});
      quintet::nn::moe<float, host, plan, counted_mesh> layer(
          registry, exec, "moe", d_model, hidden, {.experts = experts, .top_k = 2}, &mesh);
      const auto at = static_cast<std::size_t>(world.rank());
      const auto pass = [&](std::int64_t length, bool backward) {
        quintet::tensor<float, host> x(shape{batch, length / sp, d_model}), dy(x.shape());
        quintet::fill_normal(x, {.seed = 3, .stream = at}, 0.0, 1.0);
        quintet::fill_normal(dy, {.seed = 4, .stream = at}, 0.0, 1.0);
        quintet::nn::context<host> ctx;
        counted.ledger().clear();
        (void)layer.forward(ctx, x.view());
        const auto tallies = counted.ledger().tallies();
        const auto found = tallies.find({"sp", quintet::comm_operation::all_gather});
        got[at].push_back(found == tallies.end() ? quintet::comm_tally{} : found->second);
        if (tallies.size() != 1) got[at].push_back({-1, -1, -1});  // anything else: a mismatch
        if (backward) {
          counted.ledger().clear();
          (void)layer.backward(ctx, dy.view());
          backward_calls[at] = std::ssize(counted.ledger().tallies());
        }
      };
      pass(seq, true);
      pass(seq, false);
      pass(longer, false);
    });
    const auto gather = [&](std::int64_t bytes, std::int64_t calls) {
      return quintet::comm_tally{calls, bytes, static_cast<double>(bytes) * (sp - 1) / sp};
    };
    const auto positions = [&](std::int64_t length) { return length * std::int64_t{8}; };
    const auto logits = [&](std::int64_t length) {
      return batch * length * experts * std::int64_t{sizeof(float)};
    };
    for (int rank = 0; rank < sp; ++rank) {
      INFO("rank " << rank);
      const auto& tallies = got[static_cast<std::size_t>(rank)];
      REQUIRE(tallies.size() == 3);
      CHECK(tallies[0] == gather(positions(seq) + logits(seq), 2));
      CHECK(tallies[1] == gather(logits(seq), 1));
      CHECK(tallies[2] == gather(positions(longer) + logits(longer), 2));
      CHECK(backward_calls[static_cast<std::size_t>(rank)] == 0);
    }
  }
}

TEST_CASE("a MoE layer under Megatron-SP moves what the dense MLP does, plus E logits and k gates",
          "[parity][sequence][expert]") {
  // On counting ranks, tp = 2 and 5: forward twice at one sequence length, then backward. Forward
  // gathers the positions (once per length), the logits and x, and reduce-scatters y; backward
  // gathers dy and reduce-scatters dx and the gates' gradient. Bytes as nccl-tests' S: the
  // gathered output, the reduce-scatter's whole input.
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  using counted_mesh = quintet::device_mesh<counted_comm>;
  using plan = token_group<qp::megatron_sp>::plan;
  constexpr std::int64_t experts = 4, k = 2;
  using quintet::comm_operation;
  using tallies = std::map<std::pair<std::string, comm_operation>, quintet::comm_tally>;
  for (const int tp : {2, 5}) {  // hidden 10 splits over both
    INFO("tp " << tp);
    const std::int64_t seq = 4 * tp;
    std::vector<std::vector<tallies>> got(static_cast<std::size_t>(tp));
    quintet::thread_world{tp}.run([&](quintet::thread_comm& world) {
      counted_comm counted(world.split(0, world.rank()));
      counted_mesh mesh(counted, {.tp = tp});
      quintet::nn::parameter_registry<float, host> registry(seed, mesh, plan{});
      quintet::nn::moe<float, host, plan, counted_mesh> layer(
          registry, exec, "moe", d_model, hidden, {.experts = experts, .top_k = k}, &mesh);
      const auto at = static_cast<std::size_t>(world.rank());
      quintet::tensor<float, host> x(shape{batch, seq / tp, d_model}), dy(x.shape());
      quintet::fill_normal(x, {.seed = 3, .stream = at}, 0.0, 1.0);
      quintet::fill_normal(dy, {.seed = 4, .stream = at}, 0.0, 1.0);
      for (const bool backward : {false, true}) {
        quintet::nn::context<host> ctx;
        counted.ledger().clear();
        (void)layer.forward(ctx, x.view());
        got[at].push_back(counted.ledger().tallies());
        if (backward) {
          counted.ledger().clear();
          (void)layer.backward(ctx, dy.view());
          got[at].push_back(counted.ledger().tallies());
        }
      }
    });
    const auto tally = [&](std::int64_t calls, std::int64_t bytes) {
      return quintet::comm_tally{calls, bytes, static_cast<double>(bytes) * (tp - 1) / tp};
    };
    const std::int64_t positions = seq * 8, logits = batch * seq * experts * 4,
                       rows = batch * seq * d_model * 4, gates = batch * seq * k * 4;
    const auto gather = std::make_pair(std::string("tp"), comm_operation::all_gather);
    const auto scatter = std::make_pair(std::string("tp"), comm_operation::reduce_scatter);
    for (int rank = 0; rank < tp; ++rank) {
      INFO("rank " << rank);
      const auto& seen = got[static_cast<std::size_t>(rank)];
      REQUIRE(seen.size() == 3);
      CHECK(seen[0] ==
            tallies{{gather, tally(3, positions + logits + rows)}, {scatter, tally(1, rows)}});
      CHECK(seen[1] == tallies{{gather, tally(2, logits + rows)}, {scatter, tally(1, rows)}});
      CHECK(seen[2] == tallies{{gather, tally(1, rows)}, {scatter, tally(2, rows + gates)}});
    }
  }
}
