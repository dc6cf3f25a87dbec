// Expert parallelism (parallel::ep<top_k<K>>, nn::moe) proven by parity with the serial layer on
// thread ranks, in double. Each dp rank takes its own slice of the tokens (ep subdivides dp) and
// routes it with its own capacity, so the reference is the serial layer run over each slice in turn
// (gradients accumulated slice by slice in slice order).
//
// What must be exact (bit for bit): every rank's output, input gradient and routing statistics
// against the serial layer on its slice; the router's gradient before synchronisation against the
// serial one of that slice; each expert's gradient on its owner before synchronisation against the
// serial layer run over the slices of the owner's ep group (the grouped products take the groups
// (source, expert) in source order: the same products in the same order). What is compared within
// 1e-12 relative (margin 1e-14): gradients after synchronisation (the all-reduce over dp, or over
// edp for experts, sums in its own order), and after 4 AdamW steps parameters within 1e-9 relative
// or 1e-11 absolute (m / sqrt(v) carries those sums' rounding into every update).
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/moe.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/parallel/expert/expert_exchange.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/synchronize_gradients.hpp>
#include <quintet/tensor/random.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace qp = quintet::parallel;
using quintet::host;
using quintet::mesh_axis;
using quintet::mesh_axis_set;
using quintet::shape;
using quintet::nn::drop_order;
using quintet::nn::moe_options;
using host_tensor = quintet::tensor<double, host>;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;
using registry_type = quintet::nn::parameter_registry<double, host>;
template <int K>
using ep_plan = quintet::plan<qp::dp<qp::zero<0>>, qp::ep<qp::top_k<K>>>;

const quintet::execution<host> exec;
constexpr std::uint64_t seed = 2024;
constexpr std::int64_t d_model = 6, hidden = 10;

// One test: the mesh, the layer, the tokens of each dp rank (slice), and a hook that steers the
// routing (router weights, inputs) the same way on the serial and the parallel side.
struct scenario {
  int dp = 2, ep = 2;
  moe_options options;
  std::vector<std::int64_t> tokens;  // per slice (dp rank)
  std::function<void(registry_type&)> steer_router = [](registry_type&) {};
  std::function<void(int slice, host_tensor&)> steer_input = [](int, host_tensor&) {};
};

moe_options layer_options(std::int64_t experts, std::int64_t k, double capacity_factor,
                          drop_order drop = drop_order::lowest_probability) {
  return {.experts = experts,
          .top_k = k,
          .capacity_factor = capacity_factor,
          .drop = drop,
          .load_balancing_coef = 0.3,
          .z_loss_coef = 0.05,
          .init_stddev = 0.7,
          .proj_init_stddev = 0.5};
}

// Random non-zero biases (keyed by name, so each equals its serial twin), then the scenario's
// steering.
void prepare(registry_type& registry, const scenario& sc) {
  for (auto& p : registry)
    if (p.name.ends_with(".bias"))
      quintet::fill_normal(p.value, {.seed = 3, .stream = quintet::rng_stream_for(p.name)}, 0.0,
                           0.3);
  sc.steer_router(registry);
}

struct inputs {
  std::vector<host_tensor> x, dy;  // per slice: (tokens, d)
};

inputs make_inputs(const scenario& sc, std::uint64_t salt = 0) {
  inputs in;
  for (int s = 0; s < sc.dp; ++s) {
    host_tensor x(shape{sc.tokens[s], d_model}), dy(shape{sc.tokens[s], d_model});
    quintet::fill_normal(x, {.seed = 11 + salt, .stream = static_cast<std::uint64_t>(s)}, 0.0, 1.0);
    quintet::fill_normal(dy, {.seed = 12 + salt, .stream = static_cast<std::uint64_t>(s)}, 0.0,
                         1.0);
    sc.steer_input(s, x);
    in.x.push_back(std::move(x));
    in.dy.push_back(std::move(dy));
  }
  return in;
}

std::vector<double> values_of(const host_tensor& t) { return {t.data(), t.data() + t.numel()}; }
template <class View>
std::vector<double> values_of_view(const View& v) {
  host_tensor copy(v.shape());
  quintet::copy(copy, v);
  return values_of(copy);
}

// The serial layer run over `slices` in turn, gradients accumulated.
struct serial_result {
  std::map<int, std::vector<double>> y, dx;
  std::map<int, quintet::nn::routing_statistics> stats;
  std::map<std::string, std::vector<double>> grads;
};

serial_result serial_run(const scenario& sc, const inputs& in, const std::vector<int>& slices) {
  registry_type registry(seed);
  quintet::nn::moe<double, host> layer(registry, exec, "moe", d_model, hidden, sc.options);
  prepare(registry, sc);
  serial_result out;
  for (const int s : slices) {
    quintet::nn::context<host> ctx;
    out.y[s] = values_of(layer.forward(ctx, in.x[s].view()));
    out.stats[s] = layer.statistics();
    out.dx[s] = values_of(layer.backward(ctx, in.dy[s].view()));
  }
  for (auto& p : registry) out.grads[p.name] = values_of_view(p.grad);
  return out;
}

std::vector<int> all_slices(const scenario& sc) {
  std::vector<int> slices(static_cast<std::size_t>(sc.dp));
  std::iota(slices.begin(), slices.end(), 0);
  return slices;
}

// One rank of the parallel run.
struct rank_result {
  int dp = 0, ep = 0, edp = 0;
  std::vector<double> y, dx;
  quintet::nn::routing_statistics stats;
  std::int64_t first_expert = 0, local_experts = 0;
  std::map<std::string, std::vector<double>> before, after;  // gradients around synchronisation
  std::map<std::string, qp::placement> placements;
  double norm = 0;  // the global gradient norm after synchronisation
};

template <int K>
std::vector<rank_result> parallel_run(const scenario& sc, const inputs& in) {
  std::vector<rank_result> out(static_cast<std::size_t>(sc.dp));
  quintet::thread_world{sc.dp}.run([&](quintet::thread_comm& world) {
    mesh_type mesh(world, {.dp = sc.dp, .ep = sc.ep});
    registry_type registry(seed, mesh, ep_plan<K>{});
    quintet::nn::moe<double, host, ep_plan<K>, mesh_type> layer(registry, exec, "moe", d_model,
                                                                hidden, sc.options, &mesh);
    prepare(registry, sc);
    rank_result& r = out[static_cast<std::size_t>(world.rank())];
    r.dp = mesh.coordinates().dp;
    r.ep = mesh.coordinates().ep;
    r.edp = mesh.coordinates().edp;
    r.first_expert = layer.first_expert();
    r.local_experts = layer.local_experts();
    quintet::nn::context<host> ctx;
    r.y = values_of(layer.forward(ctx, in.x[r.dp].view()));
    r.stats = layer.statistics();
    r.dx = values_of(layer.backward(ctx, in.dy[r.dp].view()));
    for (auto& p : registry) {
      r.before[p.name] = values_of_view(p.grad);
      r.placements[p.name] = p.placement;
    }
    qp::synchronize_gradients(registry, mesh);
    for (auto& p : registry) r.after[p.name] = values_of_view(p.grad);
    r.norm = qp::global_gradient_norm<ep_plan<K>>(exec, registry, mesh);
  });
  return out;
}

std::vector<rank_result> run_parallel(const scenario& sc, const inputs& in) {
  return sc.options.top_k == 1 ? parallel_run<1>(sc, in) : parallel_run<2>(sc, in);
}

void require_exact(const std::vector<double>& got, const std::vector<double>& expected,
                   const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == expected.size());
  std::size_t differ = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expected[i]) ++differ;
    worst = std::max(worst, std::abs(got[i] - expected[i]));
  }
  INFO(differ << " elements differ, worst by " << worst);
  REQUIRE(differ == 0);
}

void require_close(const std::vector<double>& got, const std::vector<double>& expected,
                   const std::string& what, double relative = 1e-12, double margin = 1e-14) {
  INFO(what);
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == Approx(expected[i]).epsilon(relative).margin(margin));
  }
}

bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }
std::int64_t expert_of(const std::string& name) {
  const auto at = name.find(".experts.") + 9;
  return std::stoll(name.substr(at, name.find('.', at) - at));
}

// Everything the header promises, for one scenario. Returns the serial statistics per slice so
// that a test can assert the routing it meant to produce really happened.
std::map<int, quintet::nn::routing_statistics> check_parity(const scenario& sc) {
  const inputs in = make_inputs(sc);
  const serial_result whole = serial_run(sc, in, all_slices(sc));
  const auto ranks = run_parallel(sc, in);
  const std::int64_t experts = sc.options.experts, local = experts / sc.ep;
  std::map<std::int64_t, int> owners_seen;  // expert -> how many ranks hold it
  for (const rank_result& r : ranks) {
    INFO("dp rank " << r.dp << " (ep " << r.ep << ", edp " << r.edp << ")");
    // Forward and dx: exactly the serial layer's on this rank's slice.
    require_exact(r.y, whole.y.at(r.dp), "y");
    require_exact(r.dx, whole.dx.at(r.dp), "dx");
    const auto& stats = whole.stats.at(r.dp);
    CHECK(r.stats.routed == stats.routed);
    CHECK(r.stats.kept == stats.kept);
    CHECK(r.stats.capacity == stats.capacity);
    CHECK(r.stats.load_balancing_loss == stats.load_balancing_loss);
    CHECK(r.stats.z_loss == stats.z_loss);
    // This rank holds experts [ep E / ep, (ep + 1) E / ep), nothing else, under global names.
    CHECK(r.first_expert == r.ep * local);
    CHECK(r.local_experts == local);
    const serial_result own_slice = serial_run(sc, in, {r.dp});
    std::vector<int> group;  // the dp ranks of this rank's ep group, in ep order
    for (int j = 0; j < sc.ep; ++j) group.push_back(r.edp * sc.ep + j);
    const serial_result own_group = serial_run(sc, in, group);
    for (const auto& [name, before] : r.before) {
      INFO(name);
      const qp::placement& where = r.placements.at(name);
      if (is_expert(name)) {
        const std::int64_t e = expert_of(name);
        REQUIRE(e / local == r.ep);
        if (name.ends_with(".fc.weight")) ++owners_seen[e];
        CHECK(where.owner(mesh_axis::ep) == r.ep);
        CHECK(where.sharded_axes() == mesh_axis_set{mesh_axis::ep});
        CHECK(where.partial_axes() == mesh_axis_set{mesh_axis::edp});
        // Complete over the ep group before any reduction; summed over the replicas after.
        require_exact(before, own_group.grads.at(name), "expert gradient before synchronisation");
        if (sc.dp == sc.ep)
          require_exact(r.after.at(name), whole.grads.at(name), "expert gradient (edp = 1)");
        else
          require_close(r.after.at(name), whole.grads.at(name), "expert gradient over edp");
      } else {
        CHECK(where.is_replicated());
        CHECK(where.partial_axes() == mesh_axis_set{mesh_axis::dp});
        require_exact(before, own_slice.grads.at(name), "router gradient before synchronisation");
        require_close(r.after.at(name), whole.grads.at(name), "router gradient over dp");
      }
    }
    // The norm counts every expert once (summed over ep) and the router once.
    double squares = 0;
    for (const auto& [name, grad] : whole.grads)
      for (const double g : grad) squares += g * g;
    CHECK(r.norm == Approx(std::sqrt(squares)).epsilon(1e-12));
  }
  // Every expert is held by exactly its dp / ep replicas.
  REQUIRE(std::ssize(owners_seen) == experts);
  for (const auto& [e, count] : owners_seen) CHECK(count == sc.dp / sc.ep);
  return whole.stats;
}

scenario basic(int dp, int ep, std::int64_t experts, std::int64_t k, double capacity_factor,
               drop_order drop = drop_order::lowest_probability) {
  scenario sc;
  sc.dp = dp;
  sc.ep = ep;
  sc.options = layer_options(experts, k, capacity_factor, drop);
  sc.tokens.assign(static_cast<std::size_t>(dp), 9);
  return sc;
}

// Router row e = (w_e, 0, ..., 0): token t's logit for e is w_e x[t, 0]. Inputs with x[t, 0] of a
// chosen sign then prefer the experts with the largest (or smallest) w.
std::function<void(registry_type&)> router_rows(std::vector<double> first_column) {
  return [first_column](registry_type& registry) {
    auto& w = registry.find("moe.router.weight").value;
    const std::int64_t experts = w.shape()[0], d = w.shape()[1];
    for (std::int64_t e = 0; e < experts; ++e)
      for (std::int64_t c = 0; c < d; ++c)
        w.data()[e * d + c] = c == 0 ? first_column[e] : 0.2 * w.data()[e * d + c];
  };
}
void set_first_feature_sign(host_tensor& x, double sign) {
  for (std::int64_t t = 0; t < x.shape()[0]; ++t)
    x.data()[t * d_model] = sign * (1 + std::abs(x.data()[t * d_model]));
}

std::int64_t total(const std::vector<std::int64_t>& counts) {
  return std::reduce(counts.begin(), counts.end(), std::int64_t{0});
}

}  // namespace

TEST_CASE("expert parallel moe matches the serial layer per slice, dropless and with drops",
          "[parity][expert]") {
  for (const int ep : {2, 4}) {
    for (const std::int64_t k : {1, 2}) {
      for (const double factor : {0.0, 0.5}) {
        for (const std::int64_t experts : {std::int64_t{4}, std::int64_t{8}}) {
          INFO("ep = dp = " << ep << ", k = " << k << ", capacity factor " << factor << ", "
                            << experts << " experts");
          const auto stats = check_parity(basic(ep, ep, experts, k, factor));
          std::int64_t dropped = 0;
          for (const auto& [slice, s] : stats) dropped += s.dropped_assignments;
          CHECK((dropped > 0) == (factor > 0));
        }
      }
    }
  }
  SECTION("tokens dropped by position") {
    for (const std::int64_t k : {1, 2}) {
      INFO("k = " << k);
      const auto stats = check_parity(basic(2, 2, 4, k, 0.5, drop_order::position));
      CHECK(stats.at(0).dropped_assignments > 0);
    }
  }
}

TEST_CASE("expert parallel moe with dp = 4 over ep = 2 reduces expert gradients over edp",
          "[parity][expert]") {
  for (const std::int64_t k : {1, 2}) {
    for (const double factor : {0.0, 0.75}) {
      INFO("k = " << k << ", capacity factor " << factor);
      check_parity(basic(4, 2, 4, k, factor));
    }
  }
}

TEST_CASE("expert parallelism survives empty experts, silent ranks and one hot expert",
          "[parity][expert]") {
  SECTION("an expert no token chooses") {
    for (const std::int64_t k : {1, 2}) {
      INFO("k = " << k);
      scenario sc = basic(2, 2, 4, k, 0.0);
      sc.steer_router = router_rows({0.5, 0.3, 0.1, -6.0});  // x[:, 0] > 0: expert 3 last
      sc.steer_input = [](int, host_tensor& x) { set_first_feature_sign(x, 1.0); };
      const auto stats = check_parity(sc);
      for (const auto& [slice, s] : stats) CHECK(s.routed[3] == 0);
    }
  }
  SECTION("every token of one rank on one expert, the other rank avoiding it") {
    for (const std::int64_t k : {1, 2}) {
      for (const double factor : {0.0, 1.0}) {
        INFO("k = " << k << ", capacity factor " << factor);
        scenario sc = basic(2, 2, 4, k, factor);
        sc.steer_router = router_rows({4.0, 0.0, 0.0, 0.0});
        sc.steer_input = [](int slice, host_tensor& x) {
          set_first_feature_sign(x, slice == 0 ? 1.0 : -1.0);
        };
        const auto stats = check_parity(sc);
        CHECK(stats.at(0).routed[0] == 9);  // all of rank 0's tokens
        CHECK(stats.at(1).routed[0] == 0);  // none of rank 1's
        if (factor > 0) CHECK(stats.at(0).kept[0] == stats.at(0).capacity);
      }
    }
  }
  SECTION("every rank's tokens stay on its own experts: nothing crosses") {
    for (const std::int64_t k : {1, 2}) {
      INFO("k = " << k);
      scenario sc = basic(2, 2, 4, k, 0.0);
      sc.steer_router = router_rows({3.0, 2.9, -2.9, -3.0});
      sc.steer_input = [](int slice, host_tensor& x) {
        set_first_feature_sign(x, slice == 0 ? 1.0 : -1.0);
      };
      const auto stats = check_parity(sc);
      // Rank 0 (experts 0, 1) routes to 0 and 1 only; rank 1 (experts 2, 3) to 2 and 3 only.
      CHECK(stats.at(0).routed[2] + stats.at(0).routed[3] == 0);
      CHECK(stats.at(1).routed[0] + stats.at(1).routed[1] == 0);
    }
  }
  SECTION("a rank with no tokens at all (dropless), at ep = 2 and 4") {
    for (const int ep : {2, 4}) {
      INFO("ep = " << ep);
      scenario sc = basic(ep, ep, 4, 2, 0.0);
      sc.tokens[1] = 0;
      const auto stats = check_parity(sc);
      CHECK(total(stats.at(1).routed) == 0);
    }
  }
}

TEST_CASE("expert parallel moe of degree 1 is bit-identical to the serial layer",
          "[parity][expert]") {
  for (const std::int64_t k : {1, 2}) {
    INFO("k = " << k);
    scenario sc = basic(1, 1, 4, k, 0.5);
    sc.tokens = {12};
    check_parity(sc);  // y, dx and every gradient exact, one rank holding every expert
  }
}

namespace {

using parameter_values = std::map<std::string, std::vector<double>>;

// `steps` AdamW steps: serially over every slice in turn, and on the ranks (each its slice, then
// the gradients synchronised). New tokens every step. Returns (serial, per rank) final values and
// the initial ones.
template <int K>
void check_training(const scenario& sc, int steps) {
  const quintet::kernels::adamw_hyperparameters hp{.lr = 1e-2, .weight_decay = 0.1};
  std::vector<inputs> batches;
  for (int step = 0; step < steps; ++step)
    batches.push_back(make_inputs(sc, 100 * static_cast<std::uint64_t>(step + 1)));

  registry_type serial(seed);
  quintet::nn::moe<double, host> serial_layer(serial, exec, "moe", d_model, hidden, sc.options);
  prepare(serial, sc);
  parameter_values initial, expected;
  for (auto& p : serial) initial[p.name] = values_of_view(p.value);
  quintet::optim::adamw<double, host> serial_optimizer(serial, exec, hp);
  std::vector<std::vector<double>> serial_aux(static_cast<std::size_t>(steps));
  for (int step = 0; step < steps; ++step) {
    serial.zero_grad();
    for (int s = 0; s < sc.dp; ++s) {
      quintet::nn::context<host> ctx;
      serial_layer.forward(ctx, batches[step].x[s].view());
      serial_aux[step].push_back(serial_layer.aux_loss());
      serial_layer.backward(ctx, batches[step].dy[s].view());
    }
    serial_optimizer.step(hp.lr);
  }
  for (auto& p : serial) expected[p.name] = values_of_view(p.value);

  std::vector<parameter_values> got(static_cast<std::size_t>(sc.dp));
  std::vector<std::vector<double>> aux(static_cast<std::size_t>(sc.dp));
  quintet::thread_world{sc.dp}.run([&](quintet::thread_comm& world) {
    mesh_type mesh(world, {.dp = sc.dp, .ep = sc.ep});
    registry_type registry(seed, mesh, ep_plan<K>{});
    quintet::nn::moe<double, host, ep_plan<K>, mesh_type> layer(registry, exec, "moe", d_model,
                                                                hidden, sc.options, &mesh);
    prepare(registry, sc);
    quintet::optim::adamw<double, host> optimizer(registry, exec, hp);
    const int slice = mesh.coordinates().dp;
    for (int step = 0; step < steps; ++step) {
      registry.zero_grad();
      quintet::nn::context<host> ctx;
      layer.forward(ctx, batches[step].x[slice].view());
      aux[static_cast<std::size_t>(world.rank())].push_back(layer.aux_loss());
      layer.backward(ctx, batches[step].dy[slice].view());
      qp::synchronize_gradients(registry, mesh);
      optimizer.step(hp.lr);
    }
    for (auto& p : registry)
      got[static_cast<std::size_t>(world.rank())][p.name] = values_of_view(p.value);
  });

  std::map<std::string, int> holders;
  for (int r = 0; r < sc.dp; ++r) {
    INFO("rank " << r);
    // Each rank's auxiliary losses, step by step, are the serial layer's on its slice (up to the
    // parameters' rounding differences after the first step).
    for (int step = 0; step < steps; ++step)
      CHECK(aux[r][step] == Approx(serial_aux[step][r]).epsilon(1e-9));
    for (const auto& [name, values] : got[r]) {
      INFO(name);
      ++holders[name];
      require_close(values, expected.at(name), "after AdamW", 1e-9, 1e-11);
      // The steps moved it (a test that compared initial values would pass vacuously).
      CHECK(values != initial.at(name));
    }
  }
  // Every serial parameter is held: the router by all ranks, each expert by its dp / ep replicas.
  REQUIRE(holders.size() == expected.size());
  for (const auto& [name, count] : holders)
    CHECK(count == (is_expert(name) ? sc.dp / sc.ep : sc.dp));
}

}  // namespace

TEST_CASE("expert parallel moe trains like the serial layer over AdamW steps", "[parity][expert]") {
  SECTION("ep = dp = 2, top-2, tokens dropped") { check_training<2>(basic(2, 2, 4, 2, 0.75), 4); }
  SECTION("ep = dp = 4, top-1, dropless, 8 experts") {
    check_training<1>(basic(4, 4, 8, 1, 0.0), 4);
  }
  SECTION("dp = 4 over ep = 2, top-2, tokens dropped") {
    check_training<2>(basic(4, 2, 4, 2, 1.0), 4);
  }
}

TEST_CASE("expert parallelism refuses what does not fit, on every rank", "[parity][expert]") {
  SECTION("experts that do not divide over ep") {
    REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([](quintet::thread_comm& world) {
      mesh_type mesh(world, {.dp = 2, .ep = 2});
      registry_type registry(seed, mesh, ep_plan<1>{});
      quintet::nn::moe<double, host, ep_plan<1>, mesh_type> layer(
          registry, exec, "moe", d_model, hidden, layer_options(3, 1, 0.0), &mesh);
    }),
                        Catch::Contains("ep<top_k<1>>: 3 experts do not divide over ep = 2"));
  }
  SECTION("a layer whose k is not the plan's K") {
    REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([](quintet::thread_comm& world) {
      mesh_type mesh(world, {.dp = 2, .ep = 2});
      registry_type registry(seed, mesh, ep_plan<2>{});
      quintet::nn::moe<double, host, ep_plan<2>, mesh_type> layer(
          registry, exec, "moe", d_model, hidden, layer_options(4, 1, 0.0), &mesh);
    }),
                        Catch::Contains("the model routes each token to its top 1 experts, but "
                                        "the plan's style is top_k<2>"));
  }
  SECTION("no mesh") {
    const auto without_mesh = [] {
      registry_type registry(seed);
      quintet::nn::moe<double, host, ep_plan<1>, mesh_type> layer(
          registry, exec, "moe", d_model, hidden, layer_options(4, 1, 0.0), nullptr);
    };
    REQUIRE_THROWS_WITH(without_mesh(),
                        Catch::Contains("moe 'moe': a plan with ep<...> needs the device mesh"));
  }
  SECTION("ranks routing different numbers of tokens under a capacity") {
    scenario sc = basic(2, 2, 4, 2, 1.0);
    sc.tokens = {9, 5};  // capacities ceil(9 x 2 / 4) = 5 and ceil(5 x 2 / 4) = 3
    const inputs in = make_inputs(sc);
    REQUIRE_THROWS_WITH(run_parallel(sc, in),
                        Catch::Contains("every ep rank must route the same number of tokens"));
    sc.options.capacity_factor = 0;  // dropless: no capacity to agree on
    check_parity(sc);
  }
  SECTION("a GPT under an ep plan: it has no MoE blocks, so it would train without experts") {
    REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([](quintet::thread_comm& world) {
      mesh_type mesh(world, {.dp = 2, .ep = 2});
      quintet::nn::parameter_registry<float, host> registry(seed, mesh, ep_plan<2>{});
      quintet::nn::gpt<float, host, ep_plan<2>, mesh_type> model(
          registry, exec, {.vocab = 8, .max_seq = 8, .layers = 1, .d_model = 8, .heads = 2}, &mesh);
    }),
                        Catch::Contains("ep<top_k<2>>: the model has no mixture-of-experts layer"));
  }
}

TEST_CASE("an ep plan: its axes, its batch split, and which gradients it leaves partial",
          "[parity][expert][plan]") {
  using plan = ep_plan<2>;
  STATIC_REQUIRE(qp::uses_expert_parallel<plan>);
  STATIC_REQUIRE(qp::strategy_traits<qp::top_k<2>>::implemented);
  STATIC_REQUIRE(plan::axes == mesh_axis_set{mesh_axis::dp, mesh_axis::ep});
  STATIC_REQUIRE(plan::batch_split_axes == mesh_axis_set{mesh_axis::dp, mesh_axis::ep});
  STATIC_REQUIRE(plan::batch_replicated_axes.empty());
  const auto expert = qp::placement::replicated().owned_by(mesh_axis::ep, 1);
  CHECK(plan::partial_gradient_axes(qp::placement::replicated()) == mesh_axis_set{mesh_axis::dp});
  CHECK(plan::partial_gradient_axes(expert) == mesh_axis_set{mesh_axis::edp});
  // With sequence parallelism too the sp part is kept (test_moe_sequence_parallel.cpp trains it).
  using with_sp = quintet::plan<qp::dp<qp::zero<0>>, qp::ep<qp::top_k<2>>, qp::sp<qp::ulysses>>;
  CHECK(with_sp::partial_gradient_axes(expert) == mesh_axis_set{mesh_axis::sp, mesh_axis::edp});
  CHECK(with_sp::partial_gradient_axes(qp::placement::replicated()) ==
        mesh_axis_set{mesh_axis::sp, mesh_axis::dp});
  // Plans without ep are unchanged.
  using dp_only = quintet::plan<qp::dp<qp::zero<0>>>;
  CHECK(dp_only::partial_gradient_axes(qp::placement::replicated()) ==
        mesh_axis_set{mesh_axis::dp});
  CHECK(plan::name() == "plan<dp<zero<0>>, ep<top_k<2>>>");
  CHECK_NOTHROW(plan::check({.dp = 4, .ep = 2}, {.experts = 4, .top_k = 2}));
  CHECK_THROWS_WITH(plan::check({.dp = 4, .ep = 4}, {.experts = 6, .top_k = 2}),
                    Catch::Contains("6 experts do not divide over ep = 4"));
  CHECK_THROWS_WITH(plan::check({.dp = 2, .ep = 2}, {.d_model = 8, .heads = 2}),
                    Catch::Contains("the model has no mixture-of-experts layer"));
}

TEST_CASE("placement owned_by: whole on its owner, absent elsewhere", "[parity][expert][plan]") {
  const auto owned = qp::placement::replicated().owned_by(mesh_axis::ep, 2);
  CHECK(owned.is_owned(mesh_axis::ep));
  CHECK(owned.owner(mesh_axis::ep) == 2);
  CHECK(owned.owner(mesh_axis::tp) == qp::placement::no_owner);
  CHECK(owned.is_sharded(mesh_axis::ep));
  CHECK(owned.sharded_dim(mesh_axis::ep) == qp::placement::replicated_dim);
  CHECK(owned.sharded_axes() == mesh_axis_set{mesh_axis::ep});
  CHECK_FALSE(owned.is_replicated());
  CHECK(owned != qp::placement::replicated().owned_by(mesh_axis::ep, 1));
  qp::mesh_position position{};
  qp::position_on(position, mesh_axis::ep) = {.degree = 4, .coordinate = 2};
  CHECK(owned.held_at(position));
  const quintet::region whole = owned.local_region(shape{5, 3}, position);
  CHECK(whole.local_shape() == shape{5, 3});
  qp::position_on(position, mesh_axis::ep) = {.degree = 4, .coordinate = 1};
  CHECK_FALSE(owned.held_at(position));
  CHECK_THROWS_WITH(owned.local_region(shape{5, 3}, position),
                    Catch::Contains("held by ep rank 2 only, not by ep rank 1"));
  qp::position_on(position, mesh_axis::ep) = {.degree = 2, .coordinate = 0};
  CHECK_THROWS_WITH(owned.local_region(shape{5, 3}, position),
                    Catch::Contains("owner 2 on ep is outside the axis' 2 ranks"));
  CHECK_THROWS_WITH(owned.sharded(mesh_axis::ep, 0),
                    Catch::Contains("owned by ep rank 2 cannot also be sharded over ep"));
  CHECK_THROWS_WITH(
      qp::placement::replicated().sharded(mesh_axis::ep, 0).owned_by(mesh_axis::ep, 0),
      Catch::Contains("cannot also be owned by one ep rank"));
  // The registry refuses to sum an expert's gradient over ep.
  registry_type registry(1, position,
                         [](const qp::placement&) { return mesh_axis_set{mesh_axis::ep}; });
  CHECK_THROWS_WITH(registry.add("w", shape{2}, quintet::nn::initializer::constant(1.0),
                                 qp::placement::replicated().owned_by(mesh_axis::ep, 0)),
                    Catch::Contains("is sharded over ep and its gradient partial over ep"));
}

TEST_CASE("expert ownership and dispatch counts are plain data", "[parity][expert]") {
  const auto own = qp::expert_ownership::of(8, 4, 2);
  CHECK(own.local_experts() == 2);
  CHECK(own.first_expert() == 4);
  CHECK(own.owner_of(5) == 2);
  CHECK(own.holds(5));
  CHECK_FALSE(own.holds(6));
  CHECK_THROWS_WITH(qp::expert_ownership::of(6, 4, 0),
                    Catch::Contains("6 experts do not divide over ep = 4"));
  // ep = 2, 4 experts, rank 1: sends 3, 0 | 1, 2 rows; receives from rank 0: 4, 0, rank 1: 1, 2.
  const qp::dispatch_counts counts{qp::expert_ownership::of(4, 2, 1), {3, 0, 1, 2}, {4, 0, 1, 2}};
  CHECK(counts.rows_to(0) == 3);
  CHECK(counts.rows_to(1) == 3);
  CHECK(counts.rows_from(0) == 4);
  CHECK(counts.sent_rows() == 6);
  CHECK(counts.received_rows() == 7);
  CHECK(counts.send_elements(5) == std::vector<std::int64_t>{15, 15});
  CHECK(counts.receive_elements(5) == std::vector<std::int64_t>{20, 15});
  CHECK(qp::offsets_of(counts.received) == std::vector<std::int64_t>{0, 4, 4, 5, 7});
}
